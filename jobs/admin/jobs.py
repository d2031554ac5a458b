"""Jobs in the admin: the list (filters, columns, search, bulk actions), the job's page
(`<id>/change/`, where every link to a job lands: the read view, jobs/admin/job_page.py),
its edit form (`<id>/edit/`: the save through jobs.services, the live schedule preview
and "Preview changes"), the page's panels, its pause/resume/trigger confirmations, its
backfill (jobs/admin/backfill.py) and the delete confirmation."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.text import capfirst

from jobs import edit_preview, health, services
from jobs.admin import activity, backfill, change_preview, console, dst_form, health_panel, job_page, load
from jobs.admin.base import ConsoleTitles, actor_of
from jobs.admin.display import in_zone, moment_column, moment_html, relative
from jobs.admin.forms import POLICY_FORM_FIELDS, SCHEDULE_FORM_FIELDS, JobAdminForm
from jobs.describe import check_preview_schedule, describe_job, fire_time_json, job_fire_times, preview
from jobs.models import Job, Misfire, SlotRange, TriggerType
from jobs.rules.fields import check_dst_policy
from jobs.rules.job import JobInvalid
from runs import tasks
from runs.admin.html import status_pill, target_html
from runs.models import JobRun
from runs.selectors import dispatch_note
from scheduler_project import db

PREVIEW_COUNT = 5


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


def _policy_param(params: Mapping[str, str]) -> dict:
    """The DST menus as chosen (jobs/admin/dst_form.py: `dst_policy_repeated`,
    `dst_policy_missing`; unset = Debian cron's rule)."""
    value = {key: params.get(f"dst_policy_{key}", "").strip() for key in dst_form.KEYS}
    try:
        return check_dst_policy({key: v for key, v in value.items() if v})
    except ValueError as exc:
        raise ValueError("dst_policy: " + " ".join(map(str, exc.args))) from None


class TriggerTypeFilter(admin.SimpleListFilter):
    title = "trigger type"
    parameter_name = "trigger"

    def lookups(self, request, model_admin):
        return TriggerType.choices

    def queryset(self, request, queryset):
        if self.value() == "cron":
            return queryset.exclude(cron_expr="")
        if self.value() == "interval":
            return queryset.filter(interval_seconds__isnull=False)
        if self.value() == "run_at":
            return queryset.filter(run_at__isnull=False)
        return queryset


@admin.register(Job)
class JobAdmin(ConsoleTitles, admin.ModelAdmin):
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
    list_filter = (
        "paused",
        health_panel.HealthFilter,
        TriggerTypeFilter,
        "tenant",
        "misfire_policy",
        "overlap_policy",
    )
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
            '{} <span class="cronyard-relative">({})</span>',
            moment_html(job.next_run_at, now=now, zone=job.time_zone),
            relative(job.next_run_at, now=now),
        )
        late = health.overdue_seconds(job, now=now)
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
            "{} {}", status_pill(status), moment_html(job._last_at, now=timezone.now(), zone=job.time_zone)
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
        "next_run_at_shown",
        "schedule_text",
        "next_fire_times",
        "load_at_next_slot",
        "created_at_shown",
        "state",
    )
    fieldsets = (
        (None, {"fields": ("tenant", "name", "paused", "priority")}),
        (
            "Schedule",
            {"fields": (*SCHEDULE_FORM_FIELDS, "schedule_text", "next_fire_times", "load_at_next_slot")},
        ),
        ("Target", {"fields": ("target",)}),
        (
            "Policies",
            {"fields": POLICY_FORM_FIELDS},
        ),
        ("State", {"fields": ("id", "partition_id", "next_run_at_shown", "created_at_shown")}),
    )

    def get_fieldsets(self, request, obj=None):
        # The job's activity is on its read view (jobs/admin/job_page.py), not on the form.
        if obj is None:
            return self.fieldsets
        # Paused is changed by the Pause/Resume buttons; shown as the neutral state word.
        head = (None, {"fields": ("tenant", "name", "state", "priority")})
        fieldsets = (head, *self.fieldsets[1:])
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
        return TriggerType(job.trigger_type).label

    next_run_at_shown = moment_column("next_run_at", description="next run", zone=lambda job: job.time_zone)
    created_at_shown = moment_column("created_at", description="created", zone=lambda job: job.time_zone)

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
        # The form judged the same rules (jobs/rules/edits.py); the service judges them again
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
        """`<id>/change/`, the URL Django's own links reverse (the list, history, breadcrumbs,
        the messages after a save, the run pages): the read view. A POST is the edit
        form's save, so a form posted from an older page still saves."""
        if request.method == "POST":
            return self.edit_view(request, object_id, form_url, extra_context)
        return job_page.read_view(self, request, object_id)

    def edit_view(self, request, object_id, form_url="", extra_context=None):
        """`<id>/edit/`: Django's change form, the one place a job is edited."""
        extra = {
            "job_operations": self.has_change_permission(request),
            "job_url": reverse("admin:jobs_job_change", args=[unquote(object_id)]),
        }
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})

    def response_post_save_change(self, request, obj: Job) -> HttpResponse:
        # Back to the job's page, which shows what the edit did (next fire times, state).
        return HttpResponseRedirect(reverse("admin:jobs_job_change", args=[obj.pk]))

    def response_post_save_add(self, request, obj: Job) -> HttpResponse:
        return HttpResponseRedirect(reverse("admin:jobs_job_change", args=[obj.pk]))

    # --- the read-only panels of a job's page --------------------------------

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
        times = [
            fire_time_json(t, jitter_seconds=job.jitter_seconds)
            for t in job_fire_times(job, now=timezone.now(), count=PREVIEW_COUNT)
        ]
        return _fire_times_html(times)

    @admin.display(description="load at its next slot")
    def load_at_next_slot(self, job: Job) -> str:
        if job.pk is None or job._state.adding:
            return "Shown after saving."
        return load.next_slot_load(job, now=timezone.now())

    @admin.display(description="last outcome")
    def last_outcome(self, job: Job) -> str:
        run = activity.last_finished(job=job)
        if run is None:
            return "No finished run yet."
        return format_html(
            '{} <a href="{}">{}</a> ({}){}',
            status_pill(run.status),
            reverse("admin:runs_jobrun_change", args=[run.pk]),
            moment_html(run.scheduled_at, now=timezone.now(), zone=job.time_zone),
            relative(run.finished_at, now=timezone.now()),
            f" — {activity.excerpt(run.last_error)}" if run.last_error and run.status != "succeeded" else "",
        )

    @admin.display(description="health")
    def health_figures(self, job: Job) -> str:
        now = timezone.now()
        return health_panel.panel(job, figures=health.job_health(job, now=now), now=now)

    @admin.display(description=f"recent runs (last {activity.RECENT_RUNS})")
    def recent_runs(self, job: Job) -> str:
        runs = activity.recent_runs(job=job)
        all_link = format_html(
            '<p><a id="cronyard-all-runs" href="{}?job={}">All runs of this job &rarr;</a></p>',
            reverse("admin:runs_jobrun_changelist"),
            job.pk,
        )
        if not runs:
            return format_html("<p>No runs yet.</p>{}", all_link)
        now = timezone.now()
        rows = format_html_join(
            "",
            '<tr data-run="{}"><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
            "<td>{}</td></tr>",
            (
                (
                    run.pk,
                    reverse("admin:runs_jobrun_change", args=[run.pk]),
                    moment_html(run.scheduled_at, now=now, zone=job.time_zone),
                    status_pill(run.status),
                    run.trigger,
                    run.attempt,
                    activity.duration(run),
                    activity.excerpt(run.last_error),
                )
                for run in runs
            ),
        )
        return format_html(
            '<table class="cronyard-runs"><thead><tr><th>scheduled at</th><th>status</th>'
            "<th>trigger</th><th>attempt</th><th>duration</th><th>error</th></tr></thead>"
            "<tbody>{}</tbody></table>{}",
            rows,
            all_link,
        )

    @admin.display(description="recent occurrences (ledger)")
    def recent_occurrences(self, job: Job) -> str:
        items = activity.recent_occurrences(job=job)
        if not items:
            return "No slot has been due yet."
        now = timezone.now()
        rows = format_html_join(
            "",
            '<tr data-outcome="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    o.outcome,
                    moment_html(o.scheduled_at, now=now, zone=job.time_zone),
                    o.outcome,
                    (o.run is not None and dispatch_note(o.run)) or o.reason or "",
                    format_html('<a href="{}">run</a>', reverse("admin:runs_jobrun_change", args=[o.run.pk]))
                    if o.run is not None
                    else "",
                )
                for o in items
            ),
        )
        return format_html(
            '<table class="cronyard-occurrences"><thead><tr><th>slot</th>'
            "<th>outcome</th><th>reason</th><th></th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    # --- the job page's own views: pause / resume / trigger and the live preview ---

    def get_urls(self):
        extra = [
            path(
                "preview/",
                self.admin_site.admin_view(self.preview_view),
                name="jobs_job_preview",
            ),
            path(
                "<path:object_id>/operate/<str:operation>/",
                self.admin_site.admin_view(self.operate_view),
                name="jobs_job_operate",
            ),
            path(
                "<path:object_id>/edit/",
                self.admin_site.admin_view(self.edit_view),
                name="jobs_job_edit",
            ),
            path(
                "<path:object_id>/backfill/",
                self.admin_site.admin_view(self.backfill_view),
                name="jobs_job_backfill",
            ),
            path(
                "<path:object_id>/edit-preview/",
                self.admin_site.admin_view(self.edit_preview_view),
                name="jobs_job_edit_preview",
            ),
        ]
        return extra + super().get_urls()

    def operate_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        """Pause / resume / trigger from the job page: GET says what will happen, POST does it."""
        if operation not in console.OPERATIONS:
            raise Http404(f"no operation {operation!r}")
        job = self.get_object(request, object_id)
        if job is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_change_permission(request, job):
            raise PermissionDenied
        change_url = reverse("admin:jobs_job_change", args=[job.pk])
        catch_up = request.POST.get("catch_up", request.GET.get("catch_up", "none"))
        if catch_up not in dict(console.CATCH_UP_CHOICES):
            choices = ", ".join(dict(console.CATCH_UP_CHOICES))
            return HttpResponseBadRequest(f"catch_up: must be one of {choices}")
        if request.method == "POST":
            message = self._operate(request, job=job, operation=operation, catch_up=catch_up)
            self.log_change(request, job, message)
            self.message_user(request, message, messages.SUCCESS)
            return HttpResponseRedirect(change_url)
        now = db.now()
        if operation == "resume":
            options = [
                (value, label, console.plan(job=job, operation="resume", catch_up=value, now=now))
                for value, label in console.CATCH_UP_CHOICES
            ]
        else:
            options = []
        context = {
            **self.admin_site.each_context(request),
            "title": f"{operation.capitalize()} {job.name}?",
            "opts": self.opts,
            "original": job,
            "job": job,
            "operation": operation,
            "plan": console.plan(job=job, operation=operation, catch_up=catch_up, now=now),
            "options": options,
            "catch_up": catch_up,
            "change_url": change_url,
        }
        return TemplateResponse(request, "admin/jobs/job/operate_confirm.html", context)

    def backfill_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return backfill.backfill_view(self, request, object_id)

    def _operate(self, request: HttpRequest, *, job: Job, operation: str, catch_up: str) -> str:
        if operation == "pause":
            was = job.paused
            services.pause_job(job=job, actor=actor_of(request))
            return "The job was already paused." if was else "Paused: no slot fires until it is resumed."
        if operation == "resume":
            was = job.paused
            job = services.resume_job(job=job, catch_up=catch_up, actor=actor_of(request))
            if not was:
                return "The job was not paused."
            nxt = console.when(job.next_run_at, job, now=db.now())
            return f"Resumed (catch-up: {catch_up}); next run {nxt}."
        at = services.trigger_job(job=job, actor=actor_of(request))
        return f"Queued a manual run at {in_zone(at, job.time_zone)}."

    def preview_view(self, request: HttpRequest) -> JsonResponse:
        """Fire times of the schedule being edited (the live preview on the change form)."""
        if not self.has_view_or_change_permission(request):
            return JsonResponse({"error": "forbidden"}, status=403)
        cron = request.GET.get("cron_expr", "").strip() or None
        interval_text = request.GET.get("interval_seconds", "").strip()
        interval = (
            (int(interval_text) if interval_text.isdigit() else interval_text) if interval_text else None
        )
        zone = request.GET.get("time_zone", "").strip() or "UTC"
        try:
            policy = _policy_param(request.GET)
            cron, interval = check_preview_schedule(
                cron=cron,
                interval_seconds=interval,
                timezone=zone,
                dst_policy=policy,
            )
        except JobInvalid as exc:
            # The page shows one line: the first problem found.
            return JsonResponse({"error": next(iter(exc.errors.values()))[0]}, status=400)
        except ValueError as exc:  # the DST menus' values
            return JsonResponse({"error": str(exc)}, status=400)
        now = timezone.now().replace(microsecond=0)  # whole seconds, as create_job anchors an interval
        return JsonResponse(
            preview(
                cron=cron,
                timezone=zone,
                interval_seconds=interval,
                after=now,
                count=PREVIEW_COUNT,
                dst_policy=policy,
            )
        )

    def edit_preview_view(self, request: HttpRequest, object_id: str) -> JsonResponse:
        """What saving the posted change form would do ("Preview changes"): the form judged
        as Save judges it, then the PATCH dry run's answer (jobs/edit_preview.py); no write."""
        if request.method != "POST":
            return JsonResponse({"error": "POST the change form"}, status=405)
        job = self.get_object(request, object_id)
        if job is None:
            return JsonResponse({"error": "no such job"}, status=404)
        if not self.has_change_permission(request, job):
            return JsonResponse({"error": "forbidden"}, status=403)
        # The form writes its cleaned values into its instance: give it a copy of its own.
        form = self.get_form(request, job, change=True)(
            request.POST, instance=self.get_object(request, object_id)
        )
        if not form.is_valid():
            return JsonResponse(
                {"errors": {k: [str(m) for m in v] for k, v in form.errors.items()}}, status=400
            )
        try:
            preview = edit_preview.preview_edit(job=job, changes=form.job_changes(), now=db.now())
        except JobInvalid as exc:
            return JsonResponse({"errors": exc.errors}, status=400)
        return JsonResponse(change_preview.panel_json(preview))

    # --- the delete confirmation ---------------------------------------------

    def get_deleted_objects(self, objs, request: HttpRequest):
        jobs = list(objs)
        allowed = all(self.has_delete_permission(request, job) for job in jobs)
        label = capfirst(Job._meta.verbose_name)
        to_delete = [
            format_html(
                '{}: <a href="{}">{}</a>', label, reverse("admin:jobs_job_change", args=[job.pk]), job
            )
            for job in jobs
        ]
        # Counts by the rows' own key (partition_id, job_id): one index read per shard.
        keys = {
            "partition_id__in": {job.partition_id for job in jobs},
            "job_id__in": [job.pk for job in jobs],
        }
        model_count = {Job._meta.verbose_name_plural: len(jobs)}
        for model in (JobRun, Misfire, SlotRange):
            count = model.objects.filter(**keys).count() if jobs else 0
            if count:
                model_count[model._meta.verbose_name_plural] = count
        return to_delete, model_count, set() if allowed else {Job._meta.verbose_name}, []
