"""Jobs' health in the console: the jobs list's `health` filter (the status strip's links
land on it) and the job page's health panel, the figures of jobs.health.job_health (the
same the job API's `health` object gives) as a table an operator reads at a glance."""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlencode

from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from jobs import health
from jobs.admin.display import duration_text, moment_html
from jobs.health import HEALTH_WINDOWS, JobHealth, SlotWindow
from jobs.models import Job

WINDOW_TITLES = {"last_24h": "last 24 h", "last_7d": "last 7 days"}


class HealthFilter(admin.SimpleListFilter):
    """Jobs failing or overdue (`?health=`), by the rules the status strip counts by
    (jobs.health): the strip's links land here."""

    title = "health"
    parameter_name = "health"

    def lookups(self, request, model_admin):
        return [("failing", "Failing"), ("overdue", "Overdue")]

    def queryset(self, request, queryset):
        if self.value() == "failing":
            return queryset.filter(health.FAILING)
        if self.value() == "overdue":
            return queryset.filter(health.overdue(now=timezone.now()))
        return queryset


def panel(job: Job, *, figures: JobHealth, now: datetime) -> SafeString:
    streak = format_html(
        '<span class="{}">{}</span> failed attempt{} in a row (alerts at {})',
        "cy-health-bad" if figures.failing else "",
        figures.consecutive_failures,
        "" if figures.consecutive_failures == 1 else "s",
        figures.alert_after_failures,
    )
    overdue = (
        format_html('<span class="cy-health-bad">{} late</span>', duration_text(figures.overdue_seconds))
        if figures.overdue_seconds is not None
        else "no"
    )
    misfires_url = f"{reverse('admin:jobs_misfire_changelist')}?{urlencode({'q': str(job.pk)})}"
    rows = (
        ("consecutive_failures", "failing streak", streak),
        (
            "last_success_at",
            "last success",
            moment_html(figures.last_success_at, now=now, zone=job.time_zone),
        ),
        (
            "last_failure_at",
            "last failure",
            moment_html(figures.last_failure_at, now=now, zone=job.time_zone),
        ),
        ("overdue_seconds", "overdue", overdue),
        (
            "misfire_count",
            "misfires",
            format_html('<a href="{}">{}</a>', misfires_url, figures.misfire_count),
        ),
    )
    facts = format_html_join("", '<tr data-health="{}"><th>{}</th><td>{}</td></tr>', rows)
    windows = [getattr(figures, name) for name, _ in HEALTH_WINDOWS]
    head = format_html_join("", "<th>{}</th>", ((WINDOW_TITLES[name],) for name, _ in HEALTH_WINDOWS))
    lines = (
        ("slots", "slots", [str(w.slots) for w in windows]),
        ("on_time_rate", "on time", [_rate(w) for w in windows]),
        ("lateness_p50_seconds", "start lateness p50", [_seconds(w.lateness_p50_seconds) for w in windows]),
        ("lateness_p99_seconds", "start lateness p99", [_seconds(w.lateness_p99_seconds) for w in windows]),
    )
    body = format_html_join(
        "",
        '<tr data-window-figure="{}"><th>{}</th>{}</tr>',
        (
            (key, label, format_html_join("", "<td>{}</td>", ((cell,) for cell in cells)))
            for key, label, cells in lines
        ),
    )
    return format_html(
        '<div class="cy-health"><table class="cy-health-facts"><tbody>{}</tbody></table>'
        '<table class="cy-health-windows"><thead><tr><th></th>{}</tr></thead><tbody>{}</tbody></table>'
        '<p class="cy-health-note">On time: the run started within {} s of its slot '
        "(the job's starting deadline, else SCHEDULER_MISFIRE_THRESHOLD_SECONDS). "
        "Slots are the schedule's runs (not manual, backfill or "
        "replayed ones); lateness is start &minus; slot, a retried run's latest start.</p></div>",
        facts,
        head,
        body,
        figures.on_time_threshold_seconds,
    )


def _seconds(value: float | None) -> str:
    return duration_text(value)


def _rate(window: SlotWindow) -> str:
    if window.on_time_rate is None:
        return "—"
    return f"{window.on_time_rate * 100:.1f}% ({window.on_time} of {window.slots})"
