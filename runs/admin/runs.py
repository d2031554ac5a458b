"""The runs list and a run's page in the admin: read-only, filterable, searchable by job id
or run key; replay/cancel come from runs/admin/run_actions.py.

Run pages are read-only on purpose: a form save would rewrite every column of a row
that executors update concurrently.
"""

from __future__ import annotations

from uuid import UUID

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.paginator import Paginator
from django.db.models import OuterRef, Subquery
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join

from jobs.admin.base import ConsoleTitles
from jobs.admin.display import duration_between, in_zone, moment_column, moment_html
from jobs.models import Job
from runs import attempts, selectors, services
from runs.admin import dashboard
from runs.admin.html import ATTEMPT_LABELS, attempt_cell, status_pill, target_html
from runs.admin.run_actions import RunOperations
from runs.keys import parse_utc
from runs.models import JobRun

COUNT_CAP = 10_000


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
        return selectors.of_job(queryset, job_id=job_id)


def _uuid_or_none(text: str) -> UUID | None:
    try:
        return UUID(text)
    except ValueError:
        return None


def _zone(run: JobRun) -> str | None:
    """The run's job's zone (get_queryset's annotation; None for a deleted job: UTC)."""
    return getattr(run, "job_zone", None)


class CappedCountPaginator(Paginator):
    """count(*) over a big partitioned table is slow; count at most COUNT_CAP + 1 rows
    (`SELECT count(*) FROM (... LIMIT n)`), so the last pages of a huge unfiltered list
    are reachable only by narrowing the filters."""

    @cached_property
    def count(self) -> int:
        # Without the ordering the capped count stops after COUNT_CAP rows instead of sorting all.
        return self.object_list.order_by()[: COUNT_CAP + 1].count()


class JobRunAdmin(ConsoleTitles, RunOperations, admin.ModelAdmin):
    list_title = "Runs"
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
                    "not_before_shown",
                    "dispatch_note",
                    "lease_until_shown",
                    "owner",
                    "started_at_shown",
                    "finished_at_shown",
                    "run_length",
                    "result_code",
                    "last_error",
                )
            },
        ),
        ("Attempts", {"fields": ("attempts_table",)}),
        (
            "What it runs",
            {
                "fields": (
                    "target_version_shown",
                    "target_snapshot",
                    "overlap_policy",
                    "retry_backoff_seconds",
                    "retry_backoff_cap_seconds",
                    "lease_seconds",
                    "created_at_shown",
                )
            },
        ),
    )
    # Every field shown is read-only: a run is changed only by replay/cancel.
    readonly_fields = tuple(name for _, options in fieldsets for name in options["fields"])

    def object_title(self, run: JobRun) -> str:
        return f"Run of {run.job_name or run.job_id} at {in_zone(run.scheduled_at, _zone(run))}"

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

    @admin.display(description="scheduled", ordering="scheduled_at")
    def scheduled(self, run: JobRun) -> str:
        return moment_html(run.scheduled_at, now=timezone.now(), zone=_zone(run), relative_line=True)

    @admin.display(description="started", ordering="started_at")
    def ran(self, run: JobRun) -> str:
        # One column for start and length: the list must fit 1280 px beside the filters;
        # finished_at and the result code are on the run's page.
        started = moment_html(run.started_at, now=timezone.now(), zone=_zone(run), relative_line=True)
        took = duration_between(run.started_at, run.finished_at)
        if not took:
            return started
        return format_html(
            '{} <span class="cronyard-duration" style="font-size:11px">· ran {}</span>', started, took
        )

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, run: JobRun) -> str:
        return moment_html(run.finished_at, now=timezone.now(), zone=_zone(run), relative_line=True)

    # The run page's moments, by the console's rule, in the job's zone.
    not_before_shown = moment_column("not_before", description="not before", zone=_zone)
    lease_until_shown = moment_column("lease_until", description="lease until", zone=_zone)
    started_at_shown = moment_column("started_at", description="started", zone=_zone)
    finished_at_shown = moment_column("finished_at", description="finished", zone=_zone)
    created_at_shown = moment_column("created_at", description="created", zone=_zone)

    @admin.display(description="ran for")
    def run_length(self, run: JobRun) -> str:
        return duration_between(run.started_at, run.finished_at) or "—"

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: JobRun) -> str:
        return status_pill(run.status)

    @admin.display(description="attempts used", ordering="attempt")
    def attempt_text(self, run: JobRun) -> str:
        # Used, not the attempt number: a claim put back unsent took a number but no attempt.
        # "6 / 5" alone reads like a bug; past max_attempts only a replay can take a run.
        note = selectors.attempt_note(run)
        base = f"{run.attempts_used} / {run.max_attempts}"
        return f"{base} ({note})" if note else base

    @admin.display(description="dispatch")
    def dispatch_note(self, run: JobRun) -> str:
        return selectors.dispatch_note(run) or "started when due"

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
        entries = attempts.history(run)
        if not entries:
            return "no attempt recorded yet"
        columns = attempts.FIELDS
        head = format_html_join("", "<th>{}</th>", ((ATTEMPT_LABELS.get(c, c),) for c in columns))
        now = timezone.now()
        rows = format_html_join(
            "",
            "<tr>{}</tr>",
            (
                (
                    format_html_join(
                        "",
                        "<td>{}</td>",
                        ((attempt_cell(c, e.get(c), zone=_zone(run), now=now),) for c in columns),
                    ),
                )
                for e in entries
            ),
        )
        return format_html(
            '<table class="attempts"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', head, rows
        )

    @admin.display(description="target version")
    def target_version_shown(self, run: JobRun) -> str:
        # Every attempt and replay of the run calls this version, whatever edits came since.
        if run.target_version is None:
            return "its own copy (created before target versions)"
        return f"version {run.target_version} of the job's target"

    @admin.display(description="target (secrets redacted)")
    def target_snapshot(self, run: JobRun) -> str:
        return target_html(selectors.target_of(run))

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
        queryset = selectors.of_job(queryset, job_id=job_id)
        if time_part:
            try:
                queryset = queryset.filter(scheduled_at=parse_utc(time_part))
            except (ValueError, OverflowError):
                return queryset.none(), False
        return queryset, False

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

    def changelist_view(self, request: HttpRequest, extra_context=None):
        return super().changelist_view(request, {"count_cap": COUNT_CAP, **(extra_context or {})})

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        # The buttons from the run Django loaded for the page, not a load of their own.
        operate = obj is not None and self.can_operate(request)
        context["can_replay"] = operate and obj.status in services.REPLAYABLE
        context["can_cancel"] = operate and obj.status in services.CANCELLABLE
        return super().render_change_form(request, context, add, change, form_url, obj)

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        return dashboard.page(request, admin_site=self.admin_site)
