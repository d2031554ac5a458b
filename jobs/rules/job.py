"""The rules a job must satisfy as a whole, shared by the REST API and the admin form
(both through jobs/rules/edits.py): `validate_job` runs the single-field rules
(jobs/rules/fields.py) and the target rules (jobs/rules/target.py), then the rules
that tie fields together (one trigger, backoff cap, jitter against the schedule's
shortest gap, the start/end window).

Everything works on *model* field names (`cron_expr`, `time_zone`, ...); the API
renames the keys of the error dict for its own field names. Type parsing (is it an
integer, a datetime) is the caller's job; these functions judge values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from jobs.models import MisfirePolicy, OverlapPolicy
from jobs.rules.fields import (
    RANGES,
    check_cron,
    check_dst_policy,
    check_int,
    check_interval,
    check_name,
    check_starting_deadline,
    check_zone,
    is_int,
)
from jobs.rules.target import check_target
from jobs.schedule import jitter

TRIGGER_FIELDS = ("cron_expr", "interval_seconds", "run_at")
# The fields each trigger kind (jobs.models.TriggerType) reads: the zone and the DST policy
# shape only a cron schedule's wall times; interval and one-time jobs ignore them.
TRIGGER_KIND_FIELDS = {
    "cron": ("cron_expr", "time_zone", "dst_policy"),
    "interval": ("interval_seconds",),
    "run_at": ("run_at",),
}
# Error key for "none or several of cron / interval_seconds / run_at".
SCHEDULE_KEY = "schedule"


class JobInvalid(ValueError):
    """`errors` maps a model field name (or SCHEDULE_KEY) to a list of messages."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__(errors)
        self.errors = errors


def _add(errors: dict[str, list[str]], field: str, message: str) -> None:
    errors.setdefault(field, []).append(message)


def validate_job(
    values: Mapping[str, Any],
    *,
    now: datetime,
    allow_private: bool,
    changed: Iterable[str] | None = None,
    job_id: UUID | None = None,
) -> dict[str, Any]:
    """Check a job's complete state; return it cleaned (target defaults, trimmed name/cron).

    `values` holds every field (for an edit: the stored job merged with the changes).
    `changed` names the fields the request sets (None = all, a create): "in the
    future" is only demanded of times the request sets, so renaming a finished
    one-time job still works. Raises JobInvalid with every problem found.
    """
    changed = set(values) if changed is None else set(changed)
    errors: dict[str, list[str]] = {}
    clean = dict(values)

    def run(field: str, check, *args, **kwargs) -> None:
        if field not in values:
            return
        try:
            clean[field] = check(values[field], *args, **kwargs)
        except ValueError as exc:
            for message in exc.args:
                _add(errors, field, str(message))

    run("name", check_name)
    run("time_zone", check_zone)
    run("dst_policy", check_dst_policy)
    for field in RANGES:
        run(field, lambda v, f=field: check_int(f, v))
    run("starting_deadline_seconds", check_starting_deadline)
    if "misfire_policy" in values and values["misfire_policy"] not in MisfirePolicy.values:
        _add(
            errors, "misfire_policy", f"Unknown misfire policy; use one of {', '.join(MisfirePolicy.values)}."
        )
    if "overlap_policy" in values and values["overlap_policy"] not in OverlapPolicy.values:
        _add(
            errors, "overlap_policy", f"Unknown overlap policy; use one of {', '.join(OverlapPolicy.values)}."
        )
    if "target" in values:
        run("target", check_target, allow_private=allow_private)
    _check_backoff(clean, errors)
    _check_trigger(values, clean, errors, now=now, changed=changed, job_id=job_id)
    _check_jitter(values, clean, errors, now=now, job_id=job_id)
    _check_window(clean, errors, now=now, changed=changed)
    if errors:
        raise JobInvalid(errors)
    return clean


def _check_backoff(clean: dict, errors: dict) -> None:
    base, cap = clean.get("retry_backoff_seconds"), clean.get("retry_backoff_cap_seconds")
    fields_ok = "retry_backoff_seconds" not in errors and "retry_backoff_cap_seconds" not in errors
    if fields_ok and is_int(base) and is_int(cap) and cap < base:
        _add(errors, "retry_backoff_cap_seconds", "The backoff cap must be at least retry_backoff_seconds.")


def _check_trigger(values: Mapping, clean: dict, errors: dict, *, now, changed: set, job_id) -> None:
    present = [f for f in TRIGGER_FIELDS if values.get(f) not in (None, "")]
    if len(present) != 1:
        shown = ["cron" if f == "cron_expr" else f for f in present]
        got = f" (got {', '.join(shown)})" if present else ""
        _add(errors, SCHEDULE_KEY, f"Set exactly one of cron, interval_seconds or run_at{got}.")
        return
    field = present[0]
    if field == "cron_expr":
        zone = clean.get("time_zone", "UTC") if "time_zone" not in errors else "UTC"
        policy = clean.get("dst_policy") if "dst_policy" not in errors else None
        try:
            clean["cron_expr"] = check_cron(values["cron_expr"], zone=zone, job_id=job_id, dst_policy=policy)
        except ValueError as exc:
            _add(errors, "cron_expr", str(exc))
    elif field == "interval_seconds":
        try:
            clean["interval_seconds"] = check_interval(values["interval_seconds"])
        except ValueError as exc:
            _add(errors, "interval_seconds", str(exc))
    elif "run_at" in changed and values["run_at"] <= now:
        _add(errors, "run_at", "run_at is in the past; a one-time job must be in the future.")


def _check_jitter(values: Mapping, clean: dict, errors: dict, *, now: datetime, job_id) -> None:
    """0 <= jitter_seconds <= the schedule's shortest gap (jobs.schedule.jitter.shortest_gap).

    Judged on every validation, not only when jitter changes: shortening the schedule
    under an existing jitter would let one slot's run start after the next slot's.
    """
    if "jitter_seconds" not in values:
        return
    value = values["jitter_seconds"]
    if not is_int(value) or not 0 <= value <= jitter.JITTER_MAX_SECONDS:
        _add(errors, "jitter_seconds", f"Must be a whole number between 0 and {jitter.JITTER_MAX_SECONDS}.")
        return
    if value == 0 or any(f in errors for f in (*TRIGGER_FIELDS, SCHEDULE_KEY, "time_zone")):
        return  # no schedule to measure; its own error is reported
    gap = jitter.shortest_gap(
        cron=clean.get("cron_expr") or None,
        timezone=clean.get("time_zone") or "UTC",
        interval_seconds=clean.get("interval_seconds"),
        job_id=job_id,
        now=now,
        dst_policy=clean.get("dst_policy"),
    )
    if gap is not None and value > gap:
        _add(
            errors,
            "jitter_seconds",
            f"At most the schedule's shortest gap between fire times, {gap} seconds (got {value}).",
        )


def _check_window(clean: dict, errors: dict, *, now, changed: set) -> None:
    start, end = clean.get("start_at"), clean.get("end_at")
    if start is not None and end is not None and end <= start:
        _add(errors, "end_at", "end_at must be later than start_at.")
    elif end is not None and "end_at" in changed and end <= now:
        _add(errors, "end_at", "end_at is in the past; the job would never fire.")
