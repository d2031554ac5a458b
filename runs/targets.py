"""Calling a run's target: `http` (aiohttp) or `task` (the runs.tasks registry).

Each call returns a retry.CallResult; deciding what happens next is runs/retry.py's job.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import secrets
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache, partial

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from runs import retry, tasks
from runs.errors import PermanentError
from runs.keys import format_utc, run_key
from runs.netguard import UnsafeTarget, check_url, is_public_address
from runs.queue import ClaimedRun

DEFAULT_TIMEOUT_SECONDS = 30
DEFAULT_TASK_TIMEOUT_SECONDS = 300
USER_AGENT = "Cronyard/1.0"

log = logging.getLogger(__name__)


class RefusedAddress(OSError):
    """The target's host resolved only to addresses the SSRF guard refuses."""


class GuardedResolver(AbstractResolver):
    """Resolves like aiohttp's default resolver, then drops non-public addresses.

    Filtering the addresses the connector will actually dial (not a separate lookup
    beforehand) is what defeats DNS rebinding: there is no second resolution to race.
    """

    def __init__(self, *, allow_private: bool) -> None:
        self._inner = DefaultResolver()
        self._allow_private = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        if self._allow_private:
            return results
        public = [r for r in results if is_public_address(r["host"])]
        if not public:
            addresses = ", ".join(sorted({r["host"] for r in results}))
            raise RefusedAddress(
                f"'{host}' resolves to {addresses}: loopback/private/link-local targets are not allowed"
            )
        return public

    async def close(self) -> None:
        await self._inner.close()


def make_session(*, concurrency: int, allow_private: bool) -> aiohttp.ClientSession:
    """One session (one connection pool) per executor, shared by all its calls."""
    connector = aiohttp.TCPConnector(
        limit=max(concurrency, 1),
        limit_per_host=0,
        resolver=GuardedResolver(allow_private=allow_private),
        ttl_dns_cache=10,
    )
    # trust_env=False: a proxy from the environment would dial the target for us,
    # out of reach of the resolver's address check.
    return aiohttp.ClientSession(connector=connector, trust_env=False, headers={"User-Agent": USER_AGENT})


@lru_cache(maxsize=4096)
def _refusal(url: str, allow_private: bool) -> str | None:
    """check_url without DNS is a pure function of the URL: judge each URL once."""
    try:
        check_url(url, allow_private=allow_private, resolve=False)
    except UnsafeTarget as exc:
        return f"refused target: {exc}"
    return None


