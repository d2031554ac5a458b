"""Job health and its alerts (overdue and failing).

Health is written by the executors' outcome statement: these tests drive that very
statement (runs.execution.outcomes.complete_runs) against the real database, then read the job
through the API; the alert sweep runs in a real Scheduler step and POSTs to a real
HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timedelta

import pytest
from django.db import connection

from jobs.dispatch.planning import run_for
from jobs.dispatch.scheduler import Scheduler
from jobs.models import Job
from jobs.services import partition_for
from runs import enqueue, rows
from runs.attempts import AttemptRecord
from runs.execution import connections
from runs.execution.outcomes import complete_runs
from runs.models import JobRunRow
from scheduler_project.citus import citus_installed
from tests.conftest import database_url
from tests.support.scheduler import make_job

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = timedelta(minutes=1)


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def finish(job: Job, outcomes: list[str], *, handed_back: bool = False, first_slot: int = 0) -> None:
    """One run per outcome (slots from `first_slot` minutes after an hour ago), claimed and
    completed through the executors' statements."""
    base = db_now().replace(microsecond=0) - timedelta(hours=1) + first_slot * MINUTE
    slots = [base + k * MINUTE for k in range(len(outcomes))]
    enqueue.enqueue_runs(
        [run_for(job, scheduled_at=t, trigger="schedule", overlap_check=False) for t in slots]
    )
    JobRunRow.objects.filter(job_id=job.id, scheduled_at__in=slots).update(status="running", attempt=1)
    completions = [
        rows.Completion(
            job_id=job.id,
            scheduled_at=t,
            partition_id=job.partition_id,
            attempt=1,
            status=status,
            retry_in_s=0.0 if status == "retrying" else None,
            result_code=200 if status == "succeeded" else 500,
            error="" if status == "succeeded" else "HTTP 500",
            entry=AttemptRecord(
                1, "x:1", None, None, None, "handed back" if handed_back else status, None, "", None
            ),
        )
        for t, status in zip(slots, outcomes, strict=True)
    ]

    async def write():
        conn = await connections.connect_async(database_url())
        try:
            return await complete_runs(conn, completions)
        finally:
            await conn.close()

    assert len(asyncio.run(write())) == len(outcomes)


def health(api, job: Job) -> dict:
    data = api.get(f"/api/v1/jobs/{job.id}/").json()
    return {
        k: data[k] for k in ("last_outcome", "consecutive_failures", "last_success_at", "last_failure_at")
    }


def test_health_after_success_failure_and_recovery(api, tenant):
    job = make_job(tenant, next_run_at=db_now() + MINUTE)
    assert health(api, job) == {
        "last_outcome": "",
        "consecutive_failures": 0,
        "last_success_at": None,
        "last_failure_at": None,
    }
    finish(job, ["succeeded"])
    first = health(api, job)
    assert (first["last_outcome"], first["consecutive_failures"]) == ("succeeded", 0)
    assert first["last_success_at"] and first["last_failure_at"] is None

    finish(job, ["retrying", "dead"], first_slot=1)
    failing = health(api, job)
    assert (failing["last_outcome"], failing["consecutive_failures"]) == ("dead", 2)
    assert failing["last_success_at"] == first["last_success_at"] and failing["last_failure_at"]

    # One batch, success newest: the streak ends; failures before it do not count.
    finish(job, ["retrying", "succeeded"], first_slot=3)
    recovered = health(api, job)
    assert (recovered["last_outcome"], recovered["consecutive_failures"]) == ("succeeded", 0)

    # One batch, failures on both sides of its newest success: the streak is the ones after it.
    finish(job, ["dead", "succeeded", "dead", "retrying", "succeeded", "dead"], first_slot=10)
    relapsed = health(api, job)
    assert (relapsed["last_outcome"], relapsed["consecutive_failures"]) == ("dead", 1)
    assert relapsed["last_success_at"] > recovered["last_success_at"]


