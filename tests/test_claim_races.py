"""Claimers racing for the runs of the same tenant, in-process, on separate connections:
however their claims interleave, a skip job never has two runs running and a tenant
never more than its cap. On both claim paths: the batch claim of plain PostgreSQL and
the per-shard claims of Citus (forced on plain PostgreSQL by `per_partition_forms`; on
a Citus cluster both cases take it)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from django.db import connection
from django.db.models import Count

from jobs.tenant_services import create_tenant
from runs.execution import claims, connections, fair_share
from runs.models import JobRun, JobRunRow
from scheduler_project.citus import Placements, citus_installed
from tests.support.executor import queue_runs, task_target

pytestmark = pytest.mark.django_db(transaction=True)

CLAIMERS = 3
JOBS = 24
ROUNDS = 8


async def _race(limit: int, *, lanes: int = 1) -> list:
    """CLAIMERS claims at once; with `lanes`, each claimer's shards side by side on that
    many connections (claims.Lanes), as an executor's are."""
    conns = [await connections.connect_async(connections.database_conninfo()) for _ in range(CLAIMERS)]
    side = [claims.Lanes(connect=connections.connect_async, size=lanes) for _ in range(CLAIMERS)]
    try:
        results = await asyncio.gather(
            *(
                claims.claim_runs(
                    conn,
                    owner=f"racer:{i}",
                    limit=limit,
                    planner=fair_share.Planner(),
                    holds=claims.Holds(owner=f"racer:{i}"),
                    lanes=side[i],
                )
                for i, conn in enumerate(conns)
            )
        )
        return [run for claimed in results for run in claimed]
    finally:
        for conn in conns:
            await conn.close()
        for claimer in side:
            await claimer.close()


# Per shard: each claimer's shards one after another, or side by side in lanes.
PATHS = {"batch": 1, "per_shard": 1, "per_shard_in_lanes": claims.CLAIM_LANES}


def _take(path: str, request) -> None:
    """The claim path `path` on this engine. On plain PostgreSQL the per-shard path sees
    one shard; in lanes it is shown four, so that each claimer's shards race each other
    as well as the other claimers' (on Citus they are the cluster's)."""
    if path == "batch":
        return
    request.getfixturevalue("per_partition_forms")
    with connection.cursor() as cursor:
        citus = citus_installed(cursor)
    if path == "per_shard_in_lanes" and not citus:
        monkeypatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setattr(Placements, "shard", lambda self, partition: partition % 4)


@pytest.mark.parametrize("path", PATHS)
def test_racing_claimers_never_run_two_runs_of_a_skip_job(path, request):
    _take(path, request)
    tenant, _ = create_tenant(slug="racing", max_concurrency=1000)
    overlaps = []
    for _ in range(ROUNDS):
        for _ in range(JOBS):
            queue_runs(tenant, task_target("noop"), count=2, job_id=uuid.uuid4(), overlap_policy="skip")
        claimed = asyncio.run(_race(limit=JOBS, lanes=PATHS[path]))
        assert claimed, "nobody claimed anything"
        overlaps += list(
            JobRun.objects.filter(status="running").values("job_id").annotate(n=Count("*")).filter(n__gt=1)
        )
        JobRunRow.objects.filter(tenant_id=tenant.id).update(status="succeeded", lease_until=None)
    assert overlaps == [], f"{len(overlaps)} skip jobs had two runs running at once"


@pytest.mark.parametrize("path", PATHS)
def test_racing_claimers_never_run_more_than_the_tenant_cap(path, request):
    # The cap is counted under the tenants' locks on plain PostgreSQL and granted from
    # tenant_holds on Citus (docs/decisions/0075-citus-claims.md); either way, claimers
    # racing for one tenant's backlog together start exactly its max_concurrency.
    _take(path, request)
    tenant, _ = create_tenant(slug="capped", max_concurrency=7)
    queue_runs(tenant, task_target("noop"), count=60)
    claimed = asyncio.run(_race(limit=10, lanes=PATHS[path]))
    running = JobRun.objects.filter(tenant_id=tenant.id, status="running").count()
    assert len(claimed) == running == 7
