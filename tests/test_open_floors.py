"""Open floors (runs/open_floors.py): per tenant, no open run is older than its floor.
Writers that open old runs lower it in their transaction, the upkeep raises it with a
compare-and-set, and the claim on Citus reads running runs from it, guarded against a
floor lowered since the claimer read it. The claim tests take the per-shard path
(`per_partition_forms` on plain PostgreSQL; on a Citus cluster it is the only one)."""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection

from jobs.tenant_services import create_tenant
from runs import open_floors, services
from runs.execution import claims, connections, fair_share, turns
from runs.execution.executor import Executor
from runs.models import JobRun, JobRunRow
from scheduler_project.citus import by_node
from tests.support import citus_workers
from tests.support.executor import queue_runs, set_turn, task_target

pytestmark = pytest.mark.django_db(transaction=True)


def _floor(tenant) -> tuple[datetime | None, int]:
    """The tenant's floor (None for '-infinity') and its version."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nullif(open_floor, '-infinity'), open_floor_version FROM tenants WHERE id = %s",
            [tenant.id],
        )
        return cursor.fetchone()


def _set_floor(tenant, floor: datetime) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tenants SET open_floor = %s WHERE id = %s", [floor, tenant.id])


async def _on_new_conn(step):
    conn = await connections.connect_async(connections.database_conninfo())
    try:
        return await step(conn)
    finally:
        await conn.close()


def _keep() -> int:
    return asyncio.run(_on_new_conn(open_floors.keep))


def _cap() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute(open_floors.FLOOR_CAP)
        return cursor.fetchone()[0]


def _days_ago(days: float) -> datetime:
    return datetime.now(UTC).replace(microsecond=0) - timedelta(days=days)


def test_queuing_an_old_run_lowers_its_tenants_floor_and_a_recent_one_writes_nothing():
    tenant, _ = create_tenant(slug="floors-queue")
    created = _floor(tenant)
    queue_runs(tenant, task_target("noop"))  # five minutes ago
    assert _floor(tenant) == created
    old = _days_ago(9)
    queue_runs(tenant, task_target("noop"), start=old)
    assert _floor(tenant) == (old, 1)


def test_replays_lower_the_floor_even_below_it():
    tenant, _ = create_tenant(slug="floors-replay")
    [(job_a, slot_a)] = queue_runs(tenant, task_target("noop"), start=_days_ago(6))
    [(job_b, slot_b)] = queue_runs(tenant, task_target("noop"), start=_days_ago(7))
    JobRunRow.objects.filter(tenant_id=tenant.id).update(status="dead")
    _keep()  # nothing open: raised to the cap
    assert _floor(tenant)[0] == _cap()
    services.replay_run(job_id=job_a, scheduled_at=slot_a, actor="test")
    assert _floor(tenant)[0] == slot_a
    _, version = _floor(tenant)
    ids = list(JobRun.objects.filter(job_id=job_b).values_list("id", flat=True))
    services.replay_runs(ids=ids, actor="test")
    # Counted even where the floor moves little: the upkeep's compare-and-set needs it.
    assert _floor(tenant) == (slot_b, version + 1)


def test_the_upkeep_sets_each_floor_to_its_oldest_open_run_at_most_the_cap():
    old_runs, recent_runs, idle, new, new_idle = (
        create_tenant(slug=f"floors-{n}")[0] for n in ("old", "recent", "idle", "new", "new-idle")
    )
    slot = _days_ago(5)
    queue_runs(old_runs, task_target("noop"), start=slot)
    queue_runs(old_runs, task_target("noop"), start=_days_ago(8))
    JobRunRow.objects.filter(tenant_id=old_runs.id, scheduled_at__lt=slot).update(status="succeeded")
    queue_runs(recent_runs, task_target("noop"), count=3)
    queue_runs(new, task_target("noop"), count=3)
    _set_floor(old_runs, datetime.now(UTC))  # above its open run: set right, not left
    _set_floor(recent_runs, _days_ago(20))  # below its open runs and the cap: raised
    _set_floor(idle, _days_ago(20))
    # A new tenant's floor, a day before its creation, is above the cap and below every
    # open run, if it has any: right as it is. Lowering it would cost every claimer that
    # read it a claim.
    created = _floor(new), _floor(new_idle)
    assert created[0][0] > _cap() and created[1][0] > _cap()
    assert _keep() == 3
    assert _floor(old_runs)[0] == slot
    assert _floor(recent_runs)[0] == _floor(idle)[0] == _cap()
    assert (_floor(new), _floor(new_idle)) == created
    assert _keep() == 0


class _WriterBetween:
    """An upkeep connection on which, just after the upkeep read the open runs, another
    session reopens an old run and lowers its tenant's floor, and commits."""

    def __init__(self, conn, reopen):
        self.conn = conn
        self.reopen = reopen

    async def execute(self, sql, params=None):
        cursor = await self.conn.execute(sql, params)
        if sql == open_floors.OLDEST_OPEN_PER_TENANT:
            self.reopen()
        return cursor

    def __getattr__(self, name):
        return getattr(self.conn, name)


