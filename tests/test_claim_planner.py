"""fair_share.Planner: a claimer claims again from its last fair-share plan, without
reading a new one, while its claims with it come back full and it is younger than
PLAN_REUSE_SECONDS; a short claim, its age or a forget() (the executor's NOTIFY) make
the next claim read a new one. The claims themselves still decide caps and ranks.
On Citus the planner keeps a work map instead (fair_share.Planner.refresh)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from jobs.tenant_services import create_tenant
from runs.execution import claims, connections, executor, fair_share, queries
from runs.models import JobRun, JobRunRow
from runs.services import replay_run
from tests.support.executor import on_executor_connection, queue_runs, task_target

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def plan_reads(monkeypatch) -> list[int]:
    """The limit of every plan read from the database. The reuse window is a minute, so
    that a slow step of a test (each claim opens a connection) cannot end it."""
    monkeypatch.setattr(fair_share, "PLAN_REUSE_SECONDS", 60.0)
    reads: list[int] = []
    real = fair_share.plan

    async def counting(conn, **kwargs):
        reads.append(kwargs["limit"])
        return await real(conn, **kwargs)

    monkeypatch.setattr(fair_share, "plan", counting)
    return reads


def claim(planner: fair_share.Planner, *, limit: int) -> list:
    """Claim with `planner`, then finish what was claimed (as a quick call would), so the
    tenants' running counts are back where the plan found them."""

    async def go(conn):
        return await claims.claim_runs(conn, owner="me:1", limit=limit, planner=planner)

    claimed = on_executor_connection(go)
    JobRunRow.objects.filter(job_id__in=[r.job_id for r in claimed]).update(status="succeeded")
    return claimed


def backlog(count: int, *, slug: str = "busy"):
    """A tenant with room for 100 running runs and `count` queued no-op runs."""
    tenant, _ = create_tenant(slug=slug, max_concurrency=100)
    queue_runs(tenant, task_target("noop"), count=count)
    return tenant


def test_full_claims_reuse_the_plan_and_a_short_claim_reads_a_new_one(plan_reads):
    backlog(25)
    planner = fair_share.Planner()

    assert len(claim(planner, limit=10)) == 10
    assert len(claim(planner, limit=10)) == 10
    assert plan_reads == [10], "a full claim's plan was not reused"
    assert len(claim(planner, limit=10)) == 5  # short: the plan is dropped
    assert claim(planner, limit=10) == []
    assert plan_reads == [10, 10]


def test_a_reused_plan_leaves_out_a_tenant_due_since_until_it_is_forgotten(plan_reads):
    busy = backlog(40)
    planner = fair_share.Planner()
    assert {r.tenant_id for r in claim(planner, limit=10)} == {busy.id}

    late = backlog(5, slug="late")
    # The plan names the busy tenant only: its claim cannot see the late one's runs.
    assert {r.tenant_id for r in claim(planner, limit=10)} == {busy.id}
    planner.forget()  # what the executor does on a NOTIFY
    fresh = claim(planner, limit=10)
    # Both have nothing running: they share the batch, the late tenant's runs all in it.
    assert sum(r.tenant_id == late.id for r in fresh) == 5
    assert len(plan_reads) == 2


def test_a_plan_older_than_its_reuse_window_is_read_again(plan_reads, monkeypatch):
    backlog(30)
    monkeypatch.setattr(fair_share, "PLAN_REUSE_SECONDS", 0.0)
    planner = fair_share.Planner()
    for _ in range(3):
        assert len(claim(planner, limit=10)) == 10
    assert plan_reads == [10, 10, 10]


def test_a_reused_plan_still_keeps_the_tenant_cap(plan_reads):
    """Caps are counted by the claim under the tenant's lock, whatever plan it was given."""
    capped, _ = create_tenant(slug="capped", max_concurrency=12)  # the cap, not the plan, stops it
    queue_runs(capped, task_target("noop"), count=30)
    planner = fair_share.Planner()
    first = on_executor_connection(
        lambda conn: claims.claim_runs(conn, owner="me:1", limit=10, planner=planner)
    )
    assert len(first) == 10 and plan_reads == [10]
    # Still running: the cap leaves 2, whichever plan the claim uses.
    planner._plan = fair_share.ClaimPlan(planner._plan.partitions, max_rank=1e9, aged=[])
    second = on_executor_connection(
        lambda conn: claims.claim_runs(conn, owner="me:1", limit=10, planner=planner)
    )
    assert len(second) == 2 and plan_reads == [10]
    assert JobRun.objects.filter(tenant_id=capped.id, status="running").count() == 12