def trace_id(key: str) -> str:
    """32 hex digits, stable for a run key: every attempt of a run is one trace."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    # The W3C spec forbids an all-zero trace id; sha256 making one is 2**-128, but be exact.
    return digest if digest.strip("0") else "1" * 32


def run_headers(run: ClaimedRun) -> dict[str, str]:
    job_id = str(run.job_id)
    scheduled_at = format_utc(run.scheduled_at)
    key = f"{job_id}/{scheduled_at}"  # = run_key(), without formatting twice
    return {
        "Idempotency-Key": key,
        "X-Run-Attempt": str(run.attempt),
        "X-Job-Id": job_id,
        "X-Scheduled-At": scheduled_at,
        "traceparent": f"00-{trace_id(key)}-{secrets.token_hex(8)}-01",
    }


def _body(target: dict, headers: dict[str, str]) -> bytes | None:
    body = target.get("body")
    if body is None:
        return None
    if isinstance(body, str):
        return body.encode()
    if not any(name.lower() == "content-type" for name in headers):
        headers["Content-Type"] = "application/json"
    return json.dumps(body).encode()


async def call_http(
    session: aiohttp.ClientSession, run: ClaimedRun, *, allow_private: bool, now: Callable[[], datetime]
) -> retry.CallResult:
    target = run.target
    url = target.get("url", "")
    # Literal addresses and local names never reach the resolver; judge them here.
    refusal = _refusal(url, allow_private)
    if refusal is not None:
        return retry.CallResult(retry.PERMANENT, error=refusal)
    headers = {str(k): str(v) for k, v in (target.get("headers") or {}).items()}
    data = _body(target, headers)
    headers.update(run_headers(run))
    timeout = aiohttp.ClientTimeout(total=float(target.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS))
    try:
        async with session.request(
            (target.get("method") or "POST").upper(),
            url,
            headers=headers,
            data=data,
            timeout=timeout,
            # A redirect could point at a private literal address that skips the resolver.
            allow_redirects=False,
        ) as response:
            text = await response.content.read(retry.MAX_ERROR_CHARS)
            kind = retry.classify_status(response.status)
            if kind == retry.SUCCESS:
                return retry.CallResult(kind, result_code=response.status)
            error = f"HTTP {response.status}: {text.decode(errors='replace')}"
            if 300 <= response.status < 400:
                location = response.headers.get("Location", "")
                error = f"HTTP {response.status}: redirects are not followed (Location: {location})"
            return retry.CallResult(
                kind,
                result_code=response.status,
                error=retry.truncate(error),
                retry_after=retry.parse_retry_after(response.headers.get("Retry-After"), now()),
            )
    except aiohttp.ClientConnectorDNSError as exc:
        if isinstance(exc.os_error, RefusedAddress):
            return retry.CallResult(retry.PERMANENT, error=f"refused target: {exc.os_error}")
        return retry.CallResult(retry.RETRY, error=retry.truncate(f"DNS error: {exc}"))
    except TimeoutError:
        return retry.CallResult(retry.RETRY, error=f"timed out after {timeout.total:g}s")
    except aiohttp.InvalidURL as exc:
        return retry.CallResult(retry.PERMANENT, error=f"invalid URL: {exc}")
    except (aiohttp.ClientError, OSError) as exc:
        return retry.CallResult(retry.RETRY, error=retry.truncate(f"{type(exc).__name__}: {exc}"))


async def call_task(run: ClaimedRun) -> retry.CallResult:
    target = run.target
    name = target.get("name", "")
    fn = tasks.get(name)
    if fn is None:
        return retry.CallResult(retry.PERMANENT, error=f"unknown task '{name}'")
    context = tasks.TaskContext(
        job_id=run.job_id,
        scheduled_at=run.scheduled_at,
        attempt=run.attempt,
        idempotency_key=run_key(run.job_id, run.scheduled_at),
    )
    kwargs = target.get("kwargs") or {}
    # Targets stored before task timeouts existed have none: they get the default.
    timeout = float(target.get("timeout_seconds") or DEFAULT_TASK_TIMEOUT_SECONDS)
    is_async = inspect.iscoroutinefunction(fn)
    try:
        async with asyncio.timeout(timeout) as deadline:
            if is_async:
                await fn(context, **kwargs)
            else:
                await _in_own_thread(partial(fn, context, **kwargs), name=f"cronyard-task-{name}"[:60])
    except PermanentError as exc:
        return retry.CallResult(retry.PERMANENT, error=retry.truncate(f"PermanentError: {exc}"))
    except TimeoutError as exc:
        if not deadline.expired():  # the task's own TimeoutError (a socket, a lock): a failure like others
            return retry.CallResult(retry.RETRY, error=retry.truncate(f"TimeoutError: {exc}"))
        if is_async:
            return retry.CallResult(retry.RETRY, error=f"task timed out after {timeout:g}s and was cancelled")
        log.warning(
            "task %s (attempt %d of %s) overran its %gs timeout; its thread is abandoned",
            name,
            run.attempt,
            context.idempotency_key,
            timeout,
        )
        return retry.CallResult(
            retry.RETRY,
            error=f"task timed out after {timeout:g}s; its thread was abandoned and its result is ignored",
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return retry.CallResult(retry.RETRY, error=retry.truncate(f"{type(exc).__name__}: {exc}"))
    finally:
        # Timed out, fenced, cancelled or handed back: a sync task still running in its
        # thread can see that this attempt no longer counts and stop (done: a no-op).
        context.cancelled.set()
    return retry.CallResult(retry.SUCCESS)


def _in_own_thread(fn: Callable[[], object], *, name: str) -> asyncio.Future:
    """Run a sync task on a daemon thread of its own; the future has its result.

    Not a pool: a thread cannot be killed, so a task that overruns is abandoned. In a
    pool it would keep a worker forever (starving later tasks) and, being non-daemon,
    keep the executor from exiting. Cancelling the future (timeout, fence, hand-back)
    detaches the thread: whatever it returns later goes nowhere.
    """
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: object, error: Exception | None) -> None:
        if future.done():  # cancelled: this attempt is over, its late result is dropped
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def work() -> None:
        try:
            result, error = fn(), None
        except Exception as exc:
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the event loop is closed: the executor is gone, nobody is waiting

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


async def call(
    run: ClaimedRun,
    *,
    session: aiohttp.ClientSession,
    allow_private: bool,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> retry.CallResult:
    kind = run.target.get("type") if isinstance(run.target, dict) else None
    if kind == "http":
        return await call_http(session, run, allow_private=allow_private, now=now)
    if kind == "task":
        return await call_task(run)
    return retry.CallResult(retry.PERMANENT, error=f"unknown target type {kind!r}")
