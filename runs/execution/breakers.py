"""Circuit breakers and retry budgets per (tenant, target host): their state in
`target_hosts` and the statements that apply runs/execution/breaker_rules.py (docs/CONTRACT.md, "Execution").

One row per tenant and scheme://host:port, shared by every executor, so one tenant's
failing calls never defer another tenant's runs to the same host. Two short
transactions touch it, each locking the rows it needs in key order (so they never
deadlock) and deciding in Python from the database clock:

- `admit`, right after a claim: which claimed HTTP runs may be sent now. A run behind
  an open breaker, or a retry over its breaker's budget, is put back (`defer`) before
  any call, with `not_before` at its next look; the deferral counts in
  `job_runs.deferrals`, so it consumes no attempt (attempts used = attempt - deferrals;
  the attempt number itself still only grows: it is the fence).
- `record`, after the outcomes are written: failures open the breaker, an answer
  closes it.

`prune_idle` (from partition maintenance) deletes rows nobody has used for an hour,
so hosts a tenant tried once do not stay forever.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from runs import attempts, per_partition
from runs.execution.breaker_rules import (
    BUDGET_WINDOW,
    UP,
    Admission,
    BreakerKey,
    Candidate,
    Deferral,
    HostState,
    Policy,
    apply_outcomes,
    decide_admission,
)

# --- SQL ---------------------------------------------------------------------------------

_COLUMNS = (
    "tenant_id, host, state, failures, failure_window_start, opened_at, open_until, cooldown_seconds,"
    " window_start, requests, retries, recovered_at"
)
_WIDTH = 12  # HostState's fields, in _COLUMNS' order

# Create-or-lock in one statement: DO UPDATE locks an existing row as FOR UPDATE
# would, and RETURNING gives the row either way. Keys come sorted: locks in key order.
_LOCK_SQL = f"""
INSERT INTO target_hosts AS t
    (tenant_id, host, state, failures, cooldown_seconds, requests, retries, updated_at)
SELECT k, h, 'closed', 0, 0, 0, 0, now()
FROM unnest(%s::bigint[], %s::text[]) WITH ORDINALITY AS u(k, h, n) ORDER BY n
ON CONFLICT (tenant_id, host) DO UPDATE SET host = t.host
RETURNING {_COLUMNS}, now()
"""

# Read without a lock or a transaction: the batch's breakers that are not closed.
_UNHEALTHY_SQL = """
SELECT t.tenant_id, t.host FROM target_hosts t
JOIN unnest(%s::bigint[], %s::text[]) AS u(k, h) ON t.tenant_id = u.k AND t.host = u.h
WHERE t.state <> 'closed'
"""

# Which of these jobs are paused: their runs never probe. By partition too, so on Citus
# it reads only the shards holding them.
_PAUSED_SQL = """
SELECT id FROM jobs WHERE partition_id = ANY(%s::smallint[]) AND id = ANY(%s::uuid[]) AND paused
"""

_SAVE_SQL = """
UPDATE target_hosts t SET
    state = x.state, failures = x.failures, failure_window_start = x.failure_window_start,
    opened_at = x.opened_at, open_until = x.open_until, cooldown_seconds = x.cooldown_seconds,
    window_start = x.window_start, requests = x.requests, retries = x.retries,
    recovered_at = x.recovered_at, updated_at = now()
FROM jsonb_to_recordset(%s::jsonb) AS x(
    tenant_id bigint, host text, state text, failures integer, failure_window_start timestamptz,
    opened_at timestamptz, open_until timestamptz, cooldown_seconds float8, window_start timestamptz,
    requests integer, retries integer, recovered_at timestamptz)
WHERE t.tenant_id = x.tenant_id AND t.host = x.host
"""

# Put a claimed run back untouched by a call: the status it was claimed from (a run
# that has used an attempt was retrying), one more deferral so the attempt the claim
# took is not counted as used. Fenced like every write of an attempt. One partition per
# statement on Citus (runs/per_partition.py), and the database's time as a parameter:
# Citus refuses now() inside a COALESCE in a distributed UPDATE (runs/execution/claims.py).
_DEFER_SQL = per_partition.Forms.of(
    f"""
UPDATE job_runs r SET
    status = CASE WHEN {attempts.sql_used("r")} > 1 THEN 'retrying' ELSE 'queued' END,
    deferrals = r.deferrals + 1,
    deferred_since = coalesce(r.deferred_since, %(now)s),
    not_before = x.until,
    lease_until = NULL,
    last_error = x.reason
FROM jsonb_to_recordset(%(rows)s::jsonb) AS x(partition_id smallint, job_id uuid, scheduled_at timestamptz,
                                               attempt integer, until timestamptz, reason text)
WHERE r.partition_id {{partition_filter}} AND r.partition_id = x.partition_id
  AND r.job_id = x.job_id AND r.scheduled_at = x.scheduled_at
  AND r.attempt = x.attempt AND r.status = 'running'
