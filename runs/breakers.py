"""Circuit breakers and retry budgets per target host (docs/CONTRACT.md, "Execution").

State lives in `target_hosts`, one row per scheme://host:port, shared by every
executor. Two short transactions touch it, each locking the rows of the hosts it
needs in host order (so they never deadlock) and deciding in Python from the
database clock:

- `admit`, right after a claim: which claimed HTTP runs may be sent now. A run for
  an open host, or a retry over its host's budget, is put back (`defer`) before any
  call, with `not_before` at the next probe time / budget window; the deferral
  counts in `job_runs.deferrals`, so it consumes no attempt (attempts used =
  attempt - deferrals; the attempt number itself still only grows: it is the fence).
- `record`, after the outcomes are written: failures open the breaker, a success
  closes it.

The decisions are pure functions of (state, runs, now, policy), tested directly.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from urllib.parse import urlsplit

from runs import per_partition

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

UP = "up"  # the host answered (2xx, or a 4xx: it is up, the request was wrong)
DOWN = "down"  # connect error, timeout, 5xx, 429, 408, 425

BUDGET_WINDOW = timedelta(minutes=1)
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Policy:
    failures: int = 5  # consecutive failures within `window_seconds` open the breaker
    window_seconds: float = 30.0
    cooldown_seconds: float = 5.0  # first wait before a probe, doubling ...
    max_cooldown_seconds: float = 60.0  # ... up to this
    max_defer_seconds: float = 3600.0  # a run deferred longer goes back to normal retries
    retry_budget_ratio: float = 0.2  # retries at most this share of a host's requests a minute
    retry_budget_floor: int = 10  # retries a minute always allowed

    @classmethod
    def from_settings(cls) -> Policy:
        from django.conf import settings

        return cls(
            failures=settings.EXECUTOR_CIRCUIT_FAILURES,
            window_seconds=settings.EXECUTOR_CIRCUIT_WINDOW_SECONDS,
            cooldown_seconds=settings.EXECUTOR_CIRCUIT_COOLDOWN_SECONDS,
            max_cooldown_seconds=settings.EXECUTOR_CIRCUIT_MAX_COOLDOWN_SECONDS,
            max_defer_seconds=settings.EXECUTOR_CIRCUIT_MAX_DEFER_SECONDS,
            retry_budget_ratio=settings.EXECUTOR_RETRY_BUDGET_RATIO,
            retry_budget_floor=settings.EXECUTOR_RETRY_BUDGET_FLOOR,
        )


@dataclass(frozen=True)
class HostState:
    host: str
    state: str = CLOSED
    failures: int = 0
    failure_window_start: datetime | None = None
    opened_at: datetime | None = None
    open_until: datetime | None = None
    cooldown_seconds: float = 0.0
    window_start: datetime | None = None
    requests: int = 0
    retries: int = 0


@dataclass(frozen=True)
class Candidate:
    """A claimed HTTP run asking to be sent."""

    key: tuple  # (job_id, scheduled_at, attempt)
    host: str
    is_retry: bool  # its target failed an attempt before (runs/inflight.is_retry)
    deferred_since: datetime | None
    attempts_left: int = 1  # after this one; a probe goes to the run that can best afford to fail
    partition_id: int = field(kw_only=True)  # where a deferral writes (one partition per statement)


@dataclass(frozen=True)
class Deferral:
    key: tuple
    until: datetime
    reason: str


@dataclass
class Admission:
    send: list[tuple] = field(default_factory=list)
    defer: list[Deferral] = field(default_factory=list)


# Cached: each HTTP run's host is needed twice (admission, then the call's outcome), and
# a job's URL is the same at every run; urlsplit was 1-2% of the executor's CPU.
@lru_cache(maxsize=4096)
def host_key(url: str) -> str | None:
    """scheme://host:port of a URL, the breaker's unit; None if it has no host."""
    try:
        parts = urlsplit(url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:
        return None
    if not parts.hostname or not port:
        return None
    return f"{parts.scheme.lower()}://{parts.hostname.lower()}:{port}"


def _hms(moment: datetime | None) -> str:
    return moment.strftime("%H:%M:%S") if moment else "?"


def decide_admission(
    states: dict[str, HostState], candidates: Sequence[Candidate], *, now: datetime, policy: Policy
) -> tuple[Admission, dict[str, HostState]]:
    """Which candidates go out now; the host states after counting them."""
    admission = Admission()
    states = dict(states)
    probes: dict[str, Candidate] = {}
    for c in candidates:
        if c.host not in probes or c.attempts_left > probes[c.host].attempts_left:
            probes[c.host] = c
    for c in candidates:
        h = states[c.host]
        if h.window_start is None or now - h.window_start >= BUDGET_WINDOW:
            h = replace(h, window_start=now, requests=0, retries=0)
        overdue = (
            c.deferred_since is not None
            and (now - c.deferred_since).total_seconds() > policy.max_defer_seconds
        )
        if h.state != CLOSED and not overdue:
            if h.open_until is not None and h.open_until <= now and probes.get(c.host) is c:
                # The one probe of this cool-down; until it reports, others wait a cool-down more.
                h = replace(h, state=HALF_OPEN, open_until=now + timedelta(seconds=h.cooldown_seconds))
            else:
                states[c.host] = h
                admission.defer.append(
                    Deferral(
                        c.key,
                        h.open_until or now,
                        f"deferred: {c.host} circuit open since {_hms(h.opened_at)}",
                    )
                )
                continue
        elif c.is_retry and not overdue:
            allowed = max(policy.retry_budget_floor, policy.retry_budget_ratio * h.requests)
            if h.retries >= allowed:
                states[c.host] = h
                admission.defer.append(
                    Deferral(
                        c.key,
                        h.window_start + BUDGET_WINDOW,
                        f"deferred: retry budget of {c.host} spent ({h.retries} retries of"
                        f" {h.requests} requests this minute)",
                    )
                )
                continue
        # Requests are counted as they answer (apply_outcomes); retries as they are let
        # through, so one batch cannot overspend the budget.
        states[c.host] = replace(h, retries=h.retries + int(c.is_retry))
        admission.send.append(c.key)
    return admission, states


def apply_outcomes(
    states: dict[str, HostState], outcomes: Sequence[tuple[str, str]], *, now: datetime, policy: Policy
) -> dict[str, HostState]:
    """Host states after these (host, UP|DOWN) outcomes, in order."""
    states = dict(states)
    for host, outcome in outcomes:
        h = states[host]
        if h.window_start is None or now - h.window_start >= BUDGET_WINDOW:
            h = replace(h, window_start=now, requests=0, retries=0)
        h = replace(h, requests=h.requests + 1)
        if outcome == UP:
            h = replace(
                h, state=CLOSED, failures=0, failure_window_start=None, opened_at=None, open_until=None
            )
        elif h.state == HALF_OPEN:
            cooldown = min(max(h.cooldown_seconds, policy.cooldown_seconds) * 2, policy.max_cooldown_seconds)
            h = replace(
                h, state=OPEN, cooldown_seconds=cooldown, open_until=now + timedelta(seconds=cooldown)
            )
        elif h.state == CLOSED:
            fresh = h.failure_window_start is None or (
                (now - h.failure_window_start).total_seconds() > policy.window_seconds
            )
            failures = 1 if fresh else h.failures + 1
            h = replace(h, failures=failures, failure_window_start=now if fresh else h.failure_window_start)
            if failures >= policy.failures:
                h = replace(
                    h,
                    state=OPEN,
                    opened_at=now,
                    cooldown_seconds=policy.cooldown_seconds,
                    open_until=now + timedelta(seconds=policy.cooldown_seconds),
                )
        # OPEN: a failure of a call sent before it opened says nothing new.
        states[host] = h
    return states


# --- SQL ---------------------------------------------------------------------------------

_COLUMNS = (
    "host, state, failures, failure_window_start, opened_at, open_until, cooldown_seconds,"
    " window_start, requests, retries"
)

# Create-or-lock in one statement: DO UPDATE locks an existing row as FOR UPDATE
# would, and RETURNING gives the row either way. Hosts come sorted: locks in host order.
_LOCK_SQL = f"""
INSERT INTO target_hosts AS t (host, state, failures, cooldown_seconds, requests, retries, updated_at)
SELECT h, 'closed', 0, 0, 0, 0, now() FROM unnest(%s::text[]) WITH ORDINALITY AS u(h, n) ORDER BY n
ON CONFLICT (host) DO UPDATE SET host = t.host
RETURNING {_COLUMNS}, now()
"""

# The common case, read without a lock or a transaction: hosts that are not closed.
_UNHEALTHY_SQL = "SELECT host FROM target_hosts WHERE host = ANY(%s::text[]) AND state <> 'closed'"

_SAVE_SQL = """
UPDATE target_hosts t SET
    state = x.state, failures = x.failures, failure_window_start = x.failure_window_start,
    opened_at = x.opened_at, open_until = x.open_until, cooldown_seconds = x.cooldown_seconds,
    window_start = x.window_start, requests = x.requests, retries = x.retries, updated_at = now()
FROM jsonb_to_recordset(%s::jsonb) AS x(
    host text, state text, failures integer, failure_window_start timestamptz, opened_at timestamptz,
    open_until timestamptz, cooldown_seconds float8, window_start timestamptz, requests integer,
    retries integer)
WHERE t.host = x.host
"""

# Put a claimed run back untouched by a call: the status it was claimed from (a run
# that has used an attempt was retrying), one more deferral so the attempt the claim
# took is not counted as used. Fenced like every write of an attempt. One partition per
# statement on Citus (runs/per_partition.py), and the database's time as a parameter:
# Citus refuses now() inside a COALESCE in a distributed UPDATE (runs/claims.py).
_DEFER_SQL = per_partition.Forms.of(
    """
UPDATE job_runs r SET
    status = CASE WHEN r.attempt - r.deferrals > 1 THEN 'retrying' ELSE 'queued' END,
    deferrals = r.deferrals + 1,
    deferred_since = coalesce(r.deferred_since, %(now)s),
    not_before = x.until,
    lease_until = NULL,
    last_error = x.reason
FROM jsonb_to_recordset(%(rows)s::jsonb) AS x(partition_id smallint, job_id uuid, scheduled_at timestamptz,
                                               attempt integer, until timestamptz, reason text)
WHERE r.partition_id {partition_filter} AND r.partition_id = x.partition_id
  AND r.job_id = x.job_id AND r.scheduled_at = x.scheduled_at
  AND r.attempt = x.attempt AND r.status = 'running'
RETURNING r.job_id
"""
)


def _encode(states: dict[str, HostState]) -> str:
    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return json.dumps(
        [
            {
                "host": h.host,
                "state": h.state,
                "failures": h.failures,
                "failure_window_start": iso(h.failure_window_start),
                "opened_at": iso(h.opened_at),
                "open_until": iso(h.open_until),
                "cooldown_seconds": h.cooldown_seconds,
                "window_start": iso(h.window_start),
                "requests": h.requests,
                "retries": h.retries,
            }
            for h in states.values()
        ]
    )


async def _locked_states(conn, hosts: list[str]) -> tuple[dict[str, HostState], datetime]:
    cursor = await conn.execute(_LOCK_SQL, [hosts])
    rows = await cursor.fetchall()
    return {row[0]: HostState(*row[:10]) for row in rows}, rows[0][10]


async def admit(conn, candidates: Sequence[Candidate], *, policy: Policy) -> Admission:
    """Decide and record which candidates are sent; defer the others (one transaction)."""
    if not candidates:
        return Admission()
    hosts = sorted({c.host for c in candidates})
    if not any(c.is_retry for c in candidates):
        # First attempts to closed hosts need no budget and no lock: one plain read. A
        # breaker opening right after it lets this batch through, as if claimed a moment
        # earlier; the next batch sees it.
        cursor = await conn.execute(_UNHEALTHY_SQL, [hosts])
        if not await cursor.fetchall():
            return Admission(send=[c.key for c in candidates])
    async with conn.transaction():
        states, now = await _locked_states(conn, hosts)
        admission, states = decide_admission(states, candidates, now=now, policy=policy)
        await conn.execute(_SAVE_SQL, [_encode(states)])
        partition_of = {c.key: c.partition_id for c in candidates}
        await per_partition.run(
            conn,
            _DEFER_SQL,
            per_partition.group((partition_of[d.key], (partition_of[d.key], d)) for d in admission.defer),
            lambda deferrals: {"now": now, "rows": _encode_deferrals(deferrals)},
        )
    return admission


async def put_back(conn, runs: Sequence[tuple[int, tuple]], *, reason: str) -> int:
    """Put claimed runs, (partition_id, (job_id, scheduled_at, attempt)), back untouched by
    a call, as a deferral does: due now, the attempt the claim took not counted as used.
    Returns how many were still this attempt's to put back (fenced like every write)."""
    if not runs:
        return 0
    now = datetime.now(UTC)
    rows = await per_partition.run(
        conn,
        _DEFER_SQL,
        per_partition.group((p, (p, Deferral(key, now, reason))) for p, key in runs),
        lambda deferrals: {"now": now, "rows": _encode_deferrals(deferrals)},
    )
    return len(rows)


def _encode_deferrals(deferrals: Sequence[tuple[int, Deferral]]) -> str:
    """(partition_id, deferral) pairs as the rows of _DEFER_SQL."""
    return json.dumps(
        [
            {
                "partition_id": partition_id,
                "job_id": str(d.key[0]),
                "scheduled_at": d.key[1].isoformat(),
                "attempt": d.key[2],
                "until": d.until.isoformat(),
                "reason": d.reason,
            }
            for partition_id, d in deferrals
        ]
    )


# What apply_outcomes makes of answers only (no DOWN), whatever the state: the budget
# window restarts if it is over, `requests` grows by the answers, and the breaker is
# closed with no failures. One statement, no transaction around it: the row lock lasts
# the statement, not four round trips, so executors writing outcomes to one host do not
# queue behind each other. The database clock comes in through the rows (`excluded`),
# not as now() beside a column in SET (Citus refuses that, see _DEFER_SQL).
_ANSWERED_SQL = """
INSERT INTO target_hosts AS t
    (host, state, failures, cooldown_seconds, window_start, requests, retries, updated_at)
SELECT h, 'closed', 0, 0, now(), n, 0, now()
FROM unnest(%(hosts)s::text[], %(answers)s::integer[]) AS u(h, n) ORDER BY h
ON CONFLICT (host) DO UPDATE SET
    state = 'closed', failures = 0, failure_window_start = NULL, opened_at = NULL, open_until = NULL,
    window_start = CASE WHEN t.window_start IS NULL OR excluded.window_start - t.window_start >= %(window)s
                        THEN excluded.window_start ELSE t.window_start END,
    requests = CASE WHEN t.window_start IS NULL OR excluded.window_start - t.window_start >= %(window)s
                    THEN excluded.requests ELSE t.requests + excluded.requests END,
    retries = CASE WHEN t.window_start IS NULL OR excluded.window_start - t.window_start >= %(window)s
                   THEN 0 ELSE t.retries END,
    updated_at = excluded.updated_at
"""


async def record(conn, outcomes: Sequence[tuple[str, str]], *, policy: Policy) -> None:
    """Fold (host, UP|DOWN) outcomes into the hosts' breakers (one transaction).

    Answers only (the steady state: every write batch of a healthy host) take one
    statement, _ANSWERED_SQL; a failure among them takes the locked read-decide-write
    of apply_outcomes, whose order of events matters.
    """
    if not outcomes:
        return
    if all(outcome == UP for _, outcome in outcomes):
        answers = Counter(host for host, _ in outcomes)
        hosts = sorted(answers)
        params = {"hosts": hosts, "answers": [answers[h] for h in hosts], "window": BUDGET_WINDOW}
        await conn.execute(_ANSWERED_SQL, params)
        return
    hosts = sorted({host for host, _ in outcomes})
    async with conn.transaction():
        states, now = await _locked_states(conn, hosts)
        states = apply_outcomes(states, outcomes, now=now, policy=policy)
        await conn.execute(_SAVE_SQL, [_encode(states)])
