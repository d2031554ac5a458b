"""Admin console for jobs, tenants, misfires and scheduler nodes. Writes go through jobs.services."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib import admin, messages
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from jobs import services
from jobs.describe import describe_job, fire_time_json, job_fire_times, preview
from jobs.display import in_zone, relative
from jobs.forms import VALIDATED_FIELDS, JobAdminForm
from jobs.models import ApiToken, Job, Misfire, SchedulerNode, Tenant
from jobs.validation import check_cron, check_interval, check_zone
from runs.admin import status_pill
from runs.keys import format_utc
from runs.models import JobRun

PREVIEW_COUNT = 5


class TriggerTypeFilter(admin.SimpleListFilter):
    title = "trigger type"
    parameter_name = "trigger"

    def lookups(self, request, model_admin):
        return [("cron", "Cron"), ("interval", "Interval"), ("run_at", "One time")]

    def queryset(self, request, queryset):
        if self.value() == "cron":
            return queryset.exclude(cron_expr="")
        if self.value() == "interval":
            return queryset.filter(interval_seconds__isnull=False)
        if self.value() == "run_at":
            return queryset.filter(run_at__isnull=False)
        return queryset


def _fire_times_html(times) -> str:
    if not times:
        return "No future fire times."
    return format_html(
        "<ol class='cronyard-preview'>{}</ol>",
        format_html_join(
            "",
            "<li><code>{}</code> &nbsp; local {} {}</li>",
            ((t["utc"], t["local"], f"— {t['note']}" if t["note"] else "") for t in times),
        ),
    )


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    form = JobAdminForm
    change_form_template = "admin/jobs/job/change_form.html"
    list_display = (
        "name",
        "tenant",
        "state",
        "trigger_type",
        "schedule_text",
        "next_run",
        "last_run",
        "priority",
    )
    list_filter = ("paused", TriggerTypeFilter, "tenant", "misfire_policy", "overlap_policy")
    search_fields = ("name", "cron_expr")
    search_help_text = "Name or cron text; a whole job id finds that job."
    list_select_related = ("tenant",)
    ordering = ("-created_at",)
    actions = ("pause_jobs", "resume_jobs", "trigger_now")

    def get_queryset(self, request):
        # The newest run per job, from the (job_id, scheduled_at) unique index of each
        # partition; evaluated only for the rows of the page shown.
        latest = JobRun.objects.filter(job_id=OuterRef("pk")).order_by("-scheduled_at")
        return (
            super()
            .get_queryset(request)
            .annotate(
                _last_status=Subquery(latest.values("status")[:1]),
                _last_at=Subquery(latest.values("scheduled_at")[:1]),
            )
        )

    @admin.display(description="state", ordering="paused")
    def state(self, job: Job) -> str:
        # Neutral words, not Django's red/green booleans: an active job is not an error.
        return format_html(
            '<span class="cronyard-state cronyard-state-{}" style="border:1px solid #8a949e;'
            'padding:0 6px;border-radius:8px;font-size:11px;color:{}">{}</span>',
            "paused" if job.paused else "active",
            "#8a949e" if job.paused else "inherit",
            "paused" if job.paused else "active",
        )

    @admin.display(description="next run (job's zone)", ordering="next_run_at")
    def next_run(self, job: Job) -> str:
        if job.next_run_at is None:
            return "—"
        return format_html(
            '<span title="{}">{}</span> <span class="cronyard-relative">({})</span>',
            format_utc(job.next_run_at),
            in_zone(job.next_run_at, job.time_zone),
            relative(job.next_run_at, now=timezone.now()),
        )

    @admin.display(description="last run")
    def last_run(self, job: Job) -> str:
        status = getattr(job, "_last_status", None)
        if status is None:
            return "—"
        return format_html(
            '{} <span title="{}">{}</span>',
            status_pill(status),
            format_utc(job._last_at),
            relative(job._last_at, now=timezone.now()),
        )

    def get_search_results(self, request, queryset, search_term):
        # A pasted id is an exact primary-key lookup; `id LIKE '%..%'` over a cast
        # UUID would scan the table and match random ids on short digit strings.
        try:
            job_id = uuid.UUID(search_term.strip())
        except ValueError:
            return super().get_search_results(request, queryset, search_term)
        return queryset.filter(pk=job_id), False

    readonly_fields = ("id", "partition_id", "next_run_at", "schedule_text", "next_fire_times", "created_at")
    fieldsets = (
        (None, {"fields": ("tenant", "name", "paused", "priority")}),
        (
            "Schedule",
            {
                "fields": (
                    "cron_expr",
                    "time_zone",
                    "interval_seconds",
                    "run_at",
                    "start_at",
                    "end_at",
                    "schedule_text",
                    "next_fire_times",
                )
            },
        ),
        ("Target", {"fields": ("target",)}),
        (
            "Policies",
            {
                "fields": (
                    "misfire_policy",
                    "max_catch_up",
                    "overlap_policy",
                    "max_attempts",
                    "retry_backoff_seconds",
                    "retry_backoff_cap_seconds",
                    "lease_seconds",
                )
            },
        ),
        ("State", {"fields": ("id", "partition_id", "next_run_at", "created_at")}),
    )

    def get_readonly_fields(self, request, obj=None):
        # Pausing and resuming have their own semantics (no past slot fires): use the actions.
        # The tenant is fixed at creation: runs carry their own tenant_id (the runs API
        # and the per-tenant concurrency limit read it), so moving only the job would
        # leave its runs readable and cancellable by the old tenant.
        fields = self.readonly_fields
        return (*fields, "tenant", "paused") if obj is not None else fields

    @admin.display(description="trigger", ordering="cron_expr")
    def trigger_type(self, job: Job) -> str:
        return job.trigger_type

    @admin.display(description="schedule")
    def schedule_text(self, job: Job) -> str:
        if job.pk is None or job._state.adding:
            return "-"
        expr = job.cron_expr or (f"every {job.interval_seconds}s" if job.interval_seconds else "")
        return f"{expr} — {describe_job(job)}" if job.cron_expr else describe_job(job) or expr

    @admin.display(description="next fire times")
    def next_fire_times(self, job: Job) -> str:
        if job.pk is None or job._state.adding:
            return "Shown after saving; the preview below the schedule fields updates as you type."
        times = [fire_time_json(t) for t in job_fire_times(job, now=timezone.now(), count=PREVIEW_COUNT)]
        return _fire_times_html(times)

    def save_model(self, request, obj: Job, form, change: bool) -> None:
        if not change:
            fields = {f: form.cleaned_data[f] for f in VALIDATED_FIELDS}
            fields["paused"] = form.cleaned_data.get("paused", False)
            services.create_job(tenant=form.cleaned_data["tenant"], id=obj.id, **fields)
            obj._state.adding = False
        else:
            changes = {f: form.cleaned_data[f] for f in form.changed_data if f in VALIDATED_FIELDS}
            if changes:
                services.update_job(job=obj, changes=changes)
        obj.refresh_from_db()

    def delete_model(self, request, obj: Job) -> None:
        services.delete_job(job=obj)

    def delete_queryset(self, request, queryset) -> None:
        for job in queryset:
            services.delete_job(job=job)

    @admin.action(description="Pause selected jobs")
    def pause_jobs(self, request, queryset) -> None:
        count = 0
        for job in queryset.filter(paused=False):
            services.pause_job(job=job)
            count += 1
        self.message_user(request, f"Paused {count} job(s).", messages.SUCCESS)

    @admin.action(description="Resume selected jobs (next future slot, no catch-up)")
    def resume_jobs(self, request, queryset) -> None:
        count = 0
        for job in queryset.filter(paused=True):
            services.resume_job(job=job, catch_up="none")
            count += 1
        self.message_user(request, f"Resumed {count} job(s).", messages.SUCCESS)

    @admin.action(description="Trigger selected jobs now (manual run)")
    def trigger_now(self, request, queryset) -> None:
        count = 0
        for job in queryset:
            services.trigger_job(job=job)
            count += 1
        self.message_user(request, f"Queued a manual run for {count} job(s).", messages.SUCCESS)

    def get_urls(self):
        extra = [
            path(
                "preview/",
                self.admin_site.admin_view(self.preview_view),
                name="jobs_job_preview",
            )
        ]
        return extra + super().get_urls()

    def preview_view(self, request: HttpRequest) -> JsonResponse:
        """Fire times of the schedule being edited (the live preview on the change form)."""
        if not self.has_view_or_change_permission(request):
            return JsonResponse({"error": "forbidden"}, status=403)
        cron = request.GET.get("cron_expr", "").strip() or None
        interval_text = request.GET.get("interval_seconds", "").strip()
        zone = request.GET.get("time_zone", "").strip() or "UTC"
        try:
            check_zone(zone)
            if cron and not interval_text:
                cron = check_cron(cron, zone=zone)
                interval = None
            elif interval_text and not cron:
                interval = check_interval(int(interval_text) if interval_text.isdigit() else interval_text)
            else:
                return JsonResponse({"error": "Set exactly one of cron or interval."}, status=400)
        except ValueError as exc:
            return JsonResponse({"error": str(exc)}, status=400)
        now = timezone.now().replace(microsecond=0)  # whole seconds, as create_job anchors an interval
        return JsonResponse(
            preview(cron=cron, timezone=zone, interval_seconds=interval, after=now, count=PREVIEW_COUNT)
        )


class ApiTokenInline(admin.TabularInline):
    model = ApiToken
    extra = 0
    can_delete = False
    fields = ("prefix", "label", "created_at", "last_used_at", "revoked")
    readonly_fields = ("prefix", "label", "created_at", "last_used_at")

    def has_add_permission(self, request, obj=None) -> bool:
        return False


def _count_of(rows) -> Coalesce:
    """COUNT(*) of `rows` belonging to the outer tenant, as a scalar subquery."""
    counted = rows.filter(tenant=OuterRef("pk")).order_by().values("tenant").annotate(n=Count("*"))
    return Coalesce(Subquery(counted.values("n")), 0)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "max_concurrency", "weight", "token_count", "job_count", "created_at")
    search_fields = ("slug", "name")
    actions = ("issue_new_token",)
    inlines = (ApiTokenInline,)

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            # Correlated counts: two Counts over one join would multiply jobs by tokens.
            .annotate(
                _tokens=_count_of(ApiToken.objects.filter(revoked=False)),
                _jobs=_count_of(Job.objects.all()),
            )
        )

    @admin.display(description="active tokens", ordering="_tokens")
    def token_count(self, tenant: Tenant) -> int:
        return tenant._tokens

    @admin.display(description="jobs", ordering="_jobs")
    def job_count(self, tenant: Tenant) -> int:
        return tenant._jobs

    def save_model(self, request, obj: Tenant, form, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        tenant, token = services.create_tenant(
            slug=obj.slug, name=obj.name, max_concurrency=obj.max_concurrency, weight=obj.weight
        )
        obj.pk = tenant.pk
        obj._state.adding = False
        obj.refresh_from_db()
        self._show_token(request, tenant, token)

    @admin.action(description="Issue a new API token (shown once)")
    def issue_new_token(self, request, queryset) -> None:
        for tenant in queryset:
            self._show_token(request, tenant, services.issue_token(tenant=tenant, label="admin"))

    def _show_token(self, request, tenant: Tenant, token: str) -> None:
        self.message_user(
            request,
            f"New API token for {tenant.slug} (shown once, store it now): {token}",
            messages.WARNING,
        )


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Misfire)
class MisfireAdmin(ReadOnlyAdmin):
    list_display = (
        "job",
        "detected_at",
        "policy",
        "missed",
        "first_missed_at",
        "last_missed_at",
        "runs_created",
    )
    list_filter = ("policy",)
    search_fields = ("job__name", "job__id")
    list_select_related = ("job",)

    @admin.display(description="missed", ordering="missed_count")
    def missed(self, obj: Misfire) -> str:
        return f"at least {obj.missed_count}" if obj.count_is_lower_bound else str(obj.missed_count)


@admin.register(SchedulerNode)
class SchedulerNodeAdmin(ReadOnlyAdmin):
    list_display = ("node_id", "hostname", "pid", "started_at", "heartbeat_at", "alive", "partition_count")

    @admin.display(boolean=True, description="alive")
    def alive(self, node: SchedulerNode) -> bool:
        # Silent for longer than a lease: its partitions are up for grabs.
        return (timezone.now() - node.heartbeat_at).total_seconds() <= settings.SCHEDULER_LEASE_SECONDS

    @admin.display(description="partitions")
    def partition_count(self, node: SchedulerNode) -> int:
        return len(node.partitions or [])