RETURNING r.job_id
"""
)


def _encode(states: dict[BreakerKey, HostState]) -> str:
    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return json.dumps(
        [
            {
                "tenant_id": h.tenant_id,
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
                "recovered_at": iso(h.recovered_at),
            }
            for h in states.values()
        ]
    )


async def _locked_states(conn, keys: list[BreakerKey]) -> tuple[dict[BreakerKey, HostState], datetime]:
    cursor = await conn.execute(_LOCK_SQL, [[k for k, _ in keys], [h for _, h in keys]])
    rows = await cursor.fetchall()
    states = [HostState(*row[:_WIDTH]) for row in rows]
    return {h.key: h for h in states}, rows[0][_WIDTH]


async def _paused_jobs(conn, candidates: Sequence[Candidate]) -> set:
    if not candidates:
        return set()
    partitions = sorted({c.partition_id for c in candidates})
    cursor = await conn.execute(_PAUSED_SQL, [partitions, list({c.key[0] for c in candidates})])
    return {row[0] for row in await cursor.fetchall()}


async def admit(conn, candidates: Sequence[Candidate], *, policy: Policy) -> Admission:
    """Decide and record which candidates are sent; defer the others (one transaction)."""
    if not candidates:
        return Admission()
    keys = sorted({c.breaker for c in candidates})
    # One plain read, no lock: first attempts to closed breakers need nothing more. A
    # breaker opening right after it lets this batch through, as if claimed a moment
    # earlier; the next batch sees it.
    cursor = await conn.execute(_UNHEALTHY_SQL, [[k for k, _ in keys], [h for _, h in keys]])
    unhealthy = {(k, h) for k, h in await cursor.fetchall()}
    if not unhealthy and not any(c.is_retry for c in candidates):
        return Admission(send=[c.key for c in candidates])
    # Before the locks: which runs may probe. Only runs of jobs seen unpaused, behind a
    # breaker seen open (one that opened since probes from the next batch).
    paused = await _paused_jobs(conn, [c for c in candidates if c.breaker in unhealthy])
    candidates = [replace(c, can_probe=c.breaker in unhealthy and c.key[0] not in paused) for c in candidates]
    async with conn.transaction():
        states, now = await _locked_states(conn, keys)
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


# What apply_outcomes makes of answers only (no DOWN), whatever the state: the breaker is
# closed with no failures; on a breaker that was not closed the recovery ramp starts with
# a fresh budget minute holding these answers, otherwise the minute restarts if it is over
# and `requests` grows by the answers. One statement, no transaction around it: the row
# lock lasts the statement, not four round trips, so executors writing outcomes to one
# host do not queue behind each other. The database clock comes in through the rows
# (`excluded`), not as now() beside a column in SET (Citus refuses that, see _DEFER_SQL).
_ANSWERED_SQL = """
INSERT INTO target_hosts AS t
    (tenant_id, host, state, failures, cooldown_seconds, window_start, requests, retries, updated_at)
SELECT k, h, 'closed', 0, 0, now(), n, 0, now()
FROM unnest(%(tenants)s::bigint[], %(hosts)s::text[], %(answers)s::integer[]) AS u(k, h, n) ORDER BY k, h
ON CONFLICT (tenant_id, host) DO UPDATE SET
    state = 'closed', failures = 0, failure_window_start = NULL, opened_at = NULL, open_until = NULL,
    recovered_at = CASE WHEN t.state <> 'closed' THEN excluded.window_start ELSE t.recovered_at END,
    window_start = CASE WHEN t.state <> 'closed' OR t.window_start IS NULL
                             OR excluded.window_start - t.window_start >= %(window)s
                        THEN excluded.window_start ELSE t.window_start END,
    requests = CASE WHEN t.state <> 'closed' OR t.window_start IS NULL
                         OR excluded.window_start - t.window_start >= %(window)s
                    THEN excluded.requests ELSE t.requests + excluded.requests END,
    retries = CASE WHEN t.state <> 'closed' OR t.window_start IS NULL
                        OR excluded.window_start - t.window_start >= %(window)s
                   THEN 0 ELSE t.retries END,
    updated_at = excluded.updated_at
"""


async def record(conn, outcomes: Sequence[tuple[BreakerKey, str]], *, policy: Policy) -> None:
    """Fold ((tenant_id, host), UP|DOWN) outcomes into their breakers (one transaction).

    Answers only (the steady state: every write batch of a healthy host) take one
    statement, _ANSWERED_SQL; a failure among them takes the locked read-decide-write
    of apply_outcomes, whose order of events matters.
    """
    if not outcomes:
        return
    if all(outcome == UP for _, outcome in outcomes):
        answers = Counter(key for key, _ in outcomes)
        keys = sorted(answers)
        params = {
            "tenants": [k for k, _ in keys],
            "hosts": [h for _, h in keys],
            "answers": [answers[key] for key in keys],
            "window": BUDGET_WINDOW,
        }
        await conn.execute(_ANSWERED_SQL, params)
        return
    keys = sorted({key for key, _ in outcomes})
    async with conn.transaction():
        states, now = await _locked_states(conn, keys)
        states = apply_outcomes(states, outcomes, now=now, policy=policy)
        await conn.execute(_SAVE_SQL, [_encode(states)])


# A row unused this long is deleted; the next run to its host starts a closed breaker. Its
# budget minute and failure window are long over, and an open breaker nobody came back to
# for an hour (a deferral returns within a cool-down) guards no runs.
IDLE = timedelta(hours=1)
PRUNE_BATCH = 5000

# Batches of idle rows, each its own statement: a row stays locked only while its batch
# is deleted, and rows an executor holds (SKIP LOCKED) are left for the next time.
_PRUNE_SQL = """
DELETE FROM target_hosts t USING (
    SELECT tenant_id, host FROM target_hosts
    WHERE updated_at < now() - %(idle)s AND (open_until IS NULL OR open_until < now() - %(idle)s)
    LIMIT %(batch)s FOR UPDATE SKIP LOCKED
) idle
WHERE t.tenant_id = idle.tenant_id AND t.host = idle.host
"""


def prune_idle(cursor, *, idle: timedelta = IDLE) -> int:
    """Delete the breaker rows no executor has used for `idle` (a Django cursor, outside a
    transaction: each batch commits on its own). Returns how many were deleted."""
    pruned = 0
    while True:
        cursor.execute(_PRUNE_SQL, {"idle": idle, "batch": PRUNE_BATCH})
        pruned += cursor.rowcount
        if cursor.rowcount < PRUNE_BATCH:
            return pruned
