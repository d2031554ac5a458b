"""Prometheus counters (runs/counters.py): counted by real scheduler and executor processes,
read through the real gunicorn's /metrics, parsed with prometheus_client's own parser and
checked by promtool; and the example alert rules, checked and unit-tested by promtool."""

from __future__ import annotations

import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
import requests
from django.db import connection
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from jobs import services
from jobs.tenant_services import create_tenant
from runs import counters
from runs.models import JobRun
from tests.support.executor import http_spec, wait_for
from tests.support.http_target import Reply

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "docs" / "prometheus" / "cronyard-alerts.yml"
RULES_TESTS = ROOT / "docs" / "prometheus" / "cronyard-alerts.test.yml"


def scrape(web_server) -> tuple[str, dict[tuple[str, tuple], float]]:
    text = requests.get(f"{web_server.url}/metrics", timeout=30).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return text, samples


class LostConnection:
    """A cursor whose connection is gone: every statement fails."""

    def execute(self, *args) -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: scripts/ensure_test_tools.sh installs it"
    return path


@pytest.mark.processes
def test_counters_rise_by_what_the_processes_did(tenant, processes, http_target, web_server, settings):
    settings.SCHEDULER_ALLOW_PRIVATE_TARGETS = True  # the target is on 127.0.0.1
    http_target.script("/fail", Reply(500), then=Reply(500))
    soon = timezone.now() + timedelta(seconds=1)
    for i in range(3):
        services.create_job(
            tenant=tenant, fields=dict(name=f"ok{i}", run_at=soon, target=http_spec(http_target.url("/ok")))
        )
    services.create_job(
        tenant=tenant,
        fields=dict(
            name="broken",
            run_at=soon,
            target=http_spec(http_target.url("/fail")),
            max_attempts=2,
            retry_backoff_seconds=1,
            retry_backoff_cap_seconds=1,
        ),
    )
    _, before = scrape(web_server)
    env = {"SCHEDULER_ALERT_WEBHOOK_URL": http_target.url("/alerts")}
    processes.start("run_scheduler", env=env)
    processes.start("run_executor", env=env)
    wait_for(
        lambda: JobRun.objects.filter(status__in=("succeeded", "dead")).count() == 4,
        timeout=60,
        what="4 runs finished",
    )
    wait_for(lambda: http_target.received("/alerts"), timeout=30, what="the run.dead alert")
    # A clean exit writes what each process counted since its last flush.
    processes.stop_all()
    text, after = scrape(web_server)

    def rose(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before[key]

    assert rose("cronyard_runs_dispatched_total", outcome="queued") == 4
    assert rose("cronyard_runs_dispatched_total", outcome="skipped") == 0
    assert rose("cronyard_run_attempts_total") == 5  # 3 calls that succeeded, 2 that failed
    assert rose("cronyard_runs_finished_total", status="succeeded") == 3
    assert rose("cronyard_runs_finished_total", status="dead") == 1
    assert rose("cronyard_run_retries_total") == 1
    assert rose("cronyard_alerts_sent_total", type="run.dead") == 1
    assert rose("cronyard_lease_expiries_total") == rose("cronyard_fenced_results_total") == 0
    checked = subprocess.run([promtool(), "check", "metrics"], input=text.encode(), capture_output=True)
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()


LAST_SUCCESS = "cronyard_tenant_last_success_timestamp_seconds"


@pytest.mark.processes
def test_a_tenants_last_success_moves_to_the_finish_of_its_newest_success(
    tenant, processes, http_target, web_server, settings
):
    settings.SCHEDULER_ALLOW_PRIVATE_TARGETS = True  # the target is on 127.0.0.1
    other = create_tenant(slug="quiet")[0]
    soon = timezone.now() + timedelta(seconds=1)
    job = services.create_job(
        tenant=tenant, fields=dict(name="ok", run_at=soon, target=http_spec(http_target.url("/ok")))
    )
    _, before = scrape(web_server)
    assert before[(LAST_SUCCESS, (("tenant", tenant.slug),))] == 0
    processes.start("run_scheduler")
    processes.start("run_executor")
    wait_for(
        lambda: JobRun.objects.filter(job_id=job.id, status="succeeded").exists(),
        timeout=60,
        what="the success",
    )
    processes.stop_all()  # a clean exit flushes what the executor kept
    _, after = scrape(web_server)
    finished = JobRun.objects.get(job_id=job.id).finished_at
    assert after[(LAST_SUCCESS, (("tenant", tenant.slug),))] == pytest.approx(finished.timestamp(), abs=1e-3)
    assert after[(LAST_SUCCESS, (("tenant", other.slug),))] == 0


@pytest.mark.django_db(transaction=True)
def test_a_tenant_that_never_succeeded_is_0_and_the_newest_success_wins(client):
    create_tenant(slug="never")
    busy, _ = create_tenant(slug="busy")
    base = timezone.now().replace(microsecond=0)
    one, two = counters.Tally("one"), counters.Tally("two")
    one.succeeded(busy.id, base - timedelta(hours=2))
    one.succeeded(busy.id, base - timedelta(hours=3))  # older: kept out
    two.succeeded(busy.id, base - timedelta(hours=1))
    with pytest.raises(psycopg.OperationalError):
        two.flush(LostConnection())  # given back: the next flush writes it
    with connection.cursor() as cursor:
        one.flush(cursor)
        two.flush(cursor)
        two.succeeded(busy.id, base - timedelta(hours=5))  # an older one later: no step back
        two.flush(cursor)
        cursor.execute(
            "UPDATE tenant_successes SET updated_at = now() - interval '2 days' WHERE node_id = 'two'"
        )
        counters.fold_retired(cursor)  # the folded row keeps the newest
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").content.decode())}
    shown = {s.labels["tenant"]: s.value for s in families[LAST_SUCCESS].samples}
    assert families[LAST_SUCCESS].type == "gauge"
    assert shown == {"never": 0, "busy": (base - timedelta(hours=1)).timestamp()}


@pytest.mark.django_db(transaction=True)
def test_every_counter_is_exported_from_the_first_scrape(client):
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").content.decode())}
    for spec in counters.SPECS:
        family = families[spec.name]
        assert family.type == "counter"
        labels = {s.labels.get(spec.label, "") for s in family.samples if s.name.endswith("_total")}
        assert set(spec.values) <= labels, spec.name


@pytest.mark.django_db(transaction=True)
def test_every_executor_count_says_which_counter_it_feeds_and_reaches_it():
    """The executor exports its counts by the fields of Counters: a field added without
    naming its counter (or that it feeds none) fails here, not silently on /metrics."""
    from dataclasses import fields

    from runs.execution.inflight import Counters

    names = [count.name for count in fields(Counters)]
    assert all("exported" in count.metadata for count in fields(Counters)), names
    exported = [count.metadata["exported"] for count in fields(Counters) if count.metadata["exported"]]
    fed = set(exported)
    assert len(fed) == len(exported)  # no two fields feed one series
    assert {spec for spec, _ in fed} <= set(counters.SPECS)

    def total(spec: counters.Spec, label: str) -> int:
        with connection.cursor() as cursor:
            return counters.totals(cursor).get((spec.name, label), 0)

    before = {(spec, label): total(spec, label) for spec, label in fed}
    now = Counters(**{name: 10 + i for i, name in enumerate(names)})
    tally = counters.Tally("counted-node")
    for spec, gained, label in now.gained_since(Counters()):
        tally.add(spec, gained, label=label)
    with connection.cursor() as cursor:
        tally.flush(cursor)
    rose = {(spec, label): total(spec, label) - before[(spec, label)] for spec, label in fed}
    expected = {count.metadata["exported"]: getattr(now, count.name) for count in fields(Counters)}
    expected.pop(None)
    assert rose == expected


@pytest.mark.django_db(transaction=True)
def test_a_failed_async_flush_writes_what_it_wrote_and_keeps_the_rest():
    """The executor's flush (async): a statement that fails gives its data back; what was
    written before it stays written and is not written twice."""
    import asyncio

    from tests.conftest import database_url

    busy, _ = create_tenant(slug="busy")
    at = timezone.now().replace(microsecond=0)

    class SuccessesFail:
        def __init__(self, conn):
            self.conn = conn

        async def execute(self, sql, params):
            if "tenant_successes" in sql:
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return await self.conn.execute(sql, params)

    async def flush(tally: counters.Tally, *, failing: bool) -> None:
        async with await psycopg.AsyncConnection.connect(database_url(), autocommit=True) as conn:
            await tally.flush_async(SuccessesFail(conn) if failing else conn)

    def written() -> tuple[int, object]:
        with connection.cursor() as cursor:
            retries = counters.totals(cursor).get((counters.RETRIES.name, ""), 0)
            return retries, counters.last_successes(cursor).get(busy.id)

    start, _ = written()
    tally = counters.Tally("async-node")
    tally.add(counters.RETRIES, 3)
    tally.succeeded(busy.id, at)
    with pytest.raises(psycopg.OperationalError):
        asyncio.run(flush(tally, failing=True))
    assert written() == (start + 3, None)
    asyncio.run(flush(tally, failing=False))
    assert written() == (start + 3, at)


@pytest.mark.django_db(transaction=True)
def test_a_failed_flush_keeps_its_counts_and_folding_keeps_every_sum():
    def total(name: str) -> int:
        with connection.cursor() as cursor:
            return counters.totals(cursor).get((name, ""), 0)

    start = total(counters.RETRIES.name)
    gone, live = counters.Tally("gone-node"), counters.Tally("live-node")
    gone.add(counters.RETRIES, 2)
    live.add(counters.RETRIES, 5)
    with connection.cursor() as cursor:
        gone.flush(cursor)
        cursor.execute(
            "UPDATE process_counters SET updated_at = now() - interval '2 days' WHERE node_id = 'gone-node'"
        )
    # A flush whose statement fails (the connection is gone) gives its counts back; the
    # next flush writes them.
    live.add(counters.RETRIES, 1)
    with pytest.raises(psycopg.OperationalError):
        live.flush(LostConnection())
    assert total(counters.RETRIES.name) == start + 2
    with connection.cursor() as cursor:
        live.flush(cursor)
    assert total(counters.RETRIES.name) == start + 8

    with connection.cursor() as cursor:
        counters.fold_retired(cursor)
        cursor.execute("SELECT node_id FROM process_counters WHERE name = %s", [counters.RETRIES.name])
        nodes = {row[0] for row in cursor.fetchall()}
    assert "gone-node" not in nodes and {counters.RETIRED, "live-node"} <= nodes
    assert total(counters.RETRIES.name) == start + 8


def test_the_example_alert_rules_load_and_fire_as_documented():
    """promtool reads the rules file users copy, and its unit tests (series in, alerts out)
    pass: the rules fire on what Cronyard exports, under the names it exports."""
    checked = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True)
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()
    tested = subprocess.run(
        [promtool(), "test", "rules", str(RULES_TESTS)], capture_output=True, cwd=RULES.parent
    )
    assert tested.returncode == 0, (tested.stdout + tested.stderr).decode()
