"""Calling a run's target: `http` (aiohttp) or `task` (the runs.tasks registry).

Each call returns a retry.CallResult; deciding what happens next is runs/execution/retry.py's job.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial

import aiohttp
from aiohttp.abc import ResolveResult

from runs import tasks
from runs.errors import PermanentError
from runs.execution import retry, signing
from runs.execution.netguard import address_refusal, literal_refusal, parse_ip_host, refusal_message
from runs.keys import format_utc, run_key
from runs.rows import ClaimedRun

DEFAULT_TIMEOUT_SECONDS = 30
DEFAULT_TASK_TIMEOUT_SECONDS = 300
USER_AGENT = "Cronyard/1.0"

log = logging.getLogger(__name__)


class RefusedAddress(OSError):
    """The connector was about to dial an address the SSRF guard refuses."""


class GuardedConnector(aiohttp.TCPConnector):
    """A TCPConnector that refuses non-public addresses unless private targets are allowed.

    The check sits in the connector, not in a resolver: aiohttp never asks the resolver
    about IP-literal hosts, but every host, literal or name, passes `_resolve_host`,
    whose answer is what gets dialled (no second lookup to race, so no DNS rebinding).
    `_wrap_create_connection` re-checks the exact addresses handed to the socket
    layer, so a cached or future code path that skips `_resolve_host` still cannot
    connect. Both are aiohttp internals (pinned in requirements.txt);
    tests/test_ssrf.py fails if an upgrade renames them.
    """

    def __init__(self, *, allow_private: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self._allow_private = allow_private

    async def _resolve_host(self, host: str, port: int, traces=None) -> list[ResolveResult]:
        # A host aiohttp reads as an address is not looked up: judged as written, in
        # any spelling, and refused for good when it cannot be dialled at all.
        problem = literal_refusal(host, allow_private=self._allow_private)
        if problem is not None:
            raise RefusedAddress(problem)
        results = await super()._resolve_host(host, port, traces=traces)
        if self._allow_private:
            return results
        refused = {r["host"]: address_refusal(r["host"]) for r in results}
        allowed = [r for r in results if refused[r["host"]] is None]
        if not allowed:
            reason = next(iter(refused.values()), None) or f"'{host}' resolves to no address"
            if parse_ip_host(host) is None:
                reason = f"'{host}' resolves to {', '.join(sorted(refused))}: {reason}"
            raise RefusedAddress(refusal_message(reason))
        return allowed

    async def _wrap_create_connection(self, *args, addr_infos, req, timeout, **kwargs):
        if not self._allow_private:
            for info in addr_infos:
                reason = address_refusal(info[4][0])
                if reason is not None:
                    error = kwargs.get("client_error", aiohttp.ClientConnectorError)
                    raise error(req.connection_key, RefusedAddress(refusal_message(reason)))
        return await super()._wrap_create_connection(
            *args, addr_infos=addr_infos, req=req, timeout=timeout, **kwargs
        )


def make_session(*, concurrency: int, allow_private: bool) -> aiohttp.ClientSession:
    """One session (one connection pool) per executor, shared by all its calls."""
    connector = GuardedConnector(
        allow_private=allow_private,
        limit=max(concurrency, 1),
        limit_per_host=0,
        ttl_dns_cache=10,
    )
    # trust_env=False: a proxy from the environment would dial the target for us,
    # out of reach of the connector's address check.
    return aiohttp.ClientSession(connector=connector, trust_env=False, headers={"User-Agent": USER_AGENT})


def trace_id(key: str) -> str:
    """32 hex digits, stable for a run key: every attempt of a run is one trace."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    # The W3C spec forbids an all-zero trace id; sha256 making one is 2**-128, but be exact.
    return digest if digest.strip("0") else "1" * 32


def run_headers(run: ClaimedRun) -> dict[str, str]:
    key = run_key(run.job_id, run.scheduled_at)
    return {
        "Idempotency-Key": key,
        "X-Run-Attempt": str(run.attempt),
        "X-Job-Id": str(run.job_id),
        "X-Scheduled-At": format_utc(run.scheduled_at),
        "traceparent": f"00-{trace_id(key)}-{span_id()}-01",
        signing.ID_HEADER: signing.message_id(key, run.attempt),
    }


def span_id() -> str:
    """16 hex digits, never all zero (W3C). Unique, not secret: Python's generator, not
    the system's (secrets.token_hex reads os.urandom, 3 % of the executor's CPU per HTTP
    run in py-spy)."""
    return f"{random.getrandbits(64) or 1:016x}"


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
    # No address check here: GuardedConnector judges every address it dials, with the
    # host as aiohttp parsed it (a pre-check on the raw string is what Unicode hosts,
    # fullwidth or circled digits that yarl maps to 127.0.0.1, slipped past).
    # `allow_private` is enforced by the session's GuardedConnector (make_session).
    headers = {str(k): str(v) for k, v in (target.get("headers") or {}).items()}
    data = _body(target, headers)
    # After the target's own: a target stored before the executor's names were reserved
    # may name one in another case, and the session keeps the later of two spellings
    # (tests/test_signed_calls.py checks that each signature header goes out once).
    headers.update(run_headers(run))
    headers.update(
        signing.signature_headers(
            message_id=headers[signing.ID_HEADER],
            timestamp=int(now().timestamp()),
            body=data or b"",
            secrets=run.signing_secrets,
        )
    )
    timeout = aiohttp.ClientTimeout(total=float(target.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS))
    try:
        async with session.request(
            (target.get("method") or "POST").upper(),
            url,
            headers=headers,
            data=data,
            timeout=timeout,
            # Never follow: the tenant gets the 3xx, and a Location cannot steer us anywhere.
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
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, RefusedAddress):
            # Permanent: the URL will not change by waiting, and nothing was sent or
            # read, so the error carries no response data, only why we refused.
            return retry.CallResult(retry.PERMANENT, error=retry.truncate(f"refused target: {exc.os_error}"))
        if not isinstance(exc, aiohttp.ClientConnectorDNSError):
            return retry.CallResult(retry.RETRY, error=retry.truncate(f"{type(exc).__name__}: {exc}"))
        return retry.CallResult(retry.RETRY, error=retry.truncate(f"DNS error: {exc}"))
    except TimeoutError:
        return retry.CallResult(retry.RETRY, error=f"timed out after {timeout.total:g}s")
    except aiohttp.InvalidURL as exc:
        return retry.CallResult(retry.PERMANENT, error=f"invalid URL: {exc}")
    except (aiohttp.ClientError, OSError) as exc:
        return retry.CallResult(retry.RETRY, error=retry.truncate(f"{type(exc).__name__}: {exc}"))
    except ValueError as exc:
        # The request cannot even be built from the stored target (aiohttp refuses a
        # header value with a control character): waiting changes nothing.
        return retry.CallResult(retry.PERMANENT, error=retry.truncate(f"invalid request: {exc}"))


async def call_task(run: ClaimedRun) -> retry.CallResult:
    target = run.target
    name = target.get("name", "")
    fn = tasks.get(name)
    if fn is None:
        # The web process accepted the name, so it is registered there: this executor
        # runs with other EXECUTOR_TASK_MODULES (a rolling deploy, a missing module).
        # Retryable: another executor, or this one redeployed, can run it; the caller
        # alerts with the task's name (Executor._execute).
        error = f"unknown task '{name}': not registered in this executor (check EXECUTOR_TASK_MODULES)"
        return retry.CallResult(retry.RETRY, error=error, missing_task=str(name))
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
