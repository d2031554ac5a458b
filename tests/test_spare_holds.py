"""Spare holds (runs/execution/claims.Holds, docs/decisions/0084-spare-holds.md): on the
per-shard claim path, the holds of runs that finished grant the next claim of their
tenant without a round trip while its cap leaves ample room, and never let more runs
of a tenant run than its cap. On plain PostgreSQL through `per_partition_forms`; on
Citus the path the executors take."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import psycopg
import pytest
from django.db import connection, transaction

from jobs.models import Tenant
from jobs.tenant_services import create_tenant
from runs.execution import claims, connections, fair_share, queries
from runs.models import JobRun, JobRunRow
from tests.support.executor import queue_runs, task_target

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("per_partition_forms")]


class Claimer:
    """One executor's claim state (planner, holds), claiming on a connection of its own."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.planner = fair_share.Planner()
        self.holds = claims.Holds(owner=owner)
        self.reserved: list[dict[int, int]] = []  # the `want` of every grant round trip
        reserve = self.holds.reserve

        async def counted(conn, want, **kwargs):
            self.reserved.append(dict(want))
            return await reserve(conn, want, **kwargs)

        self.holds.reserve = counted

    def in_flight(self) -> dict[int, int]:
        """Its runs still running per tenant, as an executor's `mine` says."""
        rows = JobRun.objects.filter(owner=self.owner, status="running").values_list("tenant_id", flat=True)
        return dict(Counter(rows))

    async def claim(self, limit: int, *, mine: dict[int, int]) -> list:
        conn = await connections.connect_async(connections.database_conninfo())
        try:
            self.planner.forget()  # the work map as it is now (a claim after a NOTIFY)
            return await claims.claim_runs(
                conn, owner=self.owner, limit=limit, planner=self.planner, holds=self.holds, mine=mine
            )
        finally:
            await conn.close()

    def claim_now(self, limit: int) -> list:
        return asyncio.run(self.claim(limit, mine=self.in_flight()))


def finish(runs) -> None:
    JobRunRow.objects.filter(job_id__in=[r.job_id for r in runs]).update(status="succeeded", lease_until=None)


def held(owner: str, tenant_id: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT running FROM tenant_holds WHERE owner = %s AND tenant_id = %s", [owner, tenant_id]
        )
        row = cursor.fetchone()
    return row[0] if row else 0


def first_claim(slug: str, *, cap: int, queued: int = 30, limit: int = 10) -> tuple[Tenant, Claimer, list]:
    """A tenant with `queued` runs and the cap `cap`, and a claimer's first claim of them."""
    tenant, _ = create_tenant(slug=slug, max_concurrency=cap)
    queue_runs(tenant, task_target("noop"), count=queued)
    claimer = Claimer("spare:1")
    return tenant, claimer, claimer.claim_now(limit)


def test_the_holds_of_finished_runs_grant_the_next_claim_without_a_round_trip():
    tenant, claimer, first = first_claim("roomy", cap=1000)
    assert len(first) == 10 and claimer.reserved == [{tenant.id: 10}]
    finish(first)
    second = claimer.claim_now(10)
    assert len(second) == 10
    assert claimer.reserved == [{tenant.id: 10}], "the spare holds were asked for again"
    # The spare became the second claim's runs: what tenant_holds holds is what runs.
    assert held("spare:1", tenant.id) == 10 == JobRun.objects.filter(status="running").count()


def test_spare_holds_grant_what_they_cover_and_the_rest_is_asked_for():
    tenant, claimer, first = first_claim("partly", cap=1000)
    finish(first[:4])

    second = claimer.claim_now(10)
    assert len(second) == 10
    assert claimer.reserved == [{tenant.id: 10}, {tenant.id: 6}]
    assert held("spare:1", tenant.id) == 16 == JobRun.objects.filter(status="running").count()


def test_spare_holds_beyond_a_batch_are_given_back():
    tenant, claimer, first = first_claim("smaller", cap=1000, limit=20)
    finish(first)

    assert len(claimer.claim_now(5)) == 5
    assert claimer.reserved == [{tenant.id: 20}]
    # Five running, five spare (a batch of this claim's size); the other ten given back.
    assert held("spare:1", tenant.id) == 10


def test_grants_a_claim_could_not_use_stay_spare_up_to_a_batch():
    tenant, claimer, first = first_claim("unused", cap=1000, queued=40, limit=20)
    finish(first)
    # The work map sees the other 20 runs; another session holds them locked, so the
    # claim (SKIP LOCKED) takes none of the 10 its spare granted.
    queued = JobRunRow.objects.filter(tenant_id=tenant.id, status="queued")
    with transaction.atomic():
        for partition in {run.partition_id for run in queued}:  # Citus locks rows one shard at a time
            list(queued.filter(partition_id=partition).select_for_update())
        assert claimer.claim_now(10) == []
    assert claimer.reserved == [{tenant.id: 20}]
    assert held("spare:1", tenant.id) == 10, "more than a batch of spare was kept"


