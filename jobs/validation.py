"""The rules a job must satisfy, shared by the REST serializer and the admin form.

Everything works on *model* field names (`cron_expr`, `time_zone`, ...); the API
renames the keys of the error dict for its own field names. Type parsing (is it an
integer, a datetime) is the caller's job; these functions judge values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from jobs import jitter, schedule
from jobs.models import MisfirePolicy, OverlapPolicy
from runs import tasks
from runs.netguard import UnsafeTarget, check_url

NAME_MAX = 200
CRON_MAX = 200
ZONE_MAX = 64
TARGET_MAX_BYTES = 64 * 1024
# Ten years: the same horizon as the cron search; the column is a 32-bit integer.
INTERVAL_MAX = 366 * 24 * 3600 * 10
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
TARGET_TYPES = ("http", "task")
TRIGGER_FIELDS = ("cron_expr", "interval_seconds", "run_at")
# Error key for "none or several of cron / interval_seconds / run_at".
SCHEDULE_KEY = "schedule"
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
TIMEOUT_RANGE = (1, 300)
# Tasks are the operator's own code (reports, exports) and may legitimately run for
# long; the bound only has to stop a hung one from holding a slot forever.
TASK_TIMEOUT_RANGE = (1, 86_400)
TASK_TIMEOUT_DEFAULT = 300

# The executor sets these on every request; a job must not forge the run key.
RESERVED_HEADERS = frozenset(
    {
        "idempotency-key",
        "x-run-attempt",
        "x-job-id",
        "x-scheduled-at",
        "traceparent",
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
    }
)
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_TASK_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:[.:][A-Za-z_][A-Za-z0-9_]*)*$")
_HTTP_KEYS = frozenset({"type", "url", "method", "headers", "body", "timeout_seconds", "secret_headers"})
_TASK_KEYS = frozenset({"type", "name", "kwargs", "timeout_seconds"})


class JobInvalid(ValueError):
    """`errors` maps a model field name (or SCHEDULE_KEY) to a list of messages."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__(errors)
        self.errors = errors


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _add(errors: dict[str, list[str]], field: str, message: str) -> None:
    errors.setdefault(field, []).append(message)


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError("Name is required.")
    if len(name.strip()) > NAME_MAX:
        raise ValueError(f"Name is at most {NAME_MAX} characters (got {len(name.strip())}).")
    return name.strip()


def check_int(field: str, value: Any) -> int:
    lo, hi = RANGES[field]
    if not _is_int(value):
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
    if not _is_int(value):
        raise ValueError("A whole number of seconds is required.")
    if not 1 <= value <= INTERVAL_MAX:
        raise ValueError(f"Must be between 1 and {INTERVAL_MAX} seconds (got {value}).")
    return value


def check_target(target: Any, *, allow_private: bool) -> dict:
    """Return the target with defaults filled in, or raise ValueError with all problems."""
    if not isinstance(target, dict):
        raise ValueError('Target must be an object with a "type" of "http" or "task".')
    bad = _unstorable_text(target)
    if bad:
        # PostgreSQL jsonb cannot hold NUL, and a lone surrogate cannot even be encoded
        # to UTF-8 for the error message; refuse both before anything echoes them.
        raise ValueError(f"{bad}: contains a NUL character or invalid Unicode (a lone surrogate).")
    kind = target.get("type")
    if kind not in TARGET_TYPES:
        raise ValueError(f'Unknown target type {kind!r}; use "http" or "task".')
    problems: list[str] = []
    allowed = _HTTP_KEYS if kind == "http" else _TASK_KEYS
    unknown = sorted(set(target) - allowed)
    if unknown:
        problems.append(f"Unknown {kind} target keys: {', '.join(map(str, unknown))}.")
    clean = (
        _http_target(target, allow_private, problems) if kind == "http" else _task_target(target, problems)
    )
    if not problems:
        size = len(json.dumps(clean, separators=(",", ":"), ensure_ascii=False).encode())
        if size > TARGET_MAX_BYTES:
            problems.append(f"Target is {size} bytes serialized; the limit is {TARGET_MAX_BYTES}.")
    if problems:
        raise ValueError(*problems)
    return clean


