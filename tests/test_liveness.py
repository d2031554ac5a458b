"""One rule for "node alive" (scheduler_project.liveness): the schedulers' rebalancing,
the scheduler-node admin list, the dashboard and /metrics must agree on every node."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from jobs.dispatch import partition_leases
from jobs.models import SchedulerNode
from runs import selectors
from runs.execution.executor import Executor
from runs.models import ExecutorNode
from scheduler_project import db
from tests.support import nodes

pytestmark = pytest.mark.django_db(transaction=True)


def _node(node_id: str, *, age_seconds: float) -> None:
    now = timezone.now()
    SchedulerNode.objects.create(
        node_id=node_id,
        hostname="h",
        pid=1,
        started_at=now - timedelta(hours=1),
        heartbeat_at=now - timedelta(seconds=age_seconds),
        partitions=[],
    )


def test_every_reader_agrees_on_which_nodes_are_alive(admin_client):
    lease = settings.SCHEDULER_LEASE_SECONDS
    _node("fresh-connected", age_seconds=1)
    # Older than one lease, younger than two, still connected: alive by the one rule (the
    # admin list used to call it dead after one lease).
    _node("slow-connected", age_seconds=1.5 * lease)
    # Fresh heartbeat, but its session is gone (SIGKILL): dead at once (the dashboard and
    # /metrics used to call it alive for two partition_leases).
    _node("fresh-disconnected", age_seconds=1)
    _node("silent-connected", age_seconds=3 * lease)
    expected = {"fresh-connected", "slow-connected"}

    with nodes.sessions("fresh-connected", "slow-connected", "silent-connected"):
        # The schedulers' own view: a real lease manager's heartbeat + rebalance.
        observer = partition_leases.LeaseManager(
            conninfo=db.conninfo(connection.settings_dict),
            node_id="observer",
            hostname="h",
            pid=2,
            partitions=settings.SCHEDULER_PARTITIONS,
            lease_seconds=lease,
        )
        observer.start(thread=False)
        try:
            rebalancing = set(observer.live_nodes) - {"observer"}
        finally:
            observer.close()

        page = admin_client.get("/admin/jobs/schedulernode/").content.decode()
        admin_rows = {
            node_id
            for node_id, icon in re.findall(
                r'<th class="field-node_id">.*?>([\w-]+)<.*?'
                r'<td class="field-alive"><img src="[^"]*icon-(yes|no)',
                page,
                re.S,
            )
            if icon == "yes"
        }
        dashboard = admin_client.get("/admin/runs/jobrun/dashboard/?refresh=0").content.decode()
        dashboard_alive = {
            node_id
            for node_id, row in re.findall(r'<tr data-node="([\w-]+)"[^>]*>(.*?)</tr>', dashboard, re.S)
            if ">alive<" in row
        }
        metrics = admin_client.get("/metrics").content.decode()
        metric_live = int(float(re.search(r"^cronyard_scheduler_nodes (\S+)$", metrics, re.M).group(1)))

    assert rebalancing == expected
    assert admin_rows == expected
    assert dashboard_alive == expected
    assert metric_live == len(expected)


def test_an_executor_registers_heartbeats_and_leaves(transactional_db):
    executor = Executor.from_settings(node_lease_seconds=0.6, poll_seconds=0.05)

    async def scenario():
        task = asyncio.create_task(executor.main())
        seen = []
        deadline = asyncio.get_running_loop().time() + 60
        while len(seen) < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
            row = await asyncio.to_thread(
                _closing,
                lambda: (
                    ExecutorNode.objects.filter(node_id=executor.owner)
                    .values_list("heartbeat_at", flat=True)
                    .first()
                ),
            )
            if row is not None and row not in seen:
                seen.append(row)
        alive = await asyncio.to_thread(
            _closing, lambda: [(n.node_id, n.alive) for n in selectors.executor_nodes()]
        )
        executor.stop()
        await task
        return seen, alive

    seen, alive = asyncio.run(scenario())
    assert len(seen) == 2, "the executor registered and then heartbeated again"
    assert alive == [(executor.owner, True)]
    assert not ExecutorNode.objects.filter(node_id=executor.owner).exists()  # left on a clean stop


def _closing(read):
    """Run an ORM read on a worker thread and close that thread's connection after it."""
    try:
        return read()
    finally:
        connections.close_all()
