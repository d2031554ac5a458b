"""Job endpoints under /api/v1/. Reads are tenant-scoped querysets; writes go through jobs.services."""

from __future__ import annotations

from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from jobs import edit_preview, health, ledger, services
from jobs.describe import check_preview_schedule, describe_job, fire_time_json, job_fire_times, preview
from jobs.models import Job, Misfire
from jobs.rules.job import SCHEDULE_KEY
from jobs.schedule import ScheduleError, jitter
from runs.keys import format_utc, parse_utc
from runs.selectors import dispatch_note
from scheduler_project import db

from .serializers import (
    BackfillResultSerializer,
    BackfillSerializer,
    EditPreviewSerializer,
    HealthSerializer,
    JobDetailSerializer,
    JobSerializer,
    MisfireSerializer,
    OccurrenceQuerySerializer,
    OccurrenceSerializer,
    PreviewCountSerializer,
    PreviewQuerySerializer,
    PreviewSerializer,
    ResumeSerializer,
    TriggerResultSerializer,
)

UUID_RE = r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"
_BOOL_PARAM = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


class Pagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 500


def run_url(job_id, scheduled_at) -> str:
    return f"/api/v1/runs/{job_id}/{format_utc(scheduled_at)}/"


def _misfire_count() -> Coalesce:
    """A job's misfires counted in a correlated subquery, not a join + GROUP BY jobs.id:
    the database key of jobs is (partition_id, id), so id alone no longer implies the
    other columns, and on Citus the partition_id equality keeps the count in the job's shard."""
    mine = Misfire.objects.filter(partition_id=OuterRef("partition_id"), job=OuterRef("pk"))
    counted = mine.order_by().values("job").annotate(n=Count("*")).values("n")
    return Coalesce(Subquery(counted), 0)


