"""The rules of a job's target (`{"type": "http", ...}` or `{"type": "task", ...}`):
defaults filled in, every problem reported at once, and nothing jsonb cannot store.

An HTTP target's URL is judged as the executor's guarded connector will dial it
(runs.execution.netguard); a task must be registered in this process's registry (runs.tasks).
"""

from __future__ import annotations

import json
import re
from typing import Any

from jobs.rules.fields import NAME_MAX, is_int
from jobs.rules.nesting import MAX_VALUE_NESTING, nesting, too_deep_message
from runs import tasks
from runs.execution import signing
from runs.execution.netguard import UnsafeTarget, check_url

TARGET_MAX_BYTES = 64 * 1024
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
TARGET_TYPES = ("http", "task")
TIMEOUT_RANGE = (1, 300)
# Tasks are the operator's own code (reports, exports) and may legitimately run for
# long; the bound only has to stop a hung one from holding a slot forever.
TASK_TIMEOUT_RANGE = (1, 86_400)
TASK_TIMEOUT_DEFAULT = 300

# The executor sets these on every request; a job must not forge the run key or the
# signature (runs/execution/signing.py).
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
        *signing.HEADERS,
    }
)
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# What aiohttp refuses in a header value when it writes the request ("Forbidden control
# character", aiohttp/http_writer.py, after RFC 9110 section 5.5): every C0 control but
# tab, and DEL. Accepted here, every run of the job would die of it.
_HEADER_VALUE_FORBIDDEN_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_TASK_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:[.:][A-Za-z_][A-Za-z0-9_]*)*$")
_HTTP_KEYS = frozenset({"type", "url", "method", "headers", "body", "timeout_seconds", "secret_headers"})
_TASK_KEYS = frozenset({"type", "name", "kwargs", "timeout_seconds"})


def check_target(target: Any, *, allow_private: bool) -> dict:
    """Return the target with defaults filled in, or raise ValueError with all problems."""
    if not isinstance(target, dict):
        raise ValueError('Target must be an object with a "type" of "http" or "task".')
    # First: what follows (and the audit log, jsonb, every run's copy) walks the values
    # recursively. Every key is bounded, not only body and kwargs, which need the depth.
    deep = [
        # The key as UTF-8 can carry it (a lone surrogate cannot be answered).
        f"{str(key).encode(errors='replace').decode()}: {too_deep_message(MAX_VALUE_NESTING)}"
        for key, value in target.items()
        if nesting(value, limit=MAX_VALUE_NESTING) > MAX_VALUE_NESTING
    ]
    if deep:
        raise ValueError(*deep)
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
            if not isinstance(value, str):
                problems.append(f"headers: the value of {key!r} must be a string.")
            elif _HEADER_VALUE_FORBIDDEN_RE.search(value):
                problems.append(
                    f"headers: the value of {key!r} contains a control character (only tab is allowed)."
                )
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
    if not is_int(timeout) or not lo <= timeout <= hi:
        problems.append(f"timeout_seconds: must be a whole number between {lo} and {hi}.")
    return timeout
