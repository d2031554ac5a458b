"""Shapes of runs in the API, and validation of the list filters. No writes here."""

from __future__ import annotations

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from runs import attempts
from runs.api.fields import RejectUnknownMixin, UtcDateTimeField
from runs.keys import format_utc
from runs.models import JobRun, RunStatus
from runs.selectors import attempt_note, dispatch_note, target_of
from runs.target_secrets import redact_target


def run_path_kwargs(run: JobRun) -> dict:
    return {"job_id": str(run.job_id), "scheduled_at": format_utc(run.scheduled_at)}


def absolute(request, url: str) -> str:
    return request.build_absolute_uri(url) if request is not None else url


class RunFilterSerializer(serializers.Serializer):
    """Query parameters of GET /runs/ and /dead-letter/; errors are field-level 400s."""

    job = serializers.UUIDField(required=False)
    status = serializers.ChoiceField(choices=RunStatus.choices, required=False)
    # The one RFC 3339 reading (a zone required), as every other time the API takes.
    scheduled_after = UtcDateTimeField(required=False, help_text="Inclusive, RFC 3339.")
    scheduled_before = UtcDateTimeField(required=False, help_text="Exclusive, RFC 3339.")

    def validate(self, attrs: dict) -> dict:
        after, before = attrs.get("scheduled_after"), attrs.get("scheduled_before")
        if after and before and after >= before:
            raise serializers.ValidationError({"scheduled_before": ["must be later than scheduled_after"]})
        return attrs


class RunSerializer(serializers.ModelSerializer):
    job_id = serializers.UUIDField(read_only=True)
    scheduled_at = UtcDateTimeField(read_only=True)
    not_before = UtcDateTimeField(read_only=True)
    lease_until = UtcDateTimeField(read_only=True)
    started_at = UtcDateTimeField(read_only=True)
    finished_at = UtcDateTimeField(read_only=True)
    key = serializers.CharField(source="run_key", read_only=True)
    attempts_used = serializers.IntegerField(
        read_only=True,
        help_text="Attempts the run has used: `attempt` (the claim's number, the fence) less the "
        "claims that put it back unsent (an open circuit breaker, a spent retry budget). It is "
        "out of attempts at `max_attempts`.",
    )
    attempt_note = serializers.SerializerMethodField()
    rate_limited_to = UtcDateTimeField(read_only=True)
    dispatch_note = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()

    class Meta:
        model = JobRun
        fields = [
            "job_id",
            "job_name",
            "scheduled_at",
            "key",
            "status",
            "trigger",
            "attempt",
            "attempts_used",
            "max_attempts",
            "attempt_note",
            "priority",
            "not_before",
            "rate_limited_to",
            "dispatch_note",
            "lease_until",
            "started_at",
            "finished_at",
            "result_code",
            "last_error",
            "url",
        ]
        read_only_fields = fields

    @extend_schema_field(
        {
            "type": "string",
            "nullable": True,
            "description": 'Why attempt can exceed max_attempts, e.g. "replayed after 5 attempts".',
        }
    )
    def get_attempt_note(self, run: JobRun) -> str | None:
        return attempt_note(run)

    @extend_schema_field(
        {
            "type": "string",
            "nullable": True,
            "description": "What dispatch did to the start, e.g. 'deferred by tenant rate limit to "
            "2026-12-03T09:04:00Z' (the tenant's max_runs_per_minute).",
        }
    )
    def get_dispatch_note(self, run: JobRun) -> str | None:
        return dispatch_note(run)

    @extend_schema_field(OpenApiTypes.URI)
    def get_url(self, run: JobRun) -> str:
        return absolute(self.context.get("request"), reverse("runs-detail", kwargs=run_path_kwargs(run)))


class AttemptSerializer(serializers.Serializer):
    """Documents the shape of one attempts entry: runs/attempts.py AttemptRecord (every
    key is present; an entry stored before a key existed shows it as null). A run that
    succeeded on its first attempt shows the one entry its columns give
    (runs/attempts.history)."""

    attempt = serializers.IntegerField()
    owner = serializers.CharField(allow_null=True)
    started_at = serializers.CharField(allow_null=True, help_text="RFC 3339 UTC, with microseconds.")
    finished_at = serializers.CharField(allow_null=True, help_text="Null when unknown (a lease expired).")
    duration_ms = serializers.FloatField(allow_null=True)
    outcome = serializers.CharField(allow_null=True)
    result_code = serializers.IntegerField(allow_null=True)
    error = serializers.CharField(allow_blank=True, allow_null=True)
    retry_in_s = serializers.FloatField(allow_null=True, help_text="Seconds until the retry; null: none.")


class SnapshotMethods:
    """Method fields shared by the detail and dead-letter shapes."""

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_target(self, run: JobRun) -> dict:
        return redact_target(target_of(run))

    @extend_schema_field(AttemptSerializer(many=True))
    def get_attempts(self, run: JobRun) -> list:
        return attempts.history(run)

    @extend_schema_field(OpenApiTypes.URI)
    def get_replay_url(self, run: JobRun) -> str:
        return absolute(self.context.get("request"), reverse("runs-replay", kwargs=run_path_kwargs(run)))

    @extend_schema_field(OpenApiTypes.URI)
    def get_cancel_url(self, run: JobRun) -> str:
        return absolute(self.context.get("request"), reverse("runs-cancel", kwargs=run_path_kwargs(run)))


class RunDetailSerializer(SnapshotMethods, RunSerializer):
    target_version = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="The version of its job's target the run calls (on every attempt and replay); "
        "null for a run created before target versions, which carries its own copy.",
    )
    target = serializers.SerializerMethodField()
    attempts = serializers.SerializerMethodField()
    created_at = UtcDateTimeField(read_only=True)
    replay_url = serializers.SerializerMethodField()
    cancel_url = serializers.SerializerMethodField()

    class Meta(RunSerializer.Meta):
        fields = [
            *RunSerializer.Meta.fields,
            "owner",
            "overlap_policy",
            "lease_seconds",
            "created_at",
            "target_version",
            "target",
            "attempts",
            "replay_url",
            "cancel_url",
        ]
        read_only_fields = fields


class DeadRunSerializer(SnapshotMethods, RunSerializer):
    """A dead-letter entry: what was sent (redacted), every attempt, and how to replay it."""

    target = serializers.SerializerMethodField()
    attempts = serializers.SerializerMethodField()
    replay_url = serializers.SerializerMethodField()

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "target", "attempts", "replay_url"]
        read_only_fields = fields


class ConflictSerializer(serializers.Serializer):
    detail = serializers.CharField()
    status = serializers.CharField()


class ReplayRequestSerializer(RejectUnknownMixin, serializers.Serializer):
    dry_run = serializers.BooleanField(
        required=False, default=False, help_text="List what would be re-queued and write nothing."
    )


class ReplayPlanSerializer(serializers.Serializer):
    """Answer of a replay dry run: the runs that would be re-queued, unchanged."""

    dry_run = serializers.BooleanField()
    would_replay = RunSerializer(many=True)
