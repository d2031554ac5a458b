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

from runs import per_partition
from runs.execution import queries
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

# HostState's fields, in queries.BREAKER_COLUMNS' order (the lock's rows end with now()).
_WIDTH = 12


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
    cursor = await conn.execute(queries.BREAKERS_LOCK, [[k for k, _ in keys], [h for _, h in keys]])
    rows = await cursor.fetchall()
    states = [HostState(*row[:_WIDTH]) for row in rows]
    return {h.key: h for h in states}, rows[0][_WIDTH]


async def _paused_jobs(conn, candidates: Sequence[Candidate]) -> set:
    if not candidates:
        return set()
    partitions = sorted({c.partition_id for c in candidates})
    cursor = await conn.execute(queries.PAUSED_JOBS, [partitions, list({c.key[0] for c in candidates})])
    return {row[0] for row in await cursor.fetchall()}


async def admit(conn, candidates: Sequence[Candidate], *, policy: Policy) -> Admission:
    """Decide and record which candidates are sent; defer the others (one transaction)."""
    if not candidates:
        return Admission()
    keys = sorted({c.breaker for c in candidates})
    # One plain read, no lock: first attempts to closed breakers need nothing more. A
    # breaker opening right after it lets this batch through, as if claimed a moment
    # earlier; the next batch sees it.
    cursor = await conn.execute(queries.BREAKERS_UNHEALTHY, [[k for k, _ in keys], [h for _, h in keys]])
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
        await conn.execute(queries.BREAKERS_SAVE, [_encode(states)])
        partition_of = {c.key: c.partition_id for c in candidates}
        await per_partition.run(
            conn,
            queries.DEFER,
            per_partition.group((partition_of[d.key], (partition_of[d.key], d)) for d in admission.defer),
            lambda deferrals: _defer_params(deferrals, now=now),
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
        queries.DEFER,
        per_partition.group((p, (p, Deferral(key, now, reason))) for p, key in runs),
        lambda deferrals: _defer_params(deferrals, now=now),
    )
    return len(rows)


def _defer_params(deferrals: Sequence[tuple[int, Deferral]], *, now: datetime) -> dict:
    """queries.DEFER's parameters for (partition_id, deferral) pairs."""
    return {
        **per_partition.window(*(d.key[1] for _, d in deferrals)),
        "now": now,
        "rows": _encode_deferrals(deferrals),
    }


def _encode_deferrals(deferrals: Sequence[tuple[int, Deferral]]) -> str:
    """(partition_id, deferral) pairs as the rows of queries.DEFER."""
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


async def record(conn, outcomes: Sequence[tuple[BreakerKey, str]], *, policy: Policy) -> None:
    """Fold ((tenant_id, host), UP|DOWN) outcomes into their breakers (one transaction).

    Answers only (the steady state: every write batch of a healthy host) take one
    statement, queries.BREAKERS_ANSWERED; a failure among them takes the locked read-decide-write
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
        await conn.execute(queries.BREAKERS_ANSWERED, params)
        return
    keys = sorted({key for key, _ in outcomes})
    async with conn.transaction():
        states, now = await _locked_states(conn, keys)
        states = apply_outcomes(states, outcomes, now=now, policy=policy)
        await conn.execute(queries.BREAKERS_SAVE, [_encode(states)])


# A row unused this long is deleted; the next run to its host starts a closed breaker. Its
# budget minute and failure window are long over, and an open breaker nobody came back to
# for an hour (a deferral returns within a cool-down) guards no runs.
IDLE = timedelta(hours=1)
PRUNE_BATCH = 5000


def prune_idle(cursor, *, idle: timedelta = IDLE) -> int:
    """Delete the breaker rows no executor has used for `idle` (a Django cursor, outside a
    transaction: each batch commits on its own). Returns how many were deleted."""
    pruned = 0
    while True:
        cursor.execute(queries.BREAKERS_PRUNE, {"idle": idle, "batch": PRUNE_BATCH})
        pruned += cursor.rowcount
        if cursor.rowcount < PRUNE_BATCH:
            return pruned
