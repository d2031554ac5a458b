"""Runs in the admin: a read-only runs list with replay/cancel, the dead-letter queue,
and the operations dashboard (DESIGN section 7).

Run pages are read-only on purpose: a form save would rewrite every column of a row
that executors update concurrently. State changes go through runs.services (the
same conditional UPDATEs as the API), and each one is recorded as an admin LogEntry.
"""

from __future__ import annotations

import json
from datetime import timedelta
from uuid import UUID

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import OuterRef, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join

from jobs import health
from jobs.admin_base import ReadOnlyAdmin, actor_of
from jobs.display import moment_html
from jobs.models import Job
from runs import attempts, charts, selectors, services, timeseries
from runs.keys import parse_utc
from runs.models import ACTIVE_STATUSES, DeadRun, ExecutorNode, JobRun, RunStatus
from scheduler_project import liveness

STATUS_COLORS = {
    RunStatus.QUEUED: "#5b7083",
    RunStatus.RUNNING: "#1f6feb",
    RunStatus.RETRYING: "#d29922",
    RunStatus.SUCCEEDED: "#2da44e",
    RunStatus.DEAD: "#cf222e",
    RunStatus.SKIPPED: "#57606a",  # white text on it stays readable at 11px
    RunStatus.CANCELLED: "#6e7781",
}
COUNT_CAP = 10_000
DASHBOARD_REFRESH_SECONDS = 15
LATENESS_STEP_SECONDS = 300


def status_pill(status: str) -> str:
    """A run status as a coloured badge (runs list, jobs list)."""
    return format_html(
        '<span class="cronyard-status" style="background:{};color:#fff;padding:1px 7px;'
        'border-radius:8px;font-size:11px">{}</span>',
        STATUS_COLORS.get(status, "#444"),
        status,
    )


class JobFilter(admin.SimpleListFilter):
    """Runs of one job (`?job=<id>`); the sidebar offers the first jobs by name, and any
    job id works in the URL, e.g. from a job's page."""

    title = "job"
    parameter_name = "job"
    SIDEBAR_JOBS = 50

    def lookups(self, request, model_admin):
        jobs = list(Job.objects.order_by("name").values_list("id", "name")[: self.SIDEBAR_JOBS])
        chosen = self.value()
        if chosen and all(str(pk) != chosen for pk, _ in jobs):
            jobs += list(Job.objects.filter(pk=_uuid_or_none(chosen)).values_list("id", "name"))
        return [(str(pk), name) for pk, name in jobs]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        job_id = _uuid_or_none(self.value())
        if job_id is None:
            raise IncorrectLookupParameters(f"not a job id: {self.value()!r}")
        return queryset.filter(job_id=job_id)


def _uuid_or_none(text: str) -> UUID | None:
    try:
        return UUID(text)
    except ValueError:
        return None


class CappedCountPaginator(Paginator):
    """count(*) over a big partitioned table is slow; count at most COUNT_CAP + 1 rows
    (`SELECT count(*) FROM (... LIMIT n)`), so the last pages of a huge unfiltered list
    are reachable only by narrowing the filters."""

    @cached_property
    def count(self) -> int:
        # Without the ordering the capped count stops after COUNT_CAP rows instead of sorting all.
        return self.object_list.order_by()[: COUNT_CAP + 1].count()


