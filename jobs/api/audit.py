"""GET /api/v1/audit/: the tenant's audit log, newest first, cursor-paginated like /runs/."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers

from jobs.audit import shown_changes
from jobs.models import AuditAction, AuditEntry
from runs.api.fields import UtcDateTimeField
from runs.api.views import RunCursorPagination

# What the console calls each action value: the entry's field and the list's filter say it alike.
ACTION_LABELS = "Shown in the console as: " + ", ".join(f"`{a.value}` {a.label!r}" for a in AuditAction) + "."


class AuditCursorPagination(RunCursorPagination):
    # The id is the commit order within one writer and ties nothing: one key suffices.
    ordering = ("-id",)


class AuditFilterSerializer(serializers.Serializer):
    job = serializers.UUIDField(required=False)
    action = serializers.ChoiceField(choices=AuditAction.choices, required=False)
    since = UtcDateTimeField(required=False, help_text="Inclusive, RFC 3339.")


class AuditEntrySerializer(serializers.ModelSerializer):
    at = UtcDateTimeField(read_only=True)
    changes = serializers.JSONField(
        read_only=True,
        help_text="Edits: {field: [old, new]} by the job API's field names (cron, timezone, ...); "
        'other actions: what they did (e.g. catch_up). Secret header values appear as "***".',
    )

    class Meta:
        model = AuditEntry
        fields = ["id", "at", "actor", "action", "job_id", "job_name", "changes"]
        read_only_fields = fields
        extra_kwargs = {"action": {"help_text": ACTION_LABELS}}

    def to_representation(self, entry: AuditEntry) -> dict:
        data = super().to_representation(entry)
        data["changes"] = shown_changes(data["changes"])
        return data


@extend_schema(
    summary="Audit log: who changed what, newest first",
    description='`actor` is "tenant:<slug> token:<prefix>" for API calls, "admin:<username>" for the '
    "admin console. Every create, edit (field diff), pause, resume (catch-up choice), trigger, "
    "backfill (not a dry run), replay, cancel and delete is recorded; so are a tenant's issued and "
    "revoked API tokens (by prefix) and signing-secret rotations, with a null job_id.",
    parameters=[
        OpenApiParameter("job", OpenApiTypes.UUID, description="Only this job's entries."),
        OpenApiParameter(
            "action",
            OpenApiTypes.STR,
            enum=AuditAction.values,
            description=ACTION_LABELS,
        ),
        OpenApiParameter("since", OpenApiTypes.DATETIME, description="Inclusive."),
        OpenApiParameter("page_size", OpenApiTypes.INT, description="Default 50, at most 500."),
    ],
    tags=["audit"],
)
class AuditListView(generics.ListAPIView):
    serializer_class = AuditEntrySerializer
    pagination_class = AuditCursorPagination

    def get_queryset(self):
        params = AuditFilterSerializer(data=self.request.query_params)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        qs = AuditEntry.objects.filter(tenant=self.request.auth)
        if data.get("job"):
            qs = qs.filter(job_id=data["job"])
        if data.get("action"):
            qs = qs.filter(action=data["action"])
        if data.get("since"):
            qs = qs.filter(at__gte=data["since"])
        return qs
