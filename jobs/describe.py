"""Read-only presentation of schedules for the API and the admin: text and upcoming fire times."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

from cron_descriptor import Options, get_description

from jobs import schedule
from jobs.models import Job
from jobs.rules.fields import check_cron, check_interval, check_zone
from jobs.rules.job import SCHEDULE_KEY, JobInvalid
from runs.keys import format_utc

_UNITS = ((86_400, "day"), (3_600, "hour"), (60, "minute"), (1, "second"))


def describe_interval(seconds: int) -> str:
    for size, unit in _UNITS:
        if seconds % size == 0:
            n = seconds // size
            return f"Every {unit}" if n == 1 else f"Every {n} {unit}s"
    return f"Every {seconds} seconds"


def describe_cron(expr: str, zone: str = "UTC", job_id: UUID | str | None = None) -> str:
    """cron-descriptor on the expanded expression (it knows neither `@daily` nor `H`)."""
    try:
        expanded = schedule.expand_cron(expr, job_id)
        options = Options()
        options.use_24hour_time_format = True
        text = get_description(expanded, options)
    except Exception:
        return expr
    return f"{text} ({zone})"


def describe_schedule(
    *, cron: str | None, timezone: str, interval_seconds: int | None, run_at: datetime | None, job_id=None
) -> str:
    if cron:
        return describe_cron(cron, timezone, job_id)
    if interval_seconds:
        return describe_interval(interval_seconds)
    if run_at:
        return f"Once at {format_utc(run_at)}"
    return ""


def describe_job(job: Job) -> str:
    return describe_schedule(
        cron=job.cron_expr or None,
        timezone=job.time_zone,
        interval_seconds=job.interval_seconds,
        run_at=job.run_at,
        job_id=job.id,
    )


def format_local(moment: datetime) -> str:
    """RFC 3339 with the zone's offset (`2026-03-08T03:00:00-04:00`)."""
    return moment.isoformat(timespec="microseconds" if moment.microsecond else "seconds")


def fire_time_json(fire: schedule.FireTime, *, jitter_seconds: int = 0) -> dict:
    note = _note(fire, jitter_seconds)
    return {"utc": format_utc(fire.utc), "local": format_local(fire.local), "note": note}


def _note(fire: schedule.FireTime, jitter_seconds: int) -> str | None:
    """The DST note, plus the jitter window in local time ("starts 09:00:00-09:00:30", an en dash)."""
    if not jitter_seconds:
        return fire.note
    # Through UTC: local wall arithmetic would be an hour off across a DST change.
    end = (fire.utc + timedelta(seconds=jitter_seconds)).astimezone(fire.local.tzinfo)
    window = f"starts {fire.local:%H:%M:%S}\u2013{end:%H:%M:%S}"
    return f"{fire.note}; {window}" if fire.note else window


def job_fire_times(job: Job, *, now: datetime, count: int) -> list[schedule.FireTime]:
    """The job's next `count` fire times after `now`, inside [start_at, end_at]."""
    after = now
    if job.start_at and job.start_at > after:
        after = job.start_at - timedelta(microseconds=1)
    return schedule.fire_times(
        cron=job.cron_expr or None,
        timezone=job.time_zone,
        interval_seconds=job.interval_seconds,
        run_at=job.run_at,
        anchor=job.next_run_at or job.start_at or now,
        after=after,
        job_id=job.id,
        count=count,
        until=job.end_at,
        dst_policy=job.dst_policy,
    )


def check_preview_schedule(
    *, cron: str | None, interval_seconds: object, timezone: str, dst_policy: dict | None
) -> tuple[str | None, int | None]:
    """The one validator of a schedule to preview (API and admin live preview).

    Returns (cron, interval_seconds) cleaned; raises JobInvalid with every problem
    under model field names. A bad zone still lets the cron be judged (in UTC).
    """
    errors: dict[str, list[str]] = {}
    try:
        check_zone(timezone)
    except ValueError as exc:
        errors["time_zone"] = [str(exc)]
    interval = None
    if (cron is None) == (interval_seconds is None):
        errors[SCHEDULE_KEY] = ["Give exactly one of cron or interval_seconds."]
    elif cron is not None:
        try:
            cron = check_cron(cron, zone="UTC" if errors else timezone, dst_policy=dst_policy)
        except ValueError as exc:
            errors["cron_expr"] = [str(exc)]
    else:
        try:
            interval = check_interval(interval_seconds)
        except ValueError as exc:
            errors["interval_seconds"] = [str(exc)]
    if errors:
        raise JobInvalid(errors)
    return cron, interval


def preview(
    *,
    cron: str | None,
    timezone: str,
    interval_seconds: int | None,
    after: datetime,
    count: int,
    jitter_seconds: int = 0,
    dst_policy: dict | None = None,
) -> dict:
    """Fire times and text of a schedule that is not saved (API preview, admin live preview).

    An interval is anchored at `after`, as a job created at that moment would be.
    """
    times = schedule.fire_times(
        cron=cron,
        timezone=timezone,
        interval_seconds=interval_seconds,
        run_at=None,
        anchor=after,
        after=after,
        count=count,
        dst_policy=dst_policy,
    )
    return {
        "fire_times": [fire_time_json(t, jitter_seconds=jitter_seconds) for t in times],
        "description": describe_schedule(
            cron=cron, timezone=timezone, interval_seconds=interval_seconds, run_at=None
        ),
    }
