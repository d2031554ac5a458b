"""The job's read view: what opening a job shows (`/admin/jobs/job/<id>/change/`, where
every link to a job lands). The job at a glance, its schedule in words and next fire
times in its own zone, its health, recent runs and ledger occurrences, the target with
its secrets masked, and buttons to act; the change form (`.../edit/`) stays the one
place to edit. Read-only: nothing here writes."""

from __future__ import annotations

from datetime import datetime

from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from jobs.admin.display import in_zone, relative
from jobs.admin.forms import POLICY_FORM_FIELDS, JobAdminForm
from jobs.describe import job_fire_times
from jobs.dispatch import planning
from jobs.models import Job, TriggerType
from runs.admin.html import target_html
from runs.keys import format_utc

FIRE_TIMES_SHOWN = 5


def _label(field: str) -> str:
    """The field's label as the edit form shows it (the API's names where they differ)."""
    return str(JobAdminForm._meta.labels.get(field) or Job._meta.get_field(field).verbose_name)


def _value(value: object) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, datetime):
        return format_utc(value)
    return str(value)


def fire_times_table(job: Job, *, now: datetime) -> SafeString | str:
    """The next fire times on the job's wall clock, the UTC instant beside each, and the
    DST or jitter note where the schedule has one."""
    times = job_fire_times(job, now=now, count=FIRE_TIMES_SHOWN)
    if not times:
        return "No future fire times."
    # A UTC job's wall time is the instant itself: one column, not the same twice.
    utc_column = job.time_zone != "UTC"
    rows = format_html_join(
        "",
        '<tr><td class="cy-wall">{}</td>{}<td class="cy-quiet">{}</td><td class="cy-quiet">{}</td></tr>',
        (
            (
                in_zone(t.utc, job.time_zone),
                format_html("<td><code>{}</code></td>", format_utc(t.utc)) if utc_column else "",
                relative(t.utc, now=now),
                t.note or "",
            )
            for t in times
        ),
    )
    return format_html(
        '<table class="cy-fire-times"><thead><tr><th>{}</th>{}<th></th><th></th></tr></thead>'
        "<tbody>{}</tbody></table>",
        job.time_zone,
        mark_safe("<th>UTC</th>") if utc_column else "",
        rows,
    )


def schedule_rows(job: Job) -> list[tuple[str, str]]:
    """The schedule's own settings beside its words: only those that are set."""
    rows: list[tuple[str, str]] = []
    if job.cron_expr:
        rows += [(_label("cron_expr"), job.cron_expr), (_label("time_zone"), job.time_zone)]
        if job.dst_policy:
            rows.append(("DST", ", ".join(f"{k}: {v}" for k, v in sorted(job.dst_policy.items()))))
    elif job.interval_seconds:
        rows.append((_label("interval_seconds"), str(job.interval_seconds)))
    for field in ("run_at", "start_at", "end_at"):
        if getattr(job, field) is not None:
            rows.append((_label(field), in_zone(getattr(job, field), job.time_zone)))
    if job.jitter_seconds:
        rows.append((_label("jitter_seconds"), f"{job.jitter_seconds} s"))
    return rows


def policy_rows(job: Job) -> list[tuple[str, str]]:
    """Priority and every policy the edit form edits, in its order and with its labels."""
    return [(_label(f), _policy_value(job, f)) for f in ("priority", *POLICY_FORM_FIELDS)]


def _policy_value(job: Job, field: str) -> str:
    if field == "starting_deadline_seconds" and job.starting_deadline_seconds is None:
        # Unset is not "none": the scheduler's global threshold applies, so say which.
        return f"{int(planning.starting_deadline(job).total_seconds())} (SCHEDULER_MISFIRE_THRESHOLD_SECONDS)"
    return _value(getattr(job, field))


def target(job: Job) -> SafeString:
    """The stored target as the API answers it: every secret (secret headers, URL
    password, secret query parameters) shown as "***", for editors and viewers alike."""
    return target_html(job.target)


def read_view(model_admin, request: HttpRequest, object_id: str) -> HttpResponse:
    """GET `.../change/`: the job at a glance, with the buttons its user may press."""
    job = model_admin.get_object(request, unquote(object_id))
    if job is None:
        return model_admin._get_obj_does_not_exist_redirect(request, model_admin.opts, object_id)
    if not model_admin.has_view_or_change_permission(request, job):
        raise PermissionDenied
    now = timezone.now()
    request.current_app = model_admin.admin_site.name
    context = {
        **model_admin.admin_site.each_context(request),
        "title": job.name,
        "opts": model_admin.opts,
        "original": job,
        "job": job,
        "can_change": model_admin.has_change_permission(request, job),
        "can_delete": model_admin.has_delete_permission(request, job),
        "can_backfill": job.run_at is None,
        "state": model_admin.state(job),
        "trigger": TriggerType(job.trigger_type).label,
        "schedule_words": model_admin.schedule_text(job),
        "schedule_rows": schedule_rows(job),
        "next_run": model_admin.next_run(job),
        "fire_times": fire_times_table(job, now=now),
        "load": model_admin.load_at_next_slot(job),
        "last_outcome": model_admin.last_outcome(job),
        "health": model_admin.health_figures(job),
        "target": target(job),
        "policies": policy_rows(job),
        "recent_runs": model_admin.recent_runs(job),
        "recent_runs_title": model_admin.recent_runs.short_description,
        "occurrences": model_admin.recent_occurrences(job),
        "facts": [
            ("id", str(job.pk)),
            ("partition", str(job.partition_id)),
            ("created", in_zone(job.created_at, job.time_zone)),
            ("updated", in_zone(job.updated_at, job.time_zone)),
        ],
    }
    return TemplateResponse(request, "admin/jobs/job/read.html", context)
