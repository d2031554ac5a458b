"""Expired leases are reclaimed whatever the executor is doing, and a reclaimed run
with no attempts left is dead, not queued again."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from runs.attempts import history
from runs.execution import claims, connections, turns
from runs.keys import run_key
from tests.conftest import database_url
from tests.support.executor import (
    queue_runs,
    reap_now,
    row,
    set_running,
    set_turn,
    task_target,
    wait_for,
    wait_log,
    wait_status,
)

EXPIRED = timedelta(seconds=-60)
LATER = datetime.now(UTC) + timedelta(days=1)  # not claimable by the executor under test


@pytest.mark.processes
def test_expired_leases_are_reaped_while_every_slot_is_busy(processes, tenant):
    (busy,) = queue_runs(tenant, task_target("sleep", seconds=300))
    proc = processes.start("run_executor", "--concurrency", "1")
    wait_status(busy, "running")
    # Orphans of a dead executor; queued for later first, so the busy one cannot claim them.
    orphan, last_chance = queue_runs(tenant, task_target("noop"), count=2, not_before=LATER, max_attempts=3)
    set_running(orphan, attempt=1, lease=EXPIRED)
    set_running(last_chance, attempt=3, lease=EXPIRED)

    reclaimed = wait_status(orphan, "retrying", timeout=20)
    assert reclaimed.attempt == 1 and reclaimed.lease_until is None
    assert history(reclaimed)[-1]["outcome"] == "lease expired"
    dead = wait_status(last_chance, "dead", timeout=20)
    assert dead.finished_at is not None and "lease expired: attempt 3" in dead.last_error
    wait_log(processes, proc, f'"key": "{run_key(*last_chance)}"')  # the death alert
    # All of that while the only slot stayed busy with the long call.
    assert row(busy).status == "running" and row(busy).attempt == 1


def test_reaper_respects_max_attempts(transactional_db, tenant):
    below, at_max, beyond = queue_runs(tenant, task_target("noop"), count=3, max_attempts=2)
    set_running(below, attempt=1, lease=EXPIRED)
    set_running(at_max, attempt=2, lease=EXPIRED)
    set_running(beyond, attempt=3, lease=EXPIRED)  # a replayed dead run's extra attempt
    reaped = {(r.job_id, r.scheduled_at): r.status for r in reap_now()}
    assert reaped == {below: "retrying", at_max: "dead", beyond: "dead"}
    assert row(below).status == "retrying" and row(below).finished_at is None
    for key in (at_max, beyond):
        run = row(key)
        assert run.status == "dead" and run.finished_at is not None and run.lease_until is None


@pytest.mark.processes
def test_expired_leases_are_reaped_while_a_stalled_claimer_holds_the_tenant_lock(processes, tenant):
    """A claimer stopped inside its claim transaction (SIGSTOP, a frozen VM) holds its
    tenant's claim lock, and every other claim of that tenant waits for it. Reaping
    must not wait with them: the stalled process's runs are the ones to hand back."""
    import psycopg

    waiting = queue_runs(tenant, task_target("noop"), count=3)
    orphan, *_ = queue_runs(tenant, task_target("noop"), not_before=LATER)
    # The stalled claimer: a session with no idle-in-transaction limit, holding the lock.
    with psycopg.connect(database_url(), autocommit=True) as stalled:
        stalled.execute("BEGIN")
        stalled.execute("SELECT pg_advisory_xact_lock(%s, %s)", [claims.TENANT_CLAIM_LOCK, tenant.id])
        proc = processes.start("run_executor", "--concurrency", "4")
        wait_for(
            lambda: lock_waiters(stalled, tenant.id), what="the executor's claim to wait for the tenant lock"
        )
        # Its owner stops heartbeating only now, while the claim waits.
        set_running(orphan, attempt=1, lease=EXPIRED)
        reclaimed = wait_status(orphan, "retrying", timeout=20)
        assert history(reclaimed)[-1]["outcome"] == "lease expired"
        # The executor's claim was waiting on the lock all along.
        assert {row(key).status for key in waiting} == {"queued"}
        stalled.execute("ROLLBACK")
    for key in waiting:
        wait_status(key, "succeeded")
    assert "lease expired: attempt 1" in processes.log_of(proc)


