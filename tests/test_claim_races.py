"""Claimers racing for the runs of the same tenant, in-process, on separate connections:
however their claims interleave, a skip job never has two runs running and a tenant
never more than its cap. On both claim paths: the batch claim of plain PostgreSQL and
the per-shard claims of Citus (forced on plain PostgreSQL by `per_partition_forms`; on
a Citus cluster both cases take it)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from django.db.models import Count

from jobs.tenant_services import create_tenant
from runs.execution import claims, connections, fair_share
from runs.models import JobRun
from tests.support.executor import queue_runs, task_target

pytestmark = pytest.mark.django_db(transaction=True)

CLAIMERS = 3
JOBS = 24
ROUNDS = 8


async def _race(limit: int) -> list:
    conns = [await connections.connect_async(connections.database_conninfo()) for _ in range(CLAIMERS)]
    try:
        results = await asyncio.gather(
            *(
                claims.claim_runs(
                    conn,
                    owner=f"racer:{i}",
                    limit=limit,
                    planner=fair_share.Planner(),
                    holds=claims.Holds(owner=f"racer:{i}"),
                )
                for i, conn in enumerate(conns)
            )
        )
        return [run for claimed in results for run in claimed]
    finally:
        for conn in conns:
            await conn.close()


@pytest.mark.parametrize("path", ["batch", "per_shard"])
def test_racing_claimers_never_run_two_runs_of_a_skip_job(path, request):
    if path == "per_shard":
        request.getfixturevalue("per_partition_forms")
    tenant, _ = create_tenant(slug="racing", max_concurrency=1000)
    overlaps = []
    for _ in range(ROUNDS):
        for _ in range(JOBS):
            queue_runs(tenant, task_target("noop"), count=2, job_id=uuid.uuid4(), overlap_policy="skip")
        claimed = asyncio.run(_race(limit=JOBS))
        assert claimed, "nobody claimed anything"
        overlaps += list(
            JobRun.objects.filter(status="running").values("job_id").annotate(n=Count("*")).filter(n__gt=1)
        )
        JobRun.objects.filter(tenant_id=tenant.id).update(status="succeeded", lease_until=None)
    assert overlaps == [], f"{len(overlaps)} skip jobs had two runs running at once"


@pytest.mark.parametrize("path", ["batch", "per_shard"])
def test_racing_claimers_never_run_more_than_the_tenant_cap(path, request):
    # The cap is counted under the tenants' locks on plain PostgreSQL and granted from
    # tenant_holds on Citus (docs/decisions/0075-citus-claims.md); either way, claimers
    # racing for one tenant's backlog together start exactly its max_concurrency.
    if path == "per_shard":
        request.getfixturevalue("per_partition_forms")
    tenant, _ = create_tenant(slug="capped", max_concurrency=7)
    queue_runs(tenant, task_target("noop"), count=60)
    claimed = asyncio.run(_race(limit=10))
    running = JobRun.objects.filter(tenant_id=tenant.id, status="running").count()
    assert len(claimed) == running == 7
