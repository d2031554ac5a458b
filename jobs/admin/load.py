"""The job page's word on load: whether the job's next slot falls inside a spike of the
load forecast (jobs/forecast.py), and how its schedule could be spread."""

from __future__ import annotations

from datetime import datetime

from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobs import forecast
from jobs.admin.display import in_zone
from jobs.models import Job
from runs.keys import format_utc


def next_slot_load(job: Job, *, now: datetime) -> SafeString | str:
    """The load of all tenants at the job's next slot: what the schedulers and executors
    will face then (the dashboard's chart, computed at most once a minute)."""
    if job.paused:
        return "Paused: it adds nothing to the load."
    if job.next_run_at is None:
        return "No next slot."
    result = forecast.recent(now=now)
    index = result.window.index_of(job.next_run_at)
    if index is None:
        return "Its next slot is beyond the next 24 h of the load forecast."
    when = f"{in_zone(job.next_run_at, job.time_zone)} ({format_utc(job.next_run_at)})"
    count = result.counts[index]
    spike = result.spike_at(job.next_run_at)
    if spike is None:
        peak = max(result.counts)
        return format_html(
            '<div class="cronyard-load" data-spike="" data-count="{}">Its next slot, {}, is not in a load '
            "spike: {} run{} due that minute (the busiest minute of the next 24 h has {}).</div>",
            count,
            when,
            count,
            "" if count == 1 else "s",
            peak,
        )
    rank = result.spikes.index(spike) + 1
    spread = forecast.spread_for(job.cron_expr) if job.cron_expr else None
    advice = (
        format_html(
            " Its schedule <code>{}</code> could be spread: <code>{}</code> ({}).",
            job.cron_expr,
            spread.suggestion,
            spread.why,
        )
        if spread
        else ""
    )
    return format_html(
        '<div class="cronyard-load" data-spike="{}" data-count="{}" style="border-left:3px solid #cf222e;'
        'padding-left:8px"><strong>Inside a load spike:</strong> its next slot, {}, falls in a minute with '
        "{} runs due, {}&times; the mean of the next 24 h (spike {} of {} on the dashboard).{}</div>",
        rank,
        count,
        when,
        count,
        spike.times_mean,
        rank,
        len(result.spikes),
        advice,
    )