@extend_schema_view(
    list=extend_schema(
        summary="List the tenant's jobs",
        parameters=[
            OpenApiParameter("paused", bool, description="Only paused (true) or active (false) jobs."),
            OpenApiParameter("name", str, description="Name contains (case-insensitive)."),
        ],
    ),
    create=extend_schema(summary="Create a job", responses={201: JobSerializer}),
    retrieve=extend_schema(
        summary="A job, with its health",
        description="The job and a `health` object: its failure streak, last success and failure, "
        "overdue_seconds, misfires, and over the last 24 h and 7 days its slots' on-time rate and "
        "start lateness p50/p99 (README, Job health).",
        responses=JobDetailSerializer,
    ),
    partial_update=extend_schema(
        summary="Change a job (or, with dry_run=true, say what the change would do)",
        description="Naming one of cron / interval_seconds / run_at replaces the trigger (the other two "
        "are cleared). A schedule change restarts from the next future slot; past slots never fire. "
        "With `?dry_run=true` nothing is written (no change, no audit entry, no ledger range): the "
        "answer is the job as the change would leave it, the audit diff, its fire times over the next "
        "7 days before and after (added and removed), whether a run is due now because of it, what "
        "the misfire rules do with slots already past, and the ledger ranges it would record. The "
        "validation and errors are the PATCH's.",
        parameters=[
            OpenApiParameter(
                "dry_run", bool, description="true: answer what the change would do; write nothing."
            )
        ],
        responses=PolymorphicProxySerializer(
            component_name="JobOrEditPreview",
            serializers=[JobSerializer, EditPreviewSerializer],
            resource_type_field_name=None,
        ),
    ),
    destroy=extend_schema(summary="Delete a job and its runs"),
)
class JobViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    serializer_class = JobSerializer
    pagination_class = Pagination
    lookup_value_regex = UUID_RE
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        qs = Job.objects.filter(tenant=self.request.auth).annotate(
            misfire_count=_misfire_count(), last_success=health.last_success_at()
        )
        if self.action != "list":
            return qs
        params = self.request.query_params
        if "paused" in params:
            value = _BOOL_PARAM.get(params["paused"].strip().lower())
            if value is None:
                raise serializers.ValidationError({"paused": ["Use true or false."]})
            qs = qs.filter(paused=value)
        if params.get("name"):
            qs = qs.filter(name__icontains=params["name"])
        return qs.order_by("-created_at", "id")

    def get_serializer_class(self):
        # Only a single job's read carries the health figures: each costs an aggregate
        # over the job's runs of the last week, too much for every row of a list.
        return JobDetailSerializer if self.action == "retrieve" else JobSerializer

    def get_serializer_context(self):
        # One instant for the answer: overdue_seconds and health.overdue_seconds agree.
        return {**super().get_serializer_context(), "now": timezone.now()}

    def _job(self) -> Job:
        # Lock-free read; services re-read under select_for_update where it matters.
        return self.get_object()

    def _respond(self, job: Job, code: int = status.HTTP_200_OK) -> Response:
        job = self.get_queryset().get(pk=job.pk)
        return Response(JobSerializer(job).data, status=code)

    def create(self, request: Request, *args, **kwargs) -> Response:
        serializer = JobSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        job = services.create_job(
            tenant=request.auth, fields=serializer.validated_data, actor=request.user.actor
        )
        return self._respond(job, status.HTTP_201_CREATED)

    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        dry_run = _BOOL_PARAM.get(request.query_params.get("dry_run", "false").strip().lower())
        if dry_run is None:
            raise serializers.ValidationError({"dry_run": ["Use true or false."]})
        job = self._job()
        serializer = JobSerializer(job, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        if dry_run:
            # The PATCH's own validation and effects (jobs/edit_preview.py), and no write.
            preview = edit_preview.preview_edit(job=job, changes=serializer.validated_data, now=db.now())
            body = {"dry_run": True, "job": JobSerializer(preview.effects.job).data}
            return Response({**body, **edit_preview.preview_json(preview)})
        job = services.update_job(job=job, changes=serializer.validated_data, actor=request.user.actor)
        return self._respond(job)

    def destroy(self, request: Request, *args, **kwargs) -> Response:
        services.delete_job(job=self._job(), actor=request.user.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(summary="Pause a job", request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk=None) -> Response:
        return self._respond(services.pause_job(job=self._job(), actor=request.user.actor))

    @extend_schema(
        summary="Resume a job",
        description='Without catch_up (or "none") the next run is the next future slot; "latest" queues '
        'one run for the latest slot missed while paused, "all" one per missed slot (max_catch_up).',
        request=ResumeSerializer,
        responses=JobSerializer,
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk=None) -> Response:
        job = self._job()
        body = ResumeSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        catch_up = body.validated_data["catch_up"]
        return self._respond(services.resume_job(job=job, catch_up=catch_up, actor=request.user.actor))

    @extend_schema(summary="Queue a manual run now", request=None, responses={201: TriggerResultSerializer})
    @action(detail=True, methods=["post"])
    def trigger(self, request: Request, pk=None) -> Response:
        job = self._job()
        scheduled_at = services.trigger_job(job=job, actor=request.user.actor)
        data = {
            "job_id": str(job.id),
            "scheduled_at": format_utc(scheduled_at),
            "run": run_url(job.id, scheduled_at),
        }
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Fill the gaps of [start, end]: one run per slot that has none",
        description=(
            f"Slots that already have a run are left alone, so a second call creates nothing. "
            f"At most {services.MAX_BACKFILL_RUNS} runs per request. With dry_run the answer lists the "
            "slots that would be created and nothing is written."
        ),
        request=BackfillSerializer,
        responses=BackfillResultSerializer,
    )
    @action(detail=True, methods=["post"])
    def backfill(self, request: Request, pk=None) -> Response:
        job = self._job()
        body = BackfillSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        window = {"start": body.validated_data["start"], "end": body.validated_data["end"]}
        if body.validated_data["dry_run"]:
            plan = services.plan_backfill(job=job, **window)
            slots, created = plan.missing, 0
        else:
            plan, slots = services.backfill_job(job=job, actor=request.user.actor, **window)
            created = len(slots)
        data = {
            "job_id": str(job.id),
            "dry_run": body.validated_data["dry_run"],
            "created": created,
            "scheduled_at": [format_utc(t) for t in slots],
            # Slots that got a run between the plan and the insert count as present.
            "already_present": plan.already_present + len(plan.missing) - len(slots),
            "capped": plan.capped,
        }
        return Response(data)

    @extend_schema(
        summary="Next fire times of a job",
        parameters=[OpenApiParameter("count", int, description="1..100, default 10")],
        responses=PreviewSerializer,
    )
    @action(detail=True, methods=["get"])
    def preview(self, request: Request, pk=None) -> Response:
        job = self._job()
        query = PreviewCountSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        times = job_fire_times(job, now=timezone.now(), count=query.validated_data["count"])
        return Response(
            {
                "fire_times": [fire_time_json(t, jitter_seconds=job.jitter_seconds) for t in times],
                "description": describe_job(job),
                "timezone": job.time_zone,
            }
        )

    @extend_schema(
        summary="Misfires recorded for a job",
        parameters=[OpenApiParameter("limit", int), OpenApiParameter("offset", int)],
        responses=inline_serializer(
            "PaginatedMisfireList",
            {
                "count": serializers.IntegerField(),
                "next": serializers.URLField(allow_null=True),
                "previous": serializers.URLField(allow_null=True),
                "results": MisfireSerializer(many=True),
            },
        ),
    )
    @action(detail=True, methods=["get"])
    def misfires(self, request: Request, pk=None) -> Response:
        job = self._job()
        paginator = Pagination()
        page = paginator.paginate_queryset(job.misfires.order_by("-detected_at", "-id"), request, view=self)
        return paginator.get_paginated_response(MisfireSerializer(page, many=True).data)

    @extend_schema(
        summary="Every due slot of the job in [from, to), each with one outcome",
        description=(
            "Oldest first, cursor-paginated. outcome: fired (a run exists), skipped (with a reason), "
            "missed (past and nothing will fire it), pending (due, not dispatched yet; reason overdue "
            "once late by SCHEDULER_OVERDUE_ALERT_SECONDS). Answers 'why didn't job X run at T?'."
        ),
        parameters=[
            OpenApiParameter(
                "from",
                OpenApiTypes.DATETIME,
                description="Inclusive; default 24 h before `to`. Both are clamped to "
                "1970-01-01T00:00:00Z..9999-12-31T00:00:00Z.",
            ),
            OpenApiParameter("to", OpenApiTypes.DATETIME, description="Exclusive; default now."),
            OpenApiParameter("cursor", str, description="From the `next` link."),
            OpenApiParameter("page_size", int, description="Default 100, at most 1000."),
        ],
        responses=inline_serializer(
            "OccurrencePage",
            {
                "next": serializers.URLField(allow_null=True),
                "results": OccurrenceSerializer(many=True),
            },
        ),
    )
    @action(detail=True, methods=["get"])
    def occurrences(self, request: Request, pk=None) -> Response:
        job = self._job()
        query = OccurrenceQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        now = db.now()
        start, end = ledger.window(start=params.get("from"), end=params.get("to"), now=now)
        after = None
        if "cursor" in params:
            try:
                after = parse_utc(params["cursor"])
            except (ValueError, OverflowError):
                raise serializers.ValidationError({"cursor": ["invalid cursor; use the next link"]}) from None
        limit = params["page_size"]
        items, more = ledger.occurrences(job=job, start=start, end=end, now=now, after=after, limit=limit)
        url = request.build_absolute_uri()
        next_url = None
        if more:
            next_url = replace_query_param(url, "cursor", format_utc(items[-1].scheduled_at))
        return Response({"next": next_url, "results": [occurrence_json(o) for o in items]})


def occurrence_json(item: ledger.Occurrence) -> dict:
    run = item.run
    return {
        "scheduled_at": format_utc(item.scheduled_at),
        "outcome": item.outcome,
        "reason": item.reason,
        "run": None
        if run is None
        else {
            "status": run.status,
            "attempt": run.attempt,
            "trigger": run.trigger,
            "url": run_url(run.job_id, run.scheduled_at),
            "dispatch_note": dispatch_note(run),
        },
    }


class SchedulePreviewView(APIView):
    @extend_schema(
        summary="Fire times of a schedule that is not saved",
        description="Give `cron` (with `timezone`) or `interval_seconds` (anchored at `after`). "
        "`dst_repeated` / `dst_missing` preview a job's dst_policy; entries the policy affects carry a note.",
        parameters=[PreviewQuerySerializer],
        responses=PreviewSerializer,
    )
    def get(self, request: Request) -> Response:
        query = PreviewQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        policy = {"repeated": params.get("dst_repeated"), "missing": params.get("dst_missing")}
        # JobInvalid: field-level 400 with the API's names (jobs/api/errors.py).
        cron, interval = check_preview_schedule(
            cron=params.get("cron") or None,
            interval_seconds=params.get("interval_seconds"),
            timezone=params["timezone"],
            dst_policy=policy,
        )
        zone = params["timezone"]
        after = params.get("after") or timezone.now()
        jitter_seconds = params.get("jitter_seconds", 0)
        gap = jitter.shortest_gap(
            cron=cron, timezone=zone, interval_seconds=interval, job_id=None, now=after, dst_policy=policy
        )
        if gap is not None and jitter_seconds > gap:
            message = f"At most the schedule's shortest gap between fire times, {gap} seconds."
            raise serializers.ValidationError({"jitter_seconds": [message]})
        try:
            data = preview(
                cron=cron,
                timezone=zone,
                interval_seconds=interval,
                after=after,
                count=params["count"],
                jitter_seconds=jitter_seconds,
                dst_policy=policy,
            )
        except ScheduleError as exc:
            raise serializers.ValidationError({SCHEDULE_KEY: [str(exc)]}) from None
        return Response({**data, "timezone": zone})


class HealthView(APIView):
    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]

    @extend_schema(
        summary="Liveness and database check (no auth)",
        responses={
            200: HealthSerializer,
            503: OpenApiResponse(HealthSerializer, description="database down"),
        },
    )
    def get(self, request: Request) -> Response:
        try:
            db.ping()
            database, code = "ok", status.HTTP_200_OK
        except Exception as exc:
            database, code = f"error: {type(exc).__name__}", status.HTTP_503_SERVICE_UNAVAILABLE
        body = {
            "status": "ok" if code == status.HTTP_200_OK else "degraded",
            "database": database,
            "time": format_utc(timezone.now()),
        }
        return Response(body, status=code)