def test_a_plan_read_for_a_smaller_batch_is_not_reused_for_a_larger_one(plan_reads):
    backlog(30)
    planner = fair_share.Planner()
    assert len(claim(planner, limit=2)) == 2
    assert len(claim(planner, limit=2)) == 2
    assert len(claim(planner, limit=10)) == 10
    assert plan_reads == [2, 10]


def test_runs_announced_while_a_plan_is_read_make_the_next_claim_read_again(plan_reads, monkeypatch):
    backlog(30)
    planner = fair_share.Planner()
    counting = fair_share.plan

    async def announced_meanwhile(conn, **kwargs):
        planner.forget()  # the executor's listener, between the read's start and its end
        return await counting(conn, **kwargs)

    monkeypatch.setattr(fair_share, "plan", announced_meanwhile)
    assert len(claim(planner, limit=10)) == 10
    monkeypatch.setattr(fair_share, "plan", counting)
    assert len(claim(planner, limit=10)) == 10
    assert plan_reads == [10, 10]


def test_per_partition_claims_take_from_the_work_map_until_it_is_used_up(per_partition_forms, monkeypatch):
    # The Citus claim path (on this plain server, one "worker" named ''): no read of every
    # shard per claim; the map is read once and claimed from until used up, and runs queued
    # since are found after a forget() (the executor's NOTIFY) or MAP_SECONDS.
    monkeypatch.setattr(fair_share, "MAP_SECONDS", 60.0)
    reads: list[str] = []
    real = fair_share.Planner.refresh

    async def counting(self, conn, node, partitions, **kwargs):
        did = await real(self, conn, node, partitions, **kwargs)
        if did:
            reads.append(node)
        return did

    monkeypatch.setattr(fair_share.Planner, "refresh", counting)
    tenant = backlog(25)
    planner = fair_share.Planner()
    assert [len(claim(planner, limit=10)) for _ in range(3)] == [10, 10, 5]
    assert reads == [""], "the map was read again while it still held runs"
    queue_runs(tenant, task_target("noop"), count=4)
    assert len(claim(planner, limit=10)) == 0  # not announced, the map is young
    planner.forget()
    assert len(claim(planner, limit=10)) == 4
    assert reads == ["", ""]


def test_the_work_map_reads_from_its_floor_and_a_notify_naming_an_older_slot_lowers_it(
    per_partition_forms, monkeypatch
):
    # The map reads the days from its floor on (the oldest open slot its last full read
    # saw, at most the start of yesterday), so that Citus plans only those partitions.
    # A run queued in an older day waits until a NOTIFY names its slot (what replays,
    # backfills and catch-ups send), the listener reconnects, or the next full read.
    monkeypatch.setattr(fair_share, "MAP_SECONDS", 60.0)
    tenant = backlog(3)
    planner = fair_share.Planner()
    assert len(claim(planner, limit=10)) == 3  # the first read is a full one
    week_ago = datetime.now(UTC).replace(microsecond=0) - timedelta(days=7)
    queue_runs(tenant, task_target("noop"), count=2, start=week_ago)

    planner.forget()  # announced without its slot: before the floor, not read
    assert claim(planner, limit=10) == []
    planner.forget(oldest=week_ago)
    assert len(claim(planner, limit=10)) == 2

    queue_runs(tenant, task_target("noop"), count=1, start=week_ago - timedelta(days=1))
    planner.forget()
    assert claim(planner, limit=10) == []
    planner.read_all()  # the executor's listener reconnected: NOTIFYs may be lost
    assert len(claim(planner, limit=10)) == 1

    queue_runs(tenant, task_target("noop"), count=1, start=week_ago - timedelta(days=2))
    planner.forget()
    assert claim(planner, limit=10) == []
    monkeypatch.setattr(fair_share, "FULL_READ_SECONDS", 0.0)
    planner.forget()
    assert len(claim(planner, limit=10)) == 1  # the periodic full read finds it


def test_a_replay_announces_the_slot_of_the_run_it_queues_again():
    # What lowers an executor's floor (the test above): the NOTIFY of a replay names the
    # replayed run's slot, read by the executor's listener as it parses it.
    tenant, _ = create_tenant(slug="replayed", max_concurrency=10)
    week_ago = datetime.now(UTC).replace(microsecond=0) - timedelta(days=7)
    [(job_id, slot)] = queue_runs(tenant, task_target("noop"), start=week_ago)
    JobRunRow.objects.filter(job_id=job_id).update(status="dead")
    with psycopg.connect(connections.database_conninfo(), autocommit=True) as listener:
        listener.execute(f"LISTEN {queries.NOTIFY_CHANNEL}")
        replay_run(job_id=job_id, scheduled_at=slot, actor="test")
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert [executor._slot(p) for p in payloads] == [slot]
