"""The dashboard's charts are server-rendered SVG whose marks carry the database's
numbers: runs per minute by status, lateness p50/p99, queue depth by priority, oldest
due age, partition ownership; executors with in-flight runs and last claim; auto-refresh."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from jobs.models import Job, SchedulerNode
from runs.models import ExecutorNode
from tests.support import nodes
from tests.support.runsapi import make_job, make_run

pytestmark = pytest.mark.django_db


def svg(page: str, chart: str) -> str:
    match = re.search(rf'<svg class="cy-chart" data-chart="{chart}".*?</svg>', page, re.S)
    assert match, f"no {chart} chart"
    return match.group(0)


def marks(chart_svg: str, tag: str = "rect") -> list[tuple[str, str]]:
    return re.findall(rf'<{tag} [^>]*data-series="([^"]+)" data-value="([^"]+)"', chart_svg)


def test_dashboard_charts_carry_the_numbers(admin_client, tenant):
    now = timezone.now()
    minute = now.astimezone(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    job = make_job(tenant, "charted")
    other = make_job(tenant, "urgent", priority=5)
    for i, late in enumerate((2, 4, 6)):
        slot = minute + timedelta(seconds=i)
        make_run(
            job,
            slot,
            status="succeeded",
            attempt=1,
            started_at=slot + timedelta(seconds=late),
            finished_at=now,
        )
    make_run(
        job, minute + timedelta(seconds=10), status="dead", attempt=3, started_at=minute, finished_at=now
    )
    make_run(other, minute + timedelta(minutes=1), status="queued", priority=5)
    Job.objects.filter(pk=job.pk).update(next_run_at=now - timedelta(seconds=90))
    SchedulerNode.objects.create(
        node_id="sched-a", hostname="h", pid=1, started_at=now, heartbeat_at=now, partitions=list(range(100))
    )
    ExecutorNode.objects.create(
        node_id="exec-a",
        hostname="h",
        pid=2,
        started_at=now,
        heartbeat_at=now,
        concurrency=32,
        in_flight=7,
        last_claim_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    )

    with nodes.sessions("sched-a", "exec-a"):
        page = admin_client.get("/admin/runs/jobrun/dashboard/").content.decode()

    runs = svg(page, "runs_per_minute")
    assert 'data-total="5"' in runs
    assert sorted(marks(runs)) == [("dead", "1"), ("queued", "1"), ("succeeded", "3")]
    lateness = svg(page, "lateness")
    values = dict(marks(lateness, "circle"))
    # One 5-minute bucket holds the four started runs: 2, 4, 6 s late, and the dead one
    # started 10 s before its slot (-10): p50 of (-10, 2, 4, 6) = 3.
    assert float(values["p50"]) == pytest.approx(3.0)
    assert 5.8 < float(values["p99"]) <= 6.0
    depth = svg(page, "queue_depth")
    assert marks(depth) == [("queued", "1")]
    gauge = svg(page, "oldest_due")
    assert 89 <= float(re.search(r'data-value="([\d.]+)"', gauge).group(1)) < 150
    partitions = svg(page, "partitions")
    assert len(re.findall(r'data-owner="sched-a"', partitions)) == 100
    assert len(re.findall(r'data-owner=""', partitions)) == 156

    row = re.search(r'<tr data-executor="exec-a" data-alive="true">(.*?)</tr>', page, re.S).group(1)
    assert "7 / 32" in row and "2026-01-02 03:04:05" in row and "alive" in row
    assert '<meta http-equiv="refresh" content="15">' in page
    quiet = admin_client.get("/admin/runs/jobrun/dashboard/?refresh=0").content.decode()
    assert 'http-equiv="refresh"' not in quiet
