"""The read-only panels of a job's admin page: its schedule in words, its next fire
times, its last outcome, recent runs and recent occurrences (the ledger)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from jobs import activity
from jobs.describe import describe_job, fire_time_json, job_fire_times
from jobs.display import in_zone, relative
from jobs.models import Job
from runs.admin_html import status_pill
from runs.keys import format_utc
from runs.selectors import dispatch_note

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


class JobPagePanels:
    """Mixed into JobAdmin; each panel is a read-only field of its fieldsets."""

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

    @admin.display(description="last outcome")
    def last_outcome(self, job: Job) -> str:
        run = activity.last_finished(job=job)
        if run is None:
            return "No finished run yet."
        return format_html(
            '{} <a href="{}">{}</a> ({}){}',
            status_pill(run.status),
            reverse("admin:runs_jobrun_change", args=[run.pk]),
            format_utc(run.scheduled_at),
            relative(run.finished_at, now=timezone.now()),
            f" — {activity.excerpt(run.last_error)}" if run.last_error and run.status != "succeeded" else "",
        )

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
        rows = format_html_join(
            "",
            '<tr data-run="{}"><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
            "<td>{}</td></tr>",
            (
                (
                    run.pk,
                    reverse("admin:runs_jobrun_change", args=[run.pk]),
                    format_utc(run.scheduled_at),
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
            '<table class="cronyard-runs"><thead><tr><th>scheduled at (UTC)</th><th>status</th>'
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
        rows = format_html_join(
            "",
            '<tr data-outcome="{}"><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    o.outcome,
                    format_utc(o.scheduled_at),
                    in_zone(o.scheduled_at, job.time_zone),
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
            '<table class="cronyard-occurrences"><thead><tr><th>slot (UTC)</th><th>job zone</th>'
            "<th>outcome</th><th>reason</th><th></th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )
