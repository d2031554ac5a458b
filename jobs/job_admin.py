"""Jobs in the admin: the list (filters, columns, search, bulk actions) and the change
form's save, which goes through jobs.services. The job page's read-only panels are in
jobs/job_admin_page.py, its pause/resume/trigger and preview views in
jobs/job_admin_views.py."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib import admin, messages
from django.db.models import OuterRef, Subquery
from django.http import HttpResponseRedirect
from django.utils import timezone
from django.utils.html import format_html

from jobs import services
from jobs.admin_base import actor_of
from jobs.display import in_zone, relative
from jobs.forms import POLICY_FORM_FIELDS, SCHEDULE_FORM_FIELDS, JobAdminForm
from jobs.health import overdue_seconds
from jobs.job_admin_delete import JobDeleteSummary
from jobs.job_admin_page import JobPagePanels
from jobs.job_admin_views import JobConsoleViews
from jobs.models import Job
from jobs.validation import JobInvalid
from runs import tasks
from runs.admin_html import status_pill, target_html
from runs.keys import format_utc
from runs.models import JobRun


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


@admin.register(Job)
class JobAdmin(JobConsoleViews, JobPagePanels, JobDeleteSummary, admin.ModelAdmin):
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
        # The newest run per job, from the (partition_id, job_id, scheduled_at) unique index
        # of each partition (inside the job's shard on Citus); only for the rows shown.
        latest = JobRun.objects.filter(partition_id=OuterRef("partition_id"), job_id=OuterRef("pk")).order_by(
            "-scheduled_at"
        )
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
        now = timezone.now()
        text = format_html(
            '<span title="{}">{}</span> <span class="cronyard-relative">({})</span>',
            format_utc(job.next_run_at),
            in_zone(job.next_run_at, job.time_zone),
            relative(job.next_run_at, now=now),
        )
        late = overdue_seconds(job, now=now)
        if late is None:
            return text
        # The same rule as the API's overdue_seconds, /metrics and the alert sweep.
        return format_html(
            '{} <span class="cronyard-overdue" style="background:#ba2121;color:#fff;padding:1px 7px;'
            'border-radius:8px;font-size:11px" title="late by more than SCHEDULER_OVERDUE_ALERT_SECONDS '
            '({}s): no scheduler has dispatched it">overdue</span>',
            text,
            settings.SCHEDULER_OVERDUE_ALERT_SECONDS,
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

    readonly_fields = (
        "id",
        "partition_id",
        "next_run_at",
        "schedule_text",
        "next_fire_times",
        "created_at",
        "state",
        "last_outcome",
        "recent_runs",
        "recent_occurrences",
    )
    fieldsets = (
        (None, {"fields": ("tenant", "name", "paused", "priority")}),
        (
            "Schedule",
            {"fields": (*SCHEDULE_FORM_FIELDS, "schedule_text", "next_fire_times")},
        ),
        ("Target", {"fields": ("target",)}),
        (
            "Policies",
            {"fields": POLICY_FORM_FIELDS},
        ),
        ("State", {"fields": ("id", "partition_id", "next_run_at", "created_at")}),
    )
    activity_fieldset = (
        "Activity",
        {"fields": ("last_outcome", "recent_runs", "recent_occurrences"), "classes": ("cronyard-activity",)},
    )

    def get_fieldsets(self, request, obj=None):
        # A job's runs and occurrences first, where an operator looks; none before it exists.
        if obj is None:
            return self.fieldsets
        # Paused is changed by the Pause/Resume buttons; shown as the neutral state word.
        head = (None, {"fields": ("tenant", "name", "state", "priority")})
        fieldsets = (head, self.activity_fieldset, *self.fieldsets[1:])
        if not self.has_change_permission(request, obj):
            # A view-only page shows every field read-only, and Django would print the
            # stored target (its secrets) as raw JSON: show the redacted one instead.
            swap = {"target": "target_redacted"}
            fieldsets = tuple(
                (name, {**opts, "fields": tuple(swap.get(f, f) for f in opts["fields"])})
                for name, opts in fieldsets
            )
        return fieldsets

    @admin.display(description="target")
    def target_redacted(self, job: Job) -> str:
        return target_html(job.target)

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

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # The task picker beside the target field: names, docstrings and kwargs schemas
        # of the registry this process validates against (runs.tasks).
        extra_context = {**(extra_context or {}), "cronyard_tasks": tasks.catalog()}
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except JobInvalid as exc:
            # The form accepted the edit but the service, judging it again on the locked
            # row, refused it (another edit changed the job meanwhile). The admin's
            # transaction has rolled back: nothing was saved. Say so, not a server error.
            problems = "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in exc.errors.items())
            self.message_user(
                request, f"Not saved: the job changed while you edited it ({problems}).", messages.ERROR
            )
            return HttpResponseRedirect(request.get_full_path())

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        # The posted form's kwargs problems by kwarg name, for the generated kwargs inputs.
        context["cronyard_kwargs_errors"] = context["adminform"].form.kwargs_errors()
        return super().render_change_form(request, context, add, change, form_url, obj)

    def save_model(self, request, obj: Job, form, change: bool) -> None:
        # The form judged the same rules (jobs/edits.py); the service judges them again
        # on the locked row and writes.
        if not change:
            tenant = form.cleaned_data["tenant"]
            services.create_job(
                tenant=tenant, id=obj.id, fields=form.new_job_fields(), actor=actor_of(request)
            )
            obj._state.adding = False
        else:
            changes = form.job_changes()
            if changes:
                services.update_job(job=obj, changes=changes, actor=actor_of(request))
        obj.refresh_from_db()

    def delete_model(self, request, obj: Job) -> None:
        services.delete_job(job=obj, actor=actor_of(request))

    def delete_queryset(self, request, queryset) -> None:
        for job in queryset:
            services.delete_job(job=job, actor=actor_of(request))

    @admin.action(description="Pause selected jobs")
    def pause_jobs(self, request, queryset) -> None:
        count = 0
        for job in queryset.filter(paused=False):
            services.pause_job(job=job, actor=actor_of(request))
            count += 1
        self.message_user(request, f"Paused {count} job(s).", messages.SUCCESS)

    @admin.action(description="Resume selected jobs (next future slot, no catch-up)")
    def resume_jobs(self, request, queryset) -> None:
        count = 0
        for job in queryset.filter(paused=True):
            services.resume_job(job=job, catch_up="none", actor=actor_of(request))
            count += 1
        self.message_user(request, f"Resumed {count} job(s).", messages.SUCCESS)

    @admin.action(description="Trigger selected jobs now (manual run)")
    def trigger_now(self, request, queryset) -> None:
        count = 0
        for job in queryset:
            services.trigger_job(job=job, actor=actor_of(request))
            count += 1
        self.message_user(request, f"Queued a manual run for {count} job(s).", messages.SUCCESS)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {"job_operations": self.has_change_permission(request)}
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})