def lock_waiters(conn, tenant_id: int) -> int:
    """Sessions of this database waiting for the tenant's claim lock."""
    sql = """
        SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
        WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()
          AND l.classid = %s::oid AND l.objid = %s::oid AND l.objsubid = 2
    """
    return conn.execute(sql, [claims.TENANT_CLAIM_LOCK, tenant_id]).fetchone()[0]


def test_a_claim_transaction_left_idle_is_ended_by_the_server(transactional_db, tenant, monkeypatch):
    """An executor session idle inside a transaction belongs to a stalled process: the
    server ends it (connections.IDLE_IN_TRANSACTION_SECONDS), freeing its tenant locks
    for the tenant's other claimers."""
    import psycopg

    monkeypatch.setattr(connections, "IDLE_IN_TRANSACTION_SECONDS", 0.5)
    queue_runs(tenant, task_target("noop"), count=2)

    async def scenario() -> int:
        stalled = await connections.connect_async(database_url())
        claimer = await connections.connect_async(database_url())
        try:
            await stalled.execute("BEGIN")
            await stalled.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", [claims.TENANT_CLAIM_LOCK, tenant.id]
            )
            # Without the limit this claim waits for the lock until the statement timeout.
            await claimer.execute("SET statement_timeout = 10000")
            claimed = await claims.claim_runs(claimer, owner="me:1", limit=10)
            # The server's FATAL, or (some libpq versions) the connection found closed.
            with pytest.raises((psycopg.errors.IdleInTransactionSessionTimeout, psycopg.OperationalError)):
                await stalled.execute("SELECT 1")
            return len(claimed)
        finally:
            await claimer.close()
            await stalled.close()

    assert asyncio.run(scenario()) == 2


def test_one_executor_reads_expired_leases_per_interval_whatever_their_number(
    transactional_db, tenant, monkeypatch
):
    # On Citus the read visits every shard: each executor asks for the turn, and only the
    # first to ask once the interval has passed reads.
    from runs.execution import executor as executor_module
    from runs.execution import run_leases
    from runs.execution.executor import Executor

    (orphan,) = queue_runs(tenant, task_target("noop"), not_before=LATER, max_attempts=3)
    set_running(orphan, attempt=1, lease=EXPIRED)
    reads = []
    read = run_leases.reap_expired_leases

    async def counted(conn):
        reads.append(conn)
        return await read(conn)

    monkeypatch.setattr(run_leases, "reap_expired_leases", counted)
    # Long enough that the turn cannot end while four executors open.
    monkeypatch.setattr(executor_module, "REAP_EVERY_SECONDS", 60.0)

    async def ask_at_once() -> list[int]:
        executors = [Executor(conninfo=connections.database_conninfo(), concurrency=1) for _ in range(4)]
        for executor in executors:
            await executor.open()
        try:
            return sorted(len(r) for r in await asyncio.gather(*(e.reap_in_turn() for e in executors)))
        finally:
            for executor in executors:
                await executor.close()

    set_turn(turns.REAPER, None)
    try:
        assert asyncio.run(ask_at_once()) == [0, 0, 0, 1]
        assert len(reads) == 1 and row(orphan).status == "retrying"
        assert asyncio.run(ask_at_once()) == [0, 0, 0, 0] and len(reads) == 1  # the turn is not over
        set_turn(turns.REAPER, "now()")
        asyncio.run(ask_at_once())
        assert len(reads) == 2
    finally:
        set_turn(turns.REAPER, None)


def test_the_reapers_turn_reads_again_while_a_read_is_full(transactional_db, steps, tenant, monkeypatch):
    # After a crash of many executors one read is not enough; the turn hands back every
    # expired lease, not a read's worth per second.
    from runs.execution import run_leases

    orphans = queue_runs(tenant, task_target("noop"), count=3, not_before=LATER, max_attempts=3)
    for key in orphans:
        set_running(key, attempt=1, lease=EXPIRED)
    monkeypatch.setattr(run_leases, "REAP_LIMIT", 2)
    monkeypatch.setattr(run_leases.reap_expired_leases, "__kwdefaults__", {"limit": 2})
    set_turn(turns.REAPER, None)
    try:
        s = steps(concurrency=1)
        assert len(s.run(s.executor.reap_in_turn())) == 3
    finally:
        set_turn(turns.REAPER, None)
    assert {row(key).status for key in orphans} == {"retrying"}