def _unstorable_text(value: Any, path: str = "target") -> str | None:
    """Path of the first string (key or value) that jsonb cannot store, if any."""
    if isinstance(value, str):
        if "\x00" in value:
            return path
        try:
            value.encode()
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _unstorable_text(key, path) or _unstorable_text(item, f"{path}.{key}")
            if found:
                return found.encode(errors="replace").decode()
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _unstorable_text(item, f"{path}[{index}]")
            if found:
                return found
    return None


def _http_target(target: dict, allow_private: bool, problems: list[str]) -> dict:
    url = target.get("url")
    if not isinstance(url, str) or not url.strip():
        problems.append("url: required.")
    else:
        url = url.strip()
        try:
            # Judged as the HTTP client will read it (IDNA-mapped by yarl); a name is not
            # resolved here: the executor checks every address it dials at connect time.
            check_url(url, allow_private=allow_private)
        except UnsafeTarget as exc:
            problems.append(f"url: {exc}.")
        except ValueError as exc:  # urlsplit: a port out of range, a malformed IPv6 host
            problems.append(f"url: {exc}.")
    method = target.get("method", "POST")
    if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
        problems.append(f"method: must be one of {', '.join(HTTP_METHODS)}.")
    else:
        method = method.upper()
    headers = target.get("headers") or {}
    if not isinstance(headers, dict):
        problems.append("headers: must be an object of header name to string value.")
    else:
        for key, value in headers.items():
            if not _HEADER_NAME_RE.match(key):
                problems.append(f"headers: {key!r} is not a valid header name.")
            elif key.lower() in RESERVED_HEADERS:
                problems.append(f"headers: {key} is set by the executor and cannot be overridden.")
            if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
                problems.append(f"headers: the value of {key!r} must be a single-line string.")
    secret_headers = target.get("secret_headers")
    if secret_headers is not None and (
        not isinstance(secret_headers, list)
        or not all(isinstance(n, str) and _HEADER_NAME_RE.match(n) for n in secret_headers)
    ):
        problems.append("secret_headers: must be a list of header names whose values are write-only.")
    timeout = _check_timeout(target.get("timeout_seconds", 30), TIMEOUT_RANGE, problems)
    return {
        "type": "http",
        "url": url,
        "method": method,
        "headers": headers,
        "body": target.get("body"),
        "timeout_seconds": timeout,
        # Only when given: targets without it keep their stored shape.
        **({"secret_headers": secret_headers} if secret_headers is not None else {}),
    }


def _task_target(target: dict, problems: list[str]) -> dict:
    name = target.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append("name: the task name is required.")
    elif len(name) > NAME_MAX or not _TASK_NAME_RE.match(name.strip()):
        problems.append(f"name: {name!r} is not a valid task name (dotted identifier).")
    elif tasks.get(name.strip()) is None:
        # Accepting it would only make every run fail: the executors load the same
        # registry (EXECUTOR_TASK_MODULES), GET /api/v1/tasks/ lists it.
        known = ", ".join(tasks.names()) or "none"
        problems.append(f"name: no task {name.strip()!r} is registered (registered: {known}).")
    kwargs = target.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        problems.append("kwargs: must be an object.")
    elif isinstance(name, str) and tasks.get(name.strip()) is not None:
        problems.extend(tasks.kwargs_errors(name.strip(), kwargs))
    timeout = target.get("timeout_seconds", TASK_TIMEOUT_DEFAULT)
    timeout = _check_timeout(timeout, TASK_TIMEOUT_RANGE, problems)
    return {
        "type": "task",
        "name": name.strip() if isinstance(name, str) else name,
        "kwargs": kwargs,
        "timeout_seconds": timeout,
    }


def _check_timeout(timeout: Any, bounds: tuple[int, int], problems: list[str]) -> Any:
    lo, hi = bounds
    if not _is_int(timeout) or not lo <= timeout <= hi:
        problems.append(f"timeout_seconds: must be a whole number between {lo} and {hi}.")
    return timeout


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
    if fields_ok and _is_int(base) and _is_int(cap) and cap < base:
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
    """0 <= jitter_seconds <= the schedule's shortest gap (jobs.jitter.shortest_gap).

    Judged on every validation, not only when jitter changes: shortening the schedule
    under an existing jitter would let one slot's run start after the next slot's.
    """
    if "jitter_seconds" not in values:
        return
    value = values["jitter_seconds"]
    if not _is_int(value) or not 0 <= value <= jitter.JITTER_MAX_SECONDS:
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