class JobRunAdmin(admin.ModelAdmin):
    list_display = (
        "job_name",
        "scheduled",
        "status_badge",
        "trigger",
        "attempt_text",
        "ran",
        "tenant",
    )
    list_filter = ("status", "trigger", "tenant", JobFilter)
    list_select_related = ("tenant",)
    # No date_hierarchy: its year/month queries scan every partition.
    search_fields = ("job_name",)
    search_help_text = "Job name (contains), job id, or a run key <job_id>/<scheduled_at>."
    show_full_result_count = False
    paginator = CappedCountPaginator
    list_per_page = 50
    # Newest created first: the primary key index of every partition serves it (a merge
    # append, milliseconds), where scheduled_at, led by no index, means sorting the whole
    # table. Sorting by the scheduled-at column stays one click away.
    ordering = ("-id",)
    actions = ("replay_selected", "replay_selected_dry_run", "cancel_selected")
    change_form_template = "admin/runs/run_change_form.html"
    change_list_template = "admin/runs/run_change_list.html"

    fieldsets = (
        (
            "Run",
            {"fields": ("run_key", "job_link", "tenant", "job_name", "scheduled", "status_badge", "trigger")},
        ),
        (
            "Execution",
            {
                "fields": (
                    "attempt_text",
                    "max_attempts",
                    "priority",
                    "not_before",
                    "lease_until",
                    "owner",
                    "started_at",
                    "finished_at",
                    "result_code",
                    "last_error",
                )
            },
        ),
        ("Attempts", {"fields": ("attempts_table",)}),
        (
            "Snapshot",
            {
                "fields": (
                    "target_snapshot",
                    "overlap_policy",
                    "retry_backoff_seconds",
                    "retry_backoff_cap_seconds",
                    "lease_seconds",
                    "created_at",
                )
            },
        ),
    )
    # Every field shown is read-only: a run is changed only by replay/cancel.
    readonly_fields = tuple(name for _, options in fieldsets for name in options["fields"])

    # --- permissions: view and act, never edit through a form --------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        # Retention drops whole day partitions; single-row deletes would only leave gaps.
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        # Without an object this gates the replay/cancel actions; with one it makes the
        # change page view-only (a POST to it is refused).
        return obj is None and super().has_change_permission(request)

    def can_operate(self, request: HttpRequest) -> bool:
        return super().has_change_permission(request)

    # --- columns ----------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest):
        # The job's zone, for the wall time shown on hover (runs keep no FK to jobs: one
        # key lookup per listed row, (partition_id, id): inside the run's shard on Citus).
        zone = Job.objects.filter(partition_id=OuterRef("partition_id"), id=OuterRef("job_id")).values(
            "time_zone"
        )[:1]
        return super().get_queryset(request).annotate(job_zone=Subquery(zone))

    @admin.display(description="scheduled at (UTC)", ordering="scheduled_at")
    def scheduled(self, run: JobRun) -> str:
        return moment_html(run.scheduled_at, now=timezone.now(), zone=getattr(run, "job_zone", None))

    @admin.display(description="started (UTC)", ordering="started_at")
    def ran(self, run: JobRun) -> str:
        # One column for start and length: the list must fit 1280 px beside the filters;
        # finished_at and the result code are on the run's page.
        started = moment_html(run.started_at, now=timezone.now(), zone=getattr(run, "job_zone", None))
        if run.started_at is None or run.finished_at is None:
            return started
        took = (run.finished_at - run.started_at).total_seconds()
        return format_html(
            '{} <span class="cronyard-relative" style="font-size:11px">· took {} s</span>',
            started,
            f"{took:.1f}",
        )

    @admin.display(description="finished (UTC)", ordering="finished_at")
    def finished(self, run: JobRun) -> str:
        return moment_html(run.finished_at, now=timezone.now(), zone=getattr(run, "job_zone", None))

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: JobRun) -> str:
        return status_pill(run.status)

    @admin.display(description="attempt", ordering="attempt")
    def attempt_text(self, run: JobRun) -> str:
        # "6 / 5" alone reads like a bug; past max_attempts only a replay can take a run.
        note = selectors.attempt_note(run)
        base = f"{run.attempt} / {run.max_attempts}"
        return f"{base} ({note})" if note else base

    @admin.display(description="run key (Idempotency-Key)")
    def run_key(self, run: JobRun) -> str:
        return run.run_key

    @admin.display(description="job")
    def job_link(self, run: JobRun) -> str:
        try:
            url = reverse("admin:jobs_job_change", args=[run.job_id])
        except NoReverseMatch:
            return run.job_name or str(run.job_id)
        return format_html('<a href="{}" title="{}">{}</a>', url, run.job_id, run.job_name or run.job_id)

    @admin.display(description="attempts")
    def attempts_table(self, run: JobRun) -> str:
        entries = [e for e in map(attempts.from_stored, run.attempts or []) if e is not None]
        if not entries:
            return "no attempt recorded yet"
        columns = attempts.FIELDS
        head = format_html_join("", "<th>{}</th>", ((c,) for c in columns))
        rows = format_html_join(
            "",
            "<tr>{}</tr>",
            ((format_html_join("", "<td>{}</td>", ((_cell(e.get(c)),) for c in columns)),) for e in entries),
        )
        return format_html(
            '<table class="attempts"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', head, rows
        )

    @admin.display(description="target (secrets redacted)")
    def target_snapshot(self, run: JobRun) -> str:
        return format_html(
            '<pre style="white-space:pre-wrap">{}</pre>',
            json.dumps(selectors.redact_target(run.target), indent=2),
        )

    # --- search: job id or run key, else name ------------------------------------------

    def get_search_results(self, request: HttpRequest, queryset, search_term: str):
        term = search_term.strip()
        if not term:
            return queryset, False
        job_part, _, time_part = term.partition("/")
        try:
            job_id = UUID(job_part)
        except ValueError:
            return queryset.filter(job_name__icontains=term), False
        queryset = queryset.filter(job_id=job_id)
        if time_part:
            try:
                queryset = queryset.filter(scheduled_at=parse_utc(time_part))
            except (ValueError, OverflowError):
                return queryset.none(), False
        return queryset, False

    # --- actions ----------------------------------------------------------------------

    def _log(self, request: HttpRequest, ids: list[int], message: str) -> None:
        # Logged against JobRun even from the dead-letter page, so a run's history page
        # shows every change whichever list it was made from.
        for run in JobRun.objects.filter(id__in=ids):
            self.log_change(request, run, message)

    def _bulk(self, request: HttpRequest, queryset, service, *, log: str, summary: str) -> None:
        """One bulk service call (replay, cancel) on the selected runs, logged and reported."""
        result = service(ids=list(queryset.values_list("id", flat=True)), actor=actor_of(request))
        self._log(request, result.done, log)
        self.message_user(
            request,
            summary.format(done=len(result.done), ignored=result.ignored),
            messages.SUCCESS if result.done else messages.WARNING,
        )

    @admin.action(description="Replay selected dead/cancelled runs", permissions=["change"])
    def replay_selected(self, request: HttpRequest, queryset) -> None:
        self._bulk(
            request,
            queryset,
            services.replay_runs,
            log="Replayed: re-queued under the same run key.",
            summary="Replayed {done} run(s); ignored {ignored} that were not dead or cancelled.",
        )

    @admin.action(description="Replay selected: dry run (list only, change nothing)", permissions=["change"])
    def replay_selected_dry_run(self, request: HttpRequest, queryset) -> None:
        plan = services.plan_replay_runs(ids=list(queryset.values_list("id", flat=True)))
        keys = [run.run_key for run in JobRun.objects.filter(id__in=plan.done).order_by("id")]
        listed = ", ".join(keys[:20]) + (f" and {len(keys) - 20} more" if len(keys) > 20 else "")
        self.message_user(
            request,
            f"Dry run: would replay {len(keys)} run(s){': ' + listed if keys else ''}; "
            f"would ignore {plan.ignored} that are not dead or cancelled. Nothing was changed.",
            messages.INFO,
        )

    @admin.action(description="Cancel selected queued/retrying/running runs", permissions=["change"])
    def cancel_selected(self, request: HttpRequest, queryset) -> None:
        self._bulk(
            request,
            queryset,
            services.cancel_runs,
            log="Cancelled.",
            summary="Cancelled {done} run(s); ignored {ignored} that were already finished.",
        )

    # --- single-run buttons and the dashboard ----------------------------------------

    def get_urls(self):
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        own = [
            path("<path:object_id>/replay/", wrap(self.replay_view), name=f"{info}_replay"),
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name=f"{info}_cancel"),
        ]
        if self.model is JobRun:
            own.insert(0, path("dashboard/", wrap(self.dashboard_view), name="runs_dashboard"))
        return own + super().get_urls()

    def _operate(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.can_operate(request):
            raise PermissionDenied
        run = self.get_object(request, object_id)
        if run is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        service = services.replay_run if operation == "replay" else services.cancel_run
        try:
            service(job_id=run.job_id, scheduled_at=run.scheduled_at, actor=actor_of(request))
        except services.RunConflict as exc:
            self.message_user(request, str(exc), messages.ERROR)
        except services.RunNotFound:
            self.message_user(request, "The run no longer exists.", messages.ERROR)
        else:
            verb = "Replayed: re-queued under the same run key." if operation == "replay" else "Cancelled."
            self._log(request, [run.pk], verb)
            self.message_user(request, f"{verb} {run.run_key}", messages.SUCCESS)
        if self.model is DeadRun and request.GET.get("from") == "list":
            # Replayed from its row in the dead-letter queue: back to the queue, where
            # the message says what happened and the next dead run is one click away.
            return HttpResponseRedirect(reverse("admin:runs_deadrun_changelist"))
        # A replayed run leaves the dead-letter queue: show it in the runs list.
        return HttpResponseRedirect(reverse("admin:runs_jobrun_change", args=[run.pk]))

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._operate(request, object_id, "replay")

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._operate(request, object_id, "cancel")

    def changelist_view(self, request: HttpRequest, extra_context=None):
        return super().changelist_view(request, {"count_cap": COUNT_CAP, **(extra_context or {})})

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "", extra_context=None):
        run = self.get_object(request, object_id)
        extra = {
            "can_replay": run is not None and run.status in services.REPLAYABLE and self.can_operate(request),
            "can_cancel": run is not None
            and run.status in services.CANCELLABLE
            and self.can_operate(request),
        }
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        now = timezone.now()
        lateness, due = selectors.oldest_due(now=now)
        depth = selectors.queue_depth()
        priorities = sorted({p for p, _ in depth}, reverse=True)
        statuses = [str(s) for s in ACTIVE_STATUSES]
        depth_rows = [
            (p, [depth.get((p, s), 0) for s in statuses], sum(depth.get((p, s), 0) for s in statuses))
            for p in priorities
        ]
        last_hour = selectors.status_counts(since=now - timedelta(hours=1))
        nodes = selectors.scheduler_nodes()
        executors = selectors.executor_nodes()
        refresh = request.GET.get("refresh", str(DASHBOARD_REFRESH_SECONDS))
        context = {
            **self.admin_site.each_context(request),
            "title": "Operations dashboard",
            "now": now,
            "lateness_seconds": round(lateness, 1),
            "due_jobs": due,
            # Same rule as the API's overdue_seconds and /metrics' cronyard_jobs_overdue.
            "overdue_jobs": sum(
                health.overdue_by_tenant(
                    now=now, late_seconds=settings.SCHEDULER_OVERDUE_ALERT_SECONDS
                ).values()
            ),
            "overdue_after": settings.SCHEDULER_OVERDUE_ALERT_SECONDS,
            "depth_statuses": statuses,
            "depth_rows": depth_rows,
            "depth_totals": [sum(depth.get((p, s), 0) for p in priorities) for s in statuses],
            "last_hour": [(str(s), last_hour.get(s, 0)) for s in RunStatus],
            "last_hour_total": sum(last_hour.values()),
            "nodes": nodes,
            "live_nodes": sum(1 for n in nodes if n.alive),
            "executors": executors,
            "live_executors": sum(1 for n in executors if n.alive),
            "refresh_seconds": int(refresh) if refresh.isdigit() else DASHBOARD_REFRESH_SECONDS,
            "charts": _dashboard_charts(
                now=now, lateness=lateness, depth=depth, priorities=priorities, nodes=nodes
            ),
            "total_partitions": settings.SCHEDULER_PARTITIONS,
            "unowned_partitions": selectors.unowned_partitions(
                nodes=nodes, total=settings.SCHEDULER_PARTITIONS
            ),
            "tenant_loads": selectors.tenant_load(limit=50),
            "open_circuits": selectors.open_circuits(limit=50),
            "recent_changes": selectors.recent_admin_changes(limit=20),
            "dead_last_day": selectors.dead_count(since=now - timedelta(hours=24)),
        }
        return TemplateResponse(request, "admin/runs/dashboard.html", context)