def test_spare_is_used_only_soon_after_a_grant_round_trip():
    """A claim loop that stalled, or a tenant others may have filled since: the spare
    is given back and the grants asked for."""
    tenant, claimer, first = first_claim("stale", cap=1000)
    finish(first)
    cap, room, at = claimer.holds.room[tenant.id]
    claimer.holds.room[tenant.id] = (cap, room, at - claims.HOLD_SECONDS / 3)

    assert len(claimer.claim_now(10)) == 10
    assert claimer.reserved == [{tenant.id: 10}, {tenant.id: 10}]
    assert held("spare:1", tenant.id) == 10


def test_after_a_failed_grant_no_spare_is_used_until_the_counts_are_read_back(monkeypatch):
    tenant, claimer, first = first_claim("unsure", cap=1000)
    finish(first[:4])
    with monkeypatch.context() as broken, pytest.raises(psycopg.errors.DivisionByZero):
        broken.setattr(queries, "HOLDS_RESERVE", "SELECT 1 / 0")
        claimer.claim_now(10)  # 4 spare, 6 to ask for
    finish(first)

    assert len(claimer.claim_now(10)) == 10
    assert claimer.reserved[-1] == {tenant.id: 10}, "spare was used while the counts were unsure"
    assert held("spare:1", tenant.id) == 10


def test_a_grant_round_trip_keeps_every_hold_of_the_executor_counting():
    quiet, claimer, _ = first_claim("quiet", cap=1000, queued=5)
    busy, _ = create_tenant(slug="busy", max_concurrency=1000)
    queue_runs(busy, task_target("noop"), count=5)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tenant_holds SET held_until = now() - interval '1 minute'")
    # The quiet tenant's runs are still running; the claim asks for the busy one's only.
    assert {r.tenant_id for r in claimer.claim_now(10)} == {busy.id}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tenant_id FROM tenant_holds"
            " WHERE owner = 'spare:1' AND tenant_id = ANY(%s) AND held_until > now() ORDER BY 1",
            [[quiet.id, busy.id]],
        )
        assert [row[0] for row in cursor.fetchall()] == sorted([quiet.id, busy.id])


def test_where_the_cap_leaves_little_room_finished_runs_are_given_back_and_asked_for():
    tenant, claimer, first = first_claim("tight", cap=15)  # leaves 5 beside every hold: less than a batch
    finish(first)
    second = claimer.claim_now(10)
    assert len(second) == 10
    assert claimer.reserved == [{tenant.id: 10}, {tenant.id: 10}]
    assert held("spare:1", tenant.id) == 10


def test_a_cap_lowered_since_the_grant_ends_the_spare():
    tenant, claimer, first = first_claim("lowered", cap=1000)
    finish(first)

    Tenant.objects.filter(id=tenant.id).update(max_concurrency=4)
    second = claimer.claim_now(10)
    assert len(second) == 4
    assert held("spare:1", tenant.id) == 4, "the spare holds of the old cap were kept"


def test_spare_holds_are_given_back_when_there_is_nothing_to_claim():
    tenant, claimer, first = first_claim("drained", cap=1000, queued=10)
    finish(first)

    assert claimer.claim_now(10) == []
    assert held("spare:1", tenant.id) == 0


CLAIMERS = 3


def test_racing_claimers_with_spare_holds_never_run_more_than_the_cap():
    """Three claimers with holds of their own claim at once, round after round. While
    the cap leaves ample room, all their runs finish between rounds and the next
    round's claims are granted from spare holds. Then the cap is lowered below what
    they ask together, and between rounds a random half of the running runs finish:
    however the claims interleave, no more runs run than the claimers hold, and they
    never hold more than the cap."""
    limit = 10
    tenant, _ = create_tenant(slug="racing-spare", max_concurrency=1000)
    queue_runs(tenant, task_target("noop"), count=CLAIMERS * limit * 12)
    claimers = [Claimer(f"spare:{i}") for i in range(CLAIMERS)]

    def race_round() -> tuple[list, int]:
        async def race(mine: list[dict[int, int]]) -> None:
            await asyncio.gather(*(c.claim(limit, mine=m) for c, m in zip(claimers, mine, strict=True)))

        asyncio.run(race([c.in_flight() for c in claimers]))
        running = list(JobRun.objects.filter(tenant_id=tenant.id, status="running"))
        return running, sum(held(c.owner, tenant.id) for c in claimers)

    for _ in range(4):
        running, holds = race_round()
        assert running and len(running) <= holds
        finish(running)
    assert sum(len(c.reserved) for c in claimers) < CLAIMERS * 4, "no claim was granted from spare holds"

    cap = 25  # below the three claims' 30
    Tenant.objects.filter(id=tenant.id).update(max_concurrency=cap)
    rng = random.Random(7)
    most_held = 0
    for _ in range(8):
        running, holds = race_round()
        assert len(running) <= holds <= cap, f"{len(running)} running, {holds} held, the cap {cap}"
        most_held = max(most_held, holds)
        finish(rng.sample(running, len(running) // 2))
    # Within one claim of the cap: a claim granted without the cap's check would pass it.
    assert most_held > cap - limit, f"the claimers never came near the cap ({most_held} of {cap} held)"
