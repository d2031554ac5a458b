"""Single-field rules of a job: each judges one value and returns it cleaned, or raises
ValueError with the problems (messages only; jobs.rules.job files them under the field).

Pure: no database. Type parsing (is it an integer, a datetime) is the caller's job.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from jobs import schedule

NAME_MAX = 200
CRON_MAX = 200
ZONE_MAX = 64
# Ten years: the same horizon as the cron search; the column is a 32-bit integer.
INTERVAL_MAX = 366 * 24 * 3600 * 10
DST_POLICY_CHOICES = {"repeated": schedule.DST_REPEATED, "missing": schedule.DST_MISSING}

# (min, max) of every bounded integer field.
RANGES: dict[str, tuple[int, int]] = {
    "max_catch_up": (1, 10_000),
    "max_attempts": (1, 100),
    "retry_backoff_seconds": (0, 86_400),
    "retry_backoff_cap_seconds": (1, 7 * 86_400),
    "lease_seconds": (5, 3_600),
    "priority": (0, 9),
    "alert_after_failures": (1, 1_000),
}


# A job's own misfire threshold (starting_deadline_seconds): at most 7 days, the widest
# window of job health (jobs.health.HEALTH_WINDOWS). A slot counts toward the on-time
# rate once it started or its deadline passed; with a longer deadline an unstarted slot
# would never count inside any window. A slot later than a week is an outage for the
# misfire policy (run_once, skip, catch_up) to decide, not a start to wait for.
STARTING_DEADLINE_MAX = 7 * 86_400


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError("Name is required.")
    if len(name.strip()) > NAME_MAX:
        raise ValueError(f"Name is at most {NAME_MAX} characters (got {len(name.strip())}).")
    return name.strip()


def check_int(field: str, value: Any) -> int:
    lo, hi = RANGES[field]
    if not is_int(value):
        raise ValueError("A whole number is required.")
    if not lo <= value <= hi:
        raise ValueError(f"Must be between {lo} and {hi} (got {value}).")
    return value


def check_zone(name: Any) -> str:
    if not isinstance(name, str) or len(name) > ZONE_MAX:
        raise ValueError("Unknown time zone.")
    try:
        schedule.load_zone(name)
    except schedule.ScheduleError as exc:
        raise ValueError(str(exc)) from None
    return name


def check_dst_policy(value: Any) -> dict:
    """`{"repeated": "first"|"last"|"both", "missing": "shift"|"skip"}`, keys optional.

    Returns only the keys that are set: an absent or null key means Debian cron's rule
    for the job's kind, so the stored value keeps saying "not chosen" (see README, DST).
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError('Must be an object like {"repeated": "first", "missing": "shift"}.')
    problems: list[str] = []
    unknown = sorted(str(key) for key in set(value) - set(DST_POLICY_CHOICES))
    if unknown:
        problems.append(f"Unknown keys: {', '.join(unknown)} (use repeated, missing).")
    clean: dict[str, str] = {}
    for key, choices in DST_POLICY_CHOICES.items():
        item = value.get(key)
        if item is None:
            continue
        if not isinstance(item, str) or item not in choices:
            problems.append(f"{key}: must be one of {', '.join(choices)} or null (got {item!r}).")
        else:
            clean[key] = item
    if problems:
        raise ValueError(*problems)
    return clean


def check_cron(
    expr: Any, *, zone: str = "UTC", job_id: UUID | None = None, dst_policy: dict | None = None
) -> str:
    """Syntax and "does it ever fire" (`0 0 30 2 *` does not), under the job's DST policy."""
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError("A cron expression is required.")
    expr = " ".join(expr.split())
    if len(expr) > CRON_MAX:
        raise ValueError(f"A cron expression is at most {CRON_MAX} characters.")
    try:
        schedule.validate_cron(expr, zone, job_id, dst_policy)
    except schedule.ScheduleError as exc:
        raise ValueError(str(exc)) from None
    return expr


def check_interval(value: Any) -> int:
    if not is_int(value):
        raise ValueError("A whole number of seconds is required.")
    if not 1 <= value <= INTERVAL_MAX:
        raise ValueError(f"Must be between 1 and {INTERVAL_MAX} seconds (got {value}).")
    return value


def check_starting_deadline(value: Any) -> int | None:
    """None (the global SCHEDULER_MISFIRE_THRESHOLD_SECONDS) or 1..STARTING_DEADLINE_MAX seconds."""
    if value is None:
        return None
    if not is_int(value):
        raise ValueError("A whole number of seconds, or null for the global misfire threshold, is required.")
    if not 1 <= value <= STARTING_DEADLINE_MAX:
        raise ValueError(f"Must be between 1 and {STARTING_DEADLINE_MAX} seconds, or null (got {value}).")
    return value