def _dashboard_charts(*, now, lateness: float, depth: dict, priorities: list[int], nodes) -> dict:
    """The SVG charts: last hour per minute, lateness percentiles, queue depth, oldest due, partitions."""
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(hours=1)
    minutes = [start + timedelta(minutes=i) for i in range(60)]
    per_minute = timeseries.runs_per_minute(since=start, until=end)
    shown = [s for s in RunStatus if any(k[1] == s for k in per_minute)] or [RunStatus.SUCCEEDED]
    runs = charts.stacked_bars(
        chart="runs_per_minute",
        buckets=minutes,
        series=[(str(s), STATUS_COLORS[s], [per_minute.get((m, s), 0) for m in minutes]) for s in shown],
    )
    step = timedelta(seconds=LATENESS_STEP_SECONDS)
    lat_start = end - timedelta(hours=1)
    lat_buckets = [lat_start + i * step for i in range(int(timedelta(hours=1) / step))]
    pct = timeseries.lateness_percentiles(since=lat_start, until=end, step_seconds=LATENESS_STEP_SECONDS)
    late = charts.lines(
        chart="lateness",
        buckets=lat_buckets,
        series=[
            ("p50", "#1f6feb", [pct[b][0] if b in pct else None for b in lat_buckets]),
            ("p99", "#cf222e", [pct[b][1] if b in pct else None for b in lat_buckets]),
        ],
    )
    active = list(ACTIVE_STATUSES)
    queue = charts.horizontal_stacks(
        chart="queue_depth",
        rows=[
            (f"p{p}", [(str(s), STATUS_COLORS[s], depth.get((p, s), 0)) for s in active]) for p in priorities
        ],
    )
    owners: list[str | None] = [None] * settings.SCHEDULER_PARTITIONS
    live = [n for n in nodes if n.alive]
    for node in live:
        for p in node.owned:
            if 0 <= p < len(owners):
                owners[p] = node.node_id
    colors = {n.node_id: charts.NODE_COLORS[i % len(charts.NODE_COLORS)] for i, n in enumerate(live)}
    return {
        "runs_per_minute": runs,
        "lateness": late,
        "queue_depth": queue,
        "oldest_due": charts.gauge(
            chart="oldest_due", value=lateness, warn=float(settings.SCHEDULER_OVERDUE_ALERT_SECONDS)
        ),
        "partitions": charts.partition_map(owners=owners, colors=colors),
    }


