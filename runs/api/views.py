"""Runs API: list, detail, replay, cancel, dead-letter. Tenant-scoped: request.auth is
the Tenant, and another tenant's run is a 404 like a missing one."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import selectors, services
from runs.api.serializers import (
    ConflictSerializer,
    DeadRunSerializer,
    ReplayPlanSerializer,
    ReplayRequestSerializer,
    RunDetailSerializer,
    RunFilterSerializer,
    RunSerializer,
)
from runs.keys import parse_utc
from runs.models import RunStatus

KEY_PARAMETERS = [
    OpenApiParameter("job_id", OpenApiTypes.UUID, OpenApiParameter.PATH),
    OpenApiParameter(
        "scheduled_at",
        OpenApiTypes.DATETIME,
        OpenApiParameter.PATH,
        description="RFC 3339 UTC, e.g. 2026-03-08T07:00:00Z (colons may be %3A-encoded).",
    ),
]
FILTER_PARAMETERS = [
    OpenApiParameter("job", OpenApiTypes.UUID, description="Only this job's runs."),
    OpenApiParameter("status", OpenApiTypes.STR, enum=RunStatus.values),
    OpenApiParameter("scheduled_after", OpenApiTypes.DATETIME, description="Inclusive."),
    OpenApiParameter("scheduled_before", OpenApiTypes.DATETIME, description="Exclusive."),
    OpenApiParameter("page_size", OpenApiTypes.INT, description="Default 50, at most 500."),
]


class RunCursorPagination(CursorPagination):
    # Newest first; id breaks ties between runs of different jobs at the same instant.
    ordering = ("-scheduled_at", "-id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def decode_cursor(self, request):
        # DRF answers a mangled cursor with 404; it is bad input like any other parameter.
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError(
                {self.cursor_query_param: ["invalid cursor; use the next/previous links"]}
            ) from None


def actor_of(request: Request) -> str:
    # "tenant:<slug> token:<prefix>", the same "who" the audit log shows.
    return request.user.actor


def parse_key(job_id: str, scheduled_at: str) -> tuple[UUID, datetime]:
    """The run key from the path: a non-UUID job is simply not found; a malformed
    timestamp is a 400 saying what shape is expected."""
    try:
        job_uuid = UUID(job_id)
    except ValueError:
        raise Http404 from None
    try:
        moment = parse_utc(scheduled_at)
    except (ValueError, OverflowError):
        raise ValidationError(
            {"scheduled_at": ["not an RFC 3339 timestamp with a zone, e.g. 2026-03-08T07:00:00Z"]}
        ) from None
    return job_uuid, moment


class FilteredRunsMixin:
    def filters(self) -> dict:
        params = RunFilterSerializer(data=self.request.query_params)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        return {
            "job_id": data.get("job"),
            "status": data.get("status"),
            "scheduled_after": data.get("scheduled_after"),
            "scheduled_before": data.get("scheduled_before"),
        }


@extend_schema(parameters=FILTER_PARAMETERS, tags=["runs"])
class RunListView(FilteredRunsMixin, generics.ListAPIView):
    serializer_class = RunSerializer
    pagination_class = RunCursorPagination

    def get_queryset(self):
        return selectors.runs_for_tenant(tenant_id=self.request.auth.id, **self.filters())


@extend_schema(
    parameters=[p for p in FILTER_PARAMETERS if p.name != "status"],
    tags=["runs"],
    summary="Dead-letter queue: runs that exhausted their attempts or failed permanently",
)
class DeadLetterListView(FilteredRunsMixin, generics.ListAPIView):
    serializer_class = DeadRunSerializer
    pagination_class = RunCursorPagination

    def get_queryset(self):
        filters = self.filters()
        return selectors.runs_for_tenant(
            tenant_id=self.request.auth.id, **{**filters, "status": RunStatus.DEAD}
        )

    def paginate_queryset(self, queryset):
        # Each entry shows its target: the page's versions in one read, not one per run.
        page = super().paginate_queryset(queryset)
        selectors.attach_targets(page or [])
        return page


class RunDetailView(APIView):
    @extend_schema(parameters=KEY_PARAMETERS, responses=RunDetailSerializer, tags=["runs"])
    def get(self, request: Request, job_id: str, scheduled_at: str) -> Response:
        job_uuid, moment = parse_key(job_id, scheduled_at)
        run = selectors.get_run(job_id=job_uuid, scheduled_at=moment, tenant_id=request.auth.id)
        if run is None:
            raise Http404
        return Response(RunDetailSerializer(run, context={"request": request}).data)


class RunOperationView(APIView):
    operation: str

    def post(self, request: Request, job_id: str, scheduled_at: str) -> Response:
        job_uuid, moment = parse_key(job_id, scheduled_at)
        service = services.replay_run if self.operation == "replay" else services.cancel_run
        if self.operation == "replay":
            body = ReplayRequestSerializer(data=request.data or {})
            body.is_valid(raise_exception=True)
            if body.validated_data["dry_run"]:
                return self.dry_run(request, job_uuid, moment)
        try:
            run = service(
                job_id=job_uuid, scheduled_at=moment, tenant_id=request.auth.id, actor=actor_of(request)
            )
        except services.RunNotFound:
            raise Http404 from None
        except services.RunConflict as exc:
            return Response({"detail": str(exc), "status": exc.status}, status=status.HTTP_409_CONFLICT)
        return Response(RunDetailSerializer(run, context={"request": request}).data)

    def dry_run(self, request: Request, job_id: UUID, moment: datetime) -> Response:
        try:
            run = services.plan_replay(job_id=job_id, scheduled_at=moment, tenant_id=request.auth.id)
        except services.RunNotFound:
            raise Http404 from None
        except services.RunConflict as exc:
            return Response({"detail": str(exc), "status": exc.status}, status=status.HTTP_409_CONFLICT)
        runs = RunSerializer([run], many=True, context={"request": request}).data
        return Response({"dry_run": True, "would_replay": runs})


OPERATION_RESPONSES = {
    200: RunDetailSerializer,
    404: OpenApiResponse(description="No such run for this tenant."),
    409: ConflictSerializer,
}


@extend_schema(
    parameters=KEY_PARAMETERS,
    request=ReplayRequestSerializer,
    responses={
        **OPERATION_RESPONSES,
        200: PolymorphicProxySerializer(
            component_name="ReplayResult",
            serializers=[RunDetailSerializer, ReplayPlanSerializer],
            resource_type_field_name=None,
        ),
    },
    tags=["runs"],
    summary="Re-queue a dead or cancelled run under the same key (attempt keeps counting)",
    description='With `{"dry_run": true}` the answer is `{"dry_run": true, "would_replay": [run]}` '
    "and nothing is written (404/409 as for a real replay). Every real replay is in the audit log.",
)
class RunReplayView(RunOperationView):
    operation = "replay"


@extend_schema(
    parameters=KEY_PARAMETERS,
    request=None,
    responses=OPERATION_RESPONSES,
    tags=["runs"],
    summary="Cancel a queued, retrying or running run",
)
class RunCancelView(RunOperationView):
    operation = "cancel"