def test_the_upkeep_leaves_a_floor_a_writer_lowered_after_its_reads():
    tenant, _ = create_tenant(slug="floors-race")
    [(job_id, slot)] = queue_runs(tenant, task_target("noop"), start=_days_ago(10))
    JobRunRow.objects.filter(tenant_id=tenant.id).update(status="dead")
    below = _days_ago(20)
    _set_floor(tenant, below)  # the upkeep would raise it to the cap: nothing is open

    def reopen() -> None:
        with psycopg.connect(connections.database_conninfo()) as other:
            other.execute(
                "UPDATE job_runs SET status = 'queued' WHERE job_id = %s AND scheduled_at = %s",
                [job_id, slot],
            )
            open_floors.lower(other.cursor(), [(tenant.id, slot)])

    # The upkeep read no open run for the tenant: without the version's check it would
    # raise the floor to the cap, above the run reopened meanwhile.
    asyncio.run(_on_new_conn(lambda conn: open_floors.keep(_WriterBetween(conn, reopen))))
    assert _floor(tenant)[0] == below
    _keep()
    assert _floor(tenant)[0] == slot


def test_the_upkeep_never_lowers_a_floor_it_meant_to_raise():
    tenant, _ = create_tenant(slug="floors-raised")
    _set_floor(tenant, _days_ago(20))  # nothing open: the upkeep raises it to the cap
    higher = _cap() + timedelta(hours=6)

    def raise_it() -> None:  # another upkeep, which read after this one
        with psycopg.connect(connections.database_conninfo()) as other:
            other.execute("UPDATE tenants SET open_floor = %s WHERE id = %s", [higher, tenant.id])

    asyncio.run(_on_new_conn(lambda conn: open_floors.keep(_WriterBetween(conn, raise_it))))
    assert _floor(tenant)[0] == higher


def _replay(**key) -> None:
    """A replay on a thread's own Django connection, closed after it."""
    try:
        services.replay_run(**key, actor="test")
    finally:
        connection.close()


async def _warm(planner: fair_share.Planner, conn) -> None:
    """Read the work map and the tenants' limits (their floors) as a claim would."""
    placements = await planner.placements.read_async(conn, list(range(planner.partition_count())))
    nodes = by_node(placements)
    for node, partitions in nodes.items():
        await planner.refresh(conn, node, partitions, aging_seconds=claims.DEFAULT_AGING_SECONDS)
    await planner.limits(conn, planner.groups(nodes), refresh=True)


async def _claim(conn, planner: fair_share.Planner, owner: str, limit: int) -> list:
    return await claims.claim_runs(
        conn, owner=owner, limit=limit, planner=planner, holds=claims.Holds(owner=owner)
    )


def test_a_stale_claimer_never_runs_a_second_run_of_a_skip_job(per_partition_forms, monkeypatch):
    # A stale claimer read the tenant's floor (a day before its creation) before a replay reopened an old
    # run of a skip job below it, and another claimer set that run running. The stale
    # claimer's read of running runs starts at its floor and cannot see that run: its
    # claim must take nothing of the tenant rather than the job's newer run.
    monkeypatch.setattr(fair_share, "MAP_SECONDS", 3600.0)  # the stale map serves
    tenant, _ = create_tenant(slug="floors-skip", max_concurrency=100)
    job_id = uuid.uuid4()
    skip = {"job_id": job_id, "overlap_policy": "skip"}
    [(_, old)] = queue_runs(tenant, task_target("noop"), start=_days_ago(5), **skip)
    JobRunRow.objects.filter(job_id=job_id).update(status="dead")
    queue_runs(tenant, task_target("noop"), **skip)

    async def race() -> tuple[list, list]:
        stale_conn = await connections.connect_async(connections.database_conninfo())
        fresh_conn = await connections.connect_async(connections.database_conninfo())
        try:
            stale = fair_share.Planner()
            await _warm(stale, stale_conn)
            await asyncio.to_thread(_replay, job_id=job_id, scheduled_at=old)
            first = await _claim(fresh_conn, fair_share.Planner(), "fresh", limit=1)
            second = await _claim(stale_conn, stale, "stale", limit=5)
            return first, second
        finally:
            await stale_conn.close()
            await fresh_conn.close()

    first, second = asyncio.run(race())
    assert [run.scheduled_at for run in first] == [old]
    assert second == []
    assert JobRun.objects.filter(job_id=job_id, status="running").count() == 1


def test_a_run_below_its_tenants_floor_waits_for_the_upkeep_to_set_the_floor_right(per_partition_forms):
    # A run opened below the floor by a writer that did not lower it (none does: this
    # test writes the floor by hand) is not set running, and the next upkeep finds it.
    tenant, _ = create_tenant(slug="floors-heal")
    [(_, slot)] = queue_runs(tenant, task_target("noop"), start=_days_ago(4))
    _set_floor(tenant, _days_ago(1))

    async def claim() -> list:
        return await _on_new_conn(lambda conn: _claim(conn, fair_share.Planner(), "healer", limit=5))

    assert asyncio.run(claim()) == []
    _keep()
    assert [run.scheduled_at for run in asyncio.run(claim())] == [slot]