def row_version(job: Job) -> tuple[int, datetime | None]:
    """The job row's xmin (changes with every write of the row) and its stored last success."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text::bigint, last_success_at FROM jobs WHERE id = %s", [job.id])
        return cursor.fetchone()


def test_a_success_of_a_healthy_job_writes_no_job_row(api, tenant):
    job = make_job(tenant, next_run_at=db_now() + MINUTE)
    finish(job, ["succeeded"])  # the first outcome ever: written
    first = health(api, job)
    written = row_version(job)
    assert written[1] is not None

    finish(job, ["succeeded"], first_slot=1)
    assert row_version(job) == written, "a success of a healthy job rewrote its row"
    second = health(api, job)
    # ... yet the API shows the newer success, read from the run.
    assert second["last_success_at"] > first["last_success_at"]
    assert (second["last_outcome"], second["consecutive_failures"]) == ("succeeded", 0)

    # A success of an older slot than one recorded (a replay, a backfill, a late retry)
    # is not the newest slot's: it is written to the row, and shown.
    finish(job, ["succeeded"], first_slot=-1)
    late = row_version(job)
    assert late[0] != written[0]
    assert health(api, job)["last_success_at"] > second["last_success_at"]

    # The row's copy (what remains once retention drops the runs) is refreshed daily.
    Job.objects.filter(id=job.id).update(last_success_at=db_now() - timedelta(days=2))
    finish(job, ["succeeded"], first_slot=2)
    refreshed = row_version(job)
    assert refreshed[0] != written[0] and refreshed[1] > db_now() - MINUTE
    assert health(api, job)["last_success_at"] > second["last_success_at"]


def test_a_hand_back_on_shutdown_is_not_a_failure(api, tenant):
    job = make_job(tenant, next_run_at=db_now() + MINUTE)
    finish(job, ["retrying"], handed_back=True)
    assert health(api, job)["consecutive_failures"] == 0 and health(api, job)["last_outcome"] == ""


def test_overdue_shows_in_the_api_and_metrics_and_alerts_once_per_slot(api, tenant, settings, http_target):
    settings.SCHEDULER_OVERDUE_ALERT_SECONDS = 300
    settings.SCHEDULER_ALERT_WEBHOOK_URL = http_target.url("/alerts")
    settings.SCHEDULER_PARTITIONS = 256
    now = db_now()
    # Outside partition 0, the one partition of the sweeping scheduler below (a job's
    # partition follows from its id and never changes: Citus refuses to move a row).
    ids = (i for i in iter(uuid.uuid4, None) if partition_for(i) != 0)
    on_time = make_job(tenant, id=next(ids), next_run_at=now - MINUTE)
    late = make_job(tenant, id=next(ids), next_run_at=now - 10 * MINUTE)
    assert api.get(f"/api/v1/jobs/{on_time.id}/").json()["overdue_seconds"] is None
    assert 590 < api.get(f"/api/v1/jobs/{late.id}/").json()["overdue_seconds"] < 700

    metrics = api.get("/metrics").content.decode()
    assert 'cronyard_jobs_overdue{tenant="acme"} 1.0' in metrics

    # A scheduler that owns no partition of these jobs (it cannot dispatch them) still
    # sweeps: exactly one POST for the late job, none for the on-time one.
    sched = Scheduler(
        node_id="sweeper",
        conninfo=database_url(),
        heartbeat_thread=False,
        maintain_partitions=False,
        partitions_count=1,
    )
    try:
        for _ in range(3):
            sched._next_alert_sweep = 0.0  # sweep on every step, as if 5 s had passed
            sched.step()
        deadline = time.monotonic() + 20
        while not http_target.received("/alerts") and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        bodies = http_target.json_bodies("/alerts")
        assert [(b["type"], b["job"]["id"]) for b in bodies] == [("job.overdue", str(late.id))]

        # The next late slot is a new episode.
        Job.objects.filter(pk=late.pk).update(next_run_at=now - 9 * MINUTE)
        sched._next_alert_sweep = 0.0
        sched.step()
        deadline = time.monotonic() + 20
        while len(http_target.received("/alerts")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(http_target.json_bodies("/alerts")) == 2
    finally:
        sched.close()


def test_failing_streak_alerts_once_and_again_after_recovery(tenant, settings):
    from jobs import health as job_health

    settings.SCHEDULER_ALERT_WEBHOOK_URL = ""
    job = make_job(tenant, next_run_at=db_now() + MINUTE, alert_after_failures=2)
    finish(job, ["retrying"])
    assert job_health.sweep() == []
    finish(job, ["dead"])
    (alert,) = job_health.sweep()
    assert (alert.type, alert.job_id, alert.detail["consecutive_failures"]) == ("job.failing", job.id, 2)
    finish(job, ["retrying"])
    assert job_health.sweep() == []  # same streak
    finish(job, ["succeeded"])
    finish(job, ["retrying", "retrying"], first_slot=1)
    assert [a.type for a in job_health.sweep()] == ["job.failing"]


def test_failing_sweep_probes_an_index_instead_of_scanning_every_job(tenant):
    """The sweep runs every 5 s; at 1M jobs a sequential scan of jobs cost ~1 s of a core
    each time (docs/decisions/0027-job-health-and-alerts.md). With 20k healthy jobs and one failing,
    the failing query must be an index probe and still find the failing job."""
    from jobs import health as job_health

    job = make_job(tenant, next_run_at=db_now() + MINUTE, alert_after_failures=1)
    with connection.cursor() as cursor:
        # 20k copies of a healthy job (ids and names differ), as a big tenant has them.
        cursor.execute(
            """
            INSERT INTO jobs
            SELECT (json_populate_record(j, json_build_object('id', gen_random_uuid(), 'name', 'c' || g))).*
            FROM jobs j, generate_series(1, 20000) g WHERE j.id = %s
            """,
            [job.id],
        )
        cursor.execute("ANALYZE jobs")
        citus = citus_installed(cursor)
        cursor.execute("EXPLAIN " + job_health._FAILING_SQL, {"limit": job_health.SWEEP_LIMIT})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # On Citus each shard plans for itself and EXPLAIN shows one task of 32, here an
    # empty shard read by a seq scan of cost 0 (citus.explain_all_tasks did not show the
    # subplan's tasks): the plan says nothing there, so only the sweep's answer is checked.
    if not citus:
        assert "Seq Scan on jobs" not in plan, plan
    finish(job, ["dead"])
    assert [a.job_id for a in job_health.sweep()] == [job.id]


@pytest.mark.parametrize("value", [0, -1, "3", 1.5, 1001])
def test_bad_alert_after_failures_is_400(api, value):
    response = api.post(
        "/api/v1/jobs/",
        {
            "name": "x",
            "interval_seconds": 60,
            "target": {"type": "task", "name": "noop"},
            "alert_after_failures": value,
        },
        format="json",
    )
    assert response.status_code == 400 and "alert_after_failures" in response.json(), response.content
    assert not Job.objects.exists()


def test_overdue_jobs_are_flagged_in_the_job_list_and_on_the_dashboard(admin_client, tenant, settings):
    settings.SCHEDULER_OVERDUE_ALERT_SECONDS = 300
    now = db_now()
    make_job(tenant, name="on time", next_run_at=now - MINUTE)
    make_job(tenant, name="stuck", next_run_at=now - 10 * MINUTE)
    make_job(tenant, name="paused and old", next_run_at=now - 60 * MINUTE, paused=True)
    page = admin_client.get("/admin/jobs/job/").content.decode()
    rows = {
        name: row
        for row in page.split("<tr")[1:]
        for name in ("on time", "stuck", "paused and old")
        if name in row
    }
    assert "cronyard-overdue" in rows["stuck"]
    assert "cronyard-overdue" not in rows["on time"] and "cronyard-overdue" not in rows["paused and old"]
    dashboard = admin_client.get("/admin/runs/jobrun/dashboard/?refresh=0").content.decode()
    assert 'data-metric="overdue_jobs" class="cy-bad">1<' in dashboard