class DeadRunAdmin(JobRunAdmin):
    """The dead-letter queue: dead runs only, newest first, replayable in bulk."""

    list_display = (
        "job_name",
        "scheduled",
        "tenant",
        "attempt_text",
        "result_code",
        "short_error",
        "finished",
        "replay_button",
    )
    list_filter = ("tenant", "trigger")
    actions = ("replay_selected", "replay_selected_dry_run")

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).filter(status=RunStatus.DEAD)

    @admin.display(description="")
    def replay_button(self, run: JobRun) -> str:
        # A submit button of the changelist's own form (it carries the CSRF token),
        # posting to this run's replay URL instead of the actions URL.
        url = reverse("admin:runs_deadrun_replay", args=[run.pk]) + "?from=list"
        return format_html('<button type="submit" class="button" formaction="{}">Replay</button>', url)

    @admin.display(description="last error")
    def short_error(self, run: JobRun) -> str:
        text = run.last_error or ""
        return text if len(text) <= 120 else text[:117] + "…"


def _cell(value: object) -> str:
    return "" if value is None else str(value)


admin.site.register(JobRun, JobRunAdmin)
admin.site.register(DeadRun, DeadRunAdmin)


@admin.register(ExecutorNode)
class ExecutorNodeAdmin(ReadOnlyAdmin):
    """Registered executors, read-only; alive by scheduler_project.liveness like schedulers."""

    list_display = (
        "node_id",
        "hostname",
        "pid",
        "concurrency",
        "in_flight",
        "last_claim_at",
        "heartbeat_at",
        "alive",
    )

    def get_queryset(self, request):
        return liveness.with_alive(super().get_queryset(request))

    @admin.display(boolean=True, description="alive", ordering="alive")
    def alive(self, node: ExecutorNode) -> bool:
        return node.alive