@pytest.mark.skipif(not os.environ.get("CRONYARD_CITUS_WORKERS"), reason="a make test-citus test")
def test_the_upkeep_raises_no_floor_while_a_transaction_is_prepared_on_a_worker(monkeypatch):
    # A writer commits on the coordinator (its version and floor visible there) before its
    # run commits on the worker (two-phase commit): while it is prepared there, the
    # upkeep's read of open runs cannot see the run. Here the floor was lowered and the
    # run is not visible; a transaction stays prepared on a worker meanwhile.
    monkeypatch.setattr(open_floors, "PREPARED_WAIT_SECONDS", 0.5)
    tenant, _ = create_tenant(slug="floors-prepared")
    slot = _days_ago(6)
    with connection.cursor() as cursor:
        open_floors.lower(cursor, [(tenant.id, slot)])
    worker = citus_workers.connect(citus_workers.workers()[0])
    try:
        worker.execute("BEGIN")
        worker.execute("SELECT txid_current()")
        worker.execute("PREPARE TRANSACTION 'cronyard-test-open-floors'")
        try:
            _keep()
            assert _floor(tenant)[0] == slot
        finally:
            worker.execute("ROLLBACK PREPARED 'cronyard-test-open-floors'")
    finally:
        worker.close()
    _keep()  # nothing prepared any more: raised to the cap
    assert _floor(tenant)[0] == _cap()


@pytest.fixture
def no_turn_taken():
    """upkeep_turns has no model: the database flush between tests leaves its rows."""
    set_turn(turns.OPEN_FLOORS, None)
    yield
    set_turn(turns.OPEN_FLOORS, None)


def test_one_executor_runs_the_upkeep_per_interval_whatever_their_number(monkeypatch, no_turn_taken):
    # The upkeep reads every open run of every shard: each executor asks for the turn,
    # and only the first to ask once the interval has passed runs it.
    ran = []

    async def keep(conn) -> int:
        ran.append(conn)
        return 0

    monkeypatch.setattr(open_floors, "keep", keep)

    async def ask_at_once() -> list[bool]:
        executors = [Executor(conninfo=connections.database_conninfo(), concurrency=1) for _ in range(4)]
        for executor in executors:
            await executor.open()
        try:
            return sorted(await asyncio.gather(*(executor.keep_floors_once() for executor in executors)))
        finally:
            for executor in executors:
                await executor.close()

    assert asyncio.run(ask_at_once()) == [False, False, False, True]
    assert len(ran) == 1
    assert asyncio.run(ask_at_once()) == [False] * 4  # the turn is not over
    set_turn(turns.OPEN_FLOORS, "now()")
    assert asyncio.run(ask_at_once()) == [False, False, False, True]
    # A turn further ahead than the interval (the coordinator's clock went back) is over.
    set_turn(turns.OPEN_FLOORS, "now() + interval '1 day'")
    assert asyncio.run(ask_at_once()) == [False, False, False, True]
    assert len(ran) == 3


def test_a_dispatch_batch_commits_its_old_slots_apart_from_the_rest(monkeypatch):
    # An old slot lowers its tenant's floor, which on Citus writes every worker's copy of
    # tenants: its job goes in a transaction of its own, so that a worker out of reach
    # fails only it (tests/test_citus_worker_down.py has the outage).
    from jobs.dispatch.scheduler import Scheduler
    from jobs.services import partition_for
    from tests.conftest import database_url
    from tests.support.scheduler import make_job

    tenant, _ = create_tenant(slug="split-batch")
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    fresh = make_job(tenant, next_run_at=now, name="fresh")
    two_days_ago = now - timedelta(days=2)
    # In fresh's partition, so that both are in one dispatch batch on either engine: on
    # Citus a batch holds the partitions of one worker, and two batches commit once each
    # whether or not old slots go apart.
    same_partition = next(u for u in iter(uuid.uuid4, None) if partition_for(u) == fresh.partition_id)
    old = make_job(
        tenant,
        id=same_partition,
        next_run_at=two_days_ago,
        run_at=two_days_ago,
        name="old",
        misfire_policy="catch_up",
    )
    commits = []
    commit = Scheduler._commit

    def recorded(self, snap, plans, **kwargs):
        commits.append(sorted(p.job.name for p in plans))
        return commit(self, snap, plans, **kwargs)

    monkeypatch.setattr(Scheduler, "_commit", recorded)
    # A threshold far above a minute: `fresh` must not turn into a misfire if the next
    # minute begins before the step.
    sched = Scheduler(
        node_id="split",
        conninfo=database_url(),
        heartbeat_thread=False,
        maintain_partitions=False,
        misfire_threshold_seconds=3600,
    )
    try:
        sched.step()
    finally:
        sched.close()

    assert commits == [["fresh"], ["old"]]
    assert set(JobRun.objects.filter(job_id=fresh.id).values_list("scheduled_at", flat=True)) == {now}
    assert set(JobRun.objects.filter(job_id=old.id).values_list("scheduled_at", flat=True)) == {two_days_ago}
    assert _floor(tenant)[0] == two_days_ago
