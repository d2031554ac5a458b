"""/metrics: scraped over HTTP, parsed with prometheus_client's own parser, compared
with a database state built for the purpose."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from jobs.models import Job, SchedulerNode
from runs.models import JobRunRow
from tests.support import nodes
from tests.support.runsapi import attempt_entry, make_dead_run, make_job, make_run, minute_slots

pytestmark = pytest.mark.django_db


def scrape(client, **headers) -> dict[str, dict[tuple, float]]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    families = {}
    for family in text_string_to_metric_families(response.content.decode()):
        families[family.name] = {tuple(sorted(s.labels.items())): s.value for s in family.samples}
    return families


def value(families, name: str, **labels) -> float:
    return families[name][tuple(sorted(labels.items()))]


@pytest.fixture
def known_state(tenant):
    from jobs.tenant_services import create_tenant

    globex, _ = create_tenant(slug="globex", max_concurrency=2)
    now = timezone.now()
    job = make_job(tenant, "metered")
    other = make_job(globex, "other")
    due = make_job(tenant, "overdue")
    Job.objects.filter(pk=due.pk).update(next_run_at=now - timedelta(seconds=300))
    paused = make_job(tenant, "paused-overdue")
    Job.objects.filter(pk=paused.pk).update(next_run_at=now - timedelta(hours=3), paused=True)

    slots = minute_slots(12)
    make_run(job, slots[0], priority=5)  # queued p5
    make_run(job, slots[1], priority=5)  # queued p5
    make_run(job, slots[2], status="retrying", attempt=2)  # retrying p0, one retry
    make_run(job, slots[3], status="running", attempt=1)  # running p0 (acme)
    make_run(other, slots[3], status="running", attempt=3, priority=9)  # running p9 (globex), two retries
    make_run(other, slots[4], status="running", attempt=1, priority=9)
    make_run(job, slots[5], status="succeeded", attempt=1)
    make_run(job, slots[6], status="succeeded", attempt=4, deferrals=2)  # 2 claims unsent: one retry
    make_run(job, slots[7], status="skipped")
    make_run(job, slots[8], status="cancelled", attempt=1)
    make_dead_run(job, slots[9], attempts=5)  # four retries
    # Two lease expiries on one run, one on another: the reaper's entries as stored now,
    # and as a row stored before entries were arrays holds it (an object).
    expired = {"outcome": "lease expired", "error": "lease expired (no heartbeat)"}
    make_run(
        other,
        slots[10],
        status="retrying",
        attempt=3,
        priority=9,
        attempts=[
            attempt_entry(1, expired["outcome"], code=None, error=expired["error"]),
            attempt_entry(2, expired["outcome"], code=None, error=expired["error"]),
            attempt_entry(3, "retry"),
        ],
    )
    make_run(job, slots[11], status="succeeded", attempt=2, attempts=[{"attempt": 1, **expired}])
    # Outside the 24 h window: counted nowhere in the totals.
    old = now - timedelta(days=2)
    make_dead_run(job, old, attempts=9)
    make_run(other, old + timedelta(minutes=1), status="succeeded", attempt=1, attempts=[{**expired}])

    SchedulerNode.objects.create(
        node_id="sched-1", hostname="h", pid=1, started_at=now, heartbeat_at=now, partitions=list(range(100))
    )
    SchedulerNode.objects.create(
        node_id="sched-2",
        hostname="h",
        pid=2,
        started_at=now,
        heartbeat_at=now,
        partitions=list(range(100, 250)),
    )
    SchedulerNode.objects.create(
        node_id="sched-old",
        hostname="h",
        pid=3,
        started_at=now - timedelta(days=1),
        heartbeat_at=now - timedelta(hours=1),
        partitions=[250, 251],
    )
    # Alive means heartbeat fresh AND the node's session connected (scheduler_project.liveness).
    with nodes.sessions("sched-1", "sched-2", "sched-old"):
        yield


def test_metrics_match_the_database(client, known_state):
    m = scrape(client)
    assert 300 <= value(m, "cronyard_oldest_due_seconds") < 360
    assert value(m, "cronyard_jobs_due") == 1  # the paused job does not count

    assert value(m, "cronyard_queue_depth", priority="5", status="queued") == 2
    assert value(m, "cronyard_queue_depth", priority="0", status="retrying") == 1
    assert value(m, "cronyard_queue_depth", priority="9", status="retrying") == 1
    assert value(m, "cronyard_queue_depth", priority="0", status="running") == 1
    assert value(m, "cronyard_queue_depth", priority="9", status="running") == 2
    assert value(m, "cronyard_queue_depth", priority="0", status="queued") == 0

    totals = {labels[0][1]: v for labels, v in m["cronyard_runs_last_24h"].items()}
    assert totals == {
        "dispatched": 13,
        "succeeded": 3,
        # attempts used beyond the first: 1 + 2 + 1 + 4 (dead) + 2 (reaped run) + 1
        "retried": 11,
        "dead": 1,
        "skipped": 1,
        "cancelled": 1,
    }
    assert value(m, "cronyard_lease_expiries_last_24h") == 3

    assert value(m, "cronyard_partitions_owned", node="sched-1") == 100
    assert value(m, "cronyard_partitions_owned", node="sched-2") == 150
    assert value(m, "cronyard_partitions_owned", node="sched-old") == 2
    assert value(m, "cronyard_scheduler_nodes") == 2
    assert value(m, "cronyard_partitions_unowned") == 6  # 256 - 250 held by live nodes
    assert 3500 < value(m, "cronyard_scheduler_heartbeat_age_seconds", node="sched-old") < 3700

    assert value(m, "cronyard_tenant_running", tenant="acme") == 1
    assert value(m, "cronyard_tenant_running", tenant="globex") == 2
    assert value(m, "cronyard_tenant_max_concurrency", tenant="globex") == 2


def test_metrics_follow_the_database_between_scrapes(client, tenant):
    empty = scrape(client)
    assert value(empty, "cronyard_oldest_due_seconds") == 0
    assert value(empty, "cronyard_scheduler_nodes") == 0
    assert value(empty, "cronyard_partitions_unowned") == 256
    assert empty["cronyard_tenant_running"] == {}
    assert value(empty, "cronyard_runs_last_24h", status="dispatched") == 0
    # Per-tenant gauges have a sample for every tenant, 0 when it has nothing to count.
    assert value(empty, "cronyard_jobs_overdue", tenant="acme") == 0
    assert value(empty, "cronyard_jobs_failing", tenant="acme") == 0

    job = make_job(tenant, "later")
    run = make_dead_run(job, minute_slots(1)[0], attempts=2)
    Job.objects.filter(pk=job.pk).update(consecutive_failures=3, alert_after_failures=3)
    after = scrape(client)
    assert value(after, "cronyard_jobs_failing", tenant="acme") == 1
    assert value(after, "cronyard_runs_last_24h", status="dead") == 1
    assert value(after, "cronyard_runs_last_24h", status="retried") == 1
    JobRunRow.objects.filter(pk=run.pk).update(status="queued")
    again = scrape(client)
    assert value(again, "cronyard_runs_last_24h", status="dead") == 0
    assert value(again, "cronyard_queue_depth", priority="0", status="queued") == 1


def test_metrics_token(client, tenant):
    with override_settings(METRICS_TOKEN="s3cret"):
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
        assert "cronyard_queue_depth" in scrape(client, HTTP_AUTHORIZATION="Bearer s3cret")
    assert client.get("/metrics/").status_code == 200
    assert client.post("/metrics").status_code == 405


def test_metric_names_follow_prometheus_conventions(client, known_state):
    """Counters end in `_total` and only counters do (a gauge named `_total` misleads
    rate() users and breaks OpenMetrics parsers)."""
    response = client.get("/metrics")
    families = list(text_string_to_metric_families(response.content.decode()))
    assert families
    for family in families:
        assert family.name.startswith("cronyard_"), family.name
        for sample in family.samples:
            if family.type == "counter":
                assert sample.name.endswith(("_total", "_created")), sample.name
            else:
                assert not sample.name.endswith("_total"), f"{family.type} {sample.name}"


def test_executor_gauges_per_node(client, tenant):
    from runs.models import ExecutorNode

    now = timezone.now()
    for node_id, in_flight in (("exec-a", 3), ("exec-b", 0)):
        ExecutorNode.objects.create(
            node_id=node_id,
            hostname="h",
            pid=1,
            started_at=now,
            heartbeat_at=now,
            concurrency=8,
            in_flight=in_flight,
        )
    with nodes.sessions("exec-a"):  # exec-b has no session: registered, not alive
        families = scrape(client)
    assert families["cronyard_executor_in_flight"] == {
        (("node", "exec-a"),): 3.0,
        (("node", "exec-b"),): 0.0,
    }
    assert value(families, "cronyard_executor_nodes") == 1.0


def test_promtool_accepts_the_exposition(client, known_state):
    """Prometheus's own linter (promtool check metrics, from Debian's prometheus
    package, which `make test` installs) reads /metrics as a scraper would."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/ensure_test_tools.sh installs it"
    text = client.get("/metrics").content
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()
