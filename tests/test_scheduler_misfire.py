"""Misfire policies: in-process with a fixed clock, and once through a real `run_scheduler --once`."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from jobs import ledger
from jobs.dispatch.planning import MISFIRE_COUNT_CAP
from jobs.dispatch.scheduler import Scheduler
from jobs.models import Job, Misfire
from runs.models import JobRun
from tests.conftest import database_url
from tests.support.scheduler import make_job

pytestmark = pytest.mark.django_db(transaction=True)

T = datetime(2026, 5, 4, 10, 0, 30, tzinfo=UTC)
NEXT = datetime(2026, 5, 4, 9, 50, tzinfo=UTC)  # 10.5 minutes before T
MINUTE = timedelta(minutes=1)
MISSED = [NEXT + k * MINUTE for k in range(11)]  # 09:50 .. 10:00, every slot <= T


@pytest.fixture
def step():
    made: list[Scheduler] = []

    def run(now: datetime = T) -> None:
        if not made:
            made.append(
                Scheduler(
                    node_id="n1",
                    conninfo=database_url(),
                    clock=lambda: now,
                    heartbeat_thread=False,
                    maintain_partitions=False,
                    lease_seconds=30,
                )
            )
        made[0].clock = lambda: now
        made[0].step()

    yield run
    for sched in made:
        sched.close()


def runs_of(job: Job) -> list[tuple[datetime, str, str]]:
    return [
        (r.scheduled_at, r.trigger, r.status)
        for r in JobRun.objects.filter(job_id=job.id).order_by("scheduled_at")
    ]


def the_misfire(job: Job) -> Misfire:
    (misfire,) = Misfire.objects.filter(job=job)
    return misfire


def test_run_once_fires_the_latest_missed_slot(tenant, step):
    job = make_job(tenant, next_run_at=NEXT, misfire_policy="run_once")
    step()
    assert runs_of(job) == [(MISSED[-1], "catch_up", "queued")]
    m = the_misfire(job)
    assert (m.policy, m.missed_count, m.first_missed_at, m.last_missed_at, m.runs_created) == (
        "run_once",
        11,
        NEXT,
        MISSED[-1],
        1,
    )
    job.refresh_from_db()
    assert job.next_run_at == datetime(2026, 5, 4, 10, 1, tzinfo=UTC)
    step()  # nothing more: the misfire advanced past now
    assert len(runs_of(job)) == 1 and Misfire.objects.count() == 1


def test_skip_fires_nothing_but_records(tenant, step):
    job = make_job(tenant, next_run_at=NEXT, misfire_policy="skip")
    step()
    assert runs_of(job) == []
    m = the_misfire(job)
    assert (m.policy, m.missed_count, m.runs_created, m.last_missed_at) == ("skip", 11, 0, MISSED[-1])
    job.refresh_from_db()
    assert job.next_run_at == datetime(2026, 5, 4, 10, 1, tzinfo=UTC)


def test_catch_up_fires_every_missed_slot_oldest_first(tenant, step):
    # overlap_policy=skip would skip all but the first if the backlog were overlap-checked.
    job = make_job(tenant, next_run_at=NEXT, misfire_policy="catch_up", overlap_policy="skip")
    step()
    assert runs_of(job) == [(t, "catch_up", "queued") for t in MISSED]
    ids = list(JobRun.objects.filter(job_id=job.id).order_by("id").values_list("scheduled_at", flat=True))
    assert ids == MISSED  # inserted oldest first
    m = the_misfire(job)
    assert (m.policy, m.missed_count, m.runs_created) == ("catch_up", 11, 11)


def test_catch_up_is_capped_by_max_catch_up(tenant, step):
    job = make_job(tenant, next_run_at=NEXT, misfire_policy="catch_up", max_catch_up=4)
    step()
    assert [r[0] for r in runs_of(job)] == MISSED[:4]
    m = the_misfire(job)
    assert (m.missed_count, m.runs_created) == (11, 4)


def test_lateness_at_the_threshold_is_not_a_misfire(tenant, step):
    job = make_job(tenant, next_run_at=T - timedelta(seconds=60), interval_seconds=3600)
    step()
    assert runs_of(job) == [(T - timedelta(seconds=60), "schedule", "queued")]
    assert not Misfire.objects.exists()


def test_a_year_of_missed_minutes_is_bounded(tenant, step):
    year_ago = datetime(2025, 5, 4, 10, 0, tzinfo=UTC)
    once = make_job(tenant, next_run_at=year_ago, misfire_policy="run_once")
    catch = make_job(tenant, next_run_at=year_ago, misfire_policy="catch_up", max_catch_up=100)
    started = time.monotonic()
    step()
    assert time.monotonic() - started < 10
    assert runs_of(once) == [(datetime(2026, 5, 4, 10, 0, tzinfo=UTC), "catch_up", "queued")]
    assert [r[0] for r in runs_of(catch)] == [year_ago + k * MINUTE for k in range(100)]
    m = the_misfire(once)
    # At least the count cap, marked as a lower bound; true latest slot found from the tail.
    assert (m.missed_count, m.count_is_lower_bound) == (MISFIRE_COUNT_CAP, True)
    assert m.last_missed_at == datetime(2026, 5, 4, 10, 0, tzinfo=UTC)


def test_interval_job_misfire_count_is_exact_even_past_the_cap(tenant, step):
    day_ago = T - timedelta(days=1)
    job = make_job(tenant, interval_seconds=1, next_run_at=day_ago, misfire_policy="run_once")
    step()
    m = the_misfire(job)
    assert m.missed_count == 86_401 and m.last_missed_at == T and not m.count_is_lower_bound
    assert runs_of(job) == [(T, "catch_up", "queued")]
    job.refresh_from_db()
    assert job.next_run_at == T + timedelta(seconds=1)


def test_missed_one_time_job_follows_its_policy(tenant, step):
    at = T - timedelta(minutes=5)
    fired = make_job(tenant, run_at=at, next_run_at=at, misfire_policy="run_once")
    skipped = make_job(tenant, run_at=at, next_run_at=at, misfire_policy="skip")
    step()
    assert runs_of(fired) == [(at, "catch_up", "queued")] and runs_of(skipped) == []
    for job in (fired, skipped):
        job.refresh_from_db()
        assert job.next_run_at is None and the_misfire(job).missed_count == 1


def test_misfire_after_downtime_with_a_real_scheduler_process(tenant, processes):
    """Schedulers stopped, next_run_at moved 10 minutes into the past, one `run_scheduler --once`."""
    now = datetime.now(UTC)
    start = now.replace(second=0, microsecond=0) - 10 * MINUTE
    catch = make_job(tenant, next_run_at=start, misfire_policy="catch_up")
    once = make_job(tenant, next_run_at=start, misfire_policy="run_once")
    before = datetime.now(UTC)
    proc = processes.start("run_scheduler", "--once", env={"SCHEDULER_LEASE_SECONDS": "3"})
    assert proc.wait(timeout=60) == 0, processes.log_of(proc)
    after = datetime.now(UTC)
    m = the_misfire(catch)
    # The process' clock is the database's; the latest missed slot is the minute of "now" then.
    assert (
        before.replace(second=0, microsecond=0) <= m.last_missed_at <= after.replace(second=0, microsecond=0)
    )
    expected = []
    t = start
    while t <= m.last_missed_at:
        expected.append(t)
        t += MINUTE
    assert len(expected) in (11, 12)
    assert runs_of(catch) == [(t, "catch_up", "queued") for t in expected]
    assert (m.policy, m.missed_count, m.runs_created) == ("catch_up", len(expected), len(expected))
    assert runs_of(once) == [(expected[-1], "catch_up", "queued")]
    for job in (catch, once):
        job.refresh_from_db()
        assert job.next_run_at == expected[-1] + MINUTE
    # --once released everything on the way out.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM scheduler_nodes")
        assert cursor.fetchone()[0] == 0


def test_a_jobs_own_starting_deadline_decides_the_misfire(tenant, step):
    """starting_deadline_seconds replaces the global threshold (60 s here) for its job: 5 s
    makes a slot 20 s late a misfire, 300 s keeps one 120 s late on time; the ledger
    gives each slot the reason the job's own deadline led to."""
    hour = {"interval_seconds": 3600, "misfire_policy": "skip"}
    strict = make_job(tenant, next_run_at=T - timedelta(seconds=20), starting_deadline_seconds=5, **hour)
    lenient = make_job(tenant, next_run_at=T - timedelta(seconds=120), starting_deadline_seconds=300, **hour)
    # The same lateness under the global threshold: the other way round.
    plain_20 = make_job(tenant, next_run_at=T - timedelta(seconds=20), **hour)
    plain_120 = make_job(tenant, next_run_at=T - timedelta(seconds=120), **hour)
    Job.objects.update(created_at=T - timedelta(hours=1))
    step()

    assert runs_of(strict) == [] and the_misfire(strict).missed_count == 1
    assert runs_of(lenient) == [(T - timedelta(seconds=120), "schedule", "queued")]
    assert not Misfire.objects.filter(job=lenient).exists()
    assert runs_of(plain_20) == [(T - timedelta(seconds=20), "schedule", "queued")]
    assert runs_of(plain_120) == [] and the_misfire(plain_120).missed_count == 1

    def ledger_of(job: Job) -> list[tuple[datetime, str, str | None]]:
        job.refresh_from_db()
        found, _ = ledger.occurrences(
            job=job, start=T - timedelta(minutes=5), end=T + timedelta(seconds=1), now=T, after=None, limit=10
        )
        return [(o.scheduled_at, o.outcome, o.reason) for o in found]

    assert ledger_of(strict) == [(T - timedelta(seconds=20), "skipped", "misfire_skip")]
    assert ledger_of(lenient) == [(T - timedelta(seconds=120), "fired", None)]
