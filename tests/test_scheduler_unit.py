"""Scheduler.step() in-process against the real test database, with a fixed clock."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction

from jobs.dispatch import fencing, partition_leases
from jobs.dispatch.planning import run_for
from jobs.models import Job, SchedulerNode
from runs.enqueue import enqueue_runs
from runs.models import JobRun, JobRunRow
from scheduler_project.citus import citus_installed
from scheduler_project.db import raw_cursor
from tests.conftest import database_url
from tests.support import citus_workers
from tests.support.scheduler import in_process_schedulers, locks_by_pid, make_job

pytestmark = pytest.mark.django_db(transaction=True)

T = datetime(2026, 5, 4, 10, 0, 5, tzinfo=UTC)  # 5 s after a minute boundary


@pytest.fixture
def make_scheduler():
    yield from in_process_schedulers(at=T)


def runs_of(job: Job) -> list[JobRun]:
    return list(JobRun.objects.filter(job_id=job.id).order_by("scheduled_at"))


def test_due_cron_job_fires_once_and_advances(tenant, make_scheduler):
    job = make_job(tenant, cron_expr="* * * * *", next_run_at=T - timedelta(seconds=5))
    sched = make_scheduler(node_id="n1")
    sched.step()
    runs = runs_of(job)
    assert [(r.scheduled_at, r.trigger, r.status) for r in runs] == [
        (T - timedelta(seconds=5), "schedule", "queued")
    ]
    assert runs[0].partition_id == job.partition_id and runs[0].target_version == job.target_version
    job.refresh_from_db()
    assert job.next_run_at == datetime(2026, 5, 4, 10, 1, tzinfo=UTC)


def test_an_idle_scheduler_sleeps_until_the_next_job_is_due(tenant, make_scheduler):
    # The poll interval was most of the end-to-end lag: an idle scheduler now wakes
    # when its next job falls due (never later than a poll interval).
    make_job(tenant, next_run_at=T - timedelta(seconds=5))
    make_job(tenant, next_run_at=T + timedelta(milliseconds=300))
    sched = make_scheduler(node_id="n1", poll_seconds=1.0)
    assert sched.step() is False
    assert 0.2 < sched.idle_seconds() <= 0.31
    assert sched.idle_seconds() == 1.0  # nothing newer known: a whole poll


def test_with_nothing_upcoming_the_idle_wait_is_the_poll(tenant, make_scheduler):
    make_job(tenant, next_run_at=T + timedelta(hours=2))
    sched = make_scheduler(node_id="n1", poll_seconds=0.7)
    assert sched.step() is False
    assert sched.idle_seconds() == 0.7


def test_second_step_at_same_time_adds_nothing(tenant, make_scheduler):
    job = make_job(tenant, next_run_at=T - timedelta(seconds=5))
    sched = make_scheduler(node_id="n1")
    assert sched.step() is False  # batch not full, nothing still due
    assert sched.step() is False
    other = make_scheduler(node_id="n2")  # a second node sees no partitions free and no due job
    other.step()
    assert len(runs_of(job)) == 1


def test_job_not_yet_due_and_paused_job_do_not_fire(tenant, make_scheduler):
    later = make_job(tenant, next_run_at=T + timedelta(seconds=1))
    paused = make_job(tenant, next_run_at=T - timedelta(seconds=5), paused=True)
    make_scheduler(node_id="n1").step()
    assert runs_of(later) == [] and runs_of(paused) == []
    paused.refresh_from_db()
    assert paused.next_run_at == T - timedelta(seconds=5)


def test_run_at_job_fires_once_then_finishes(tenant, make_scheduler):
    at = T - timedelta(seconds=2)
    job = make_job(tenant, run_at=at, next_run_at=at)
    sched = make_scheduler(node_id="n1")
    sched.step()
    sched.step()
    assert [r.scheduled_at for r in runs_of(job)] == [at]
    job.refresh_from_db()
    assert job.next_run_at is None


def test_end_at_finishes_the_job(tenant, make_scheduler):
    job = make_job(
        tenant, cron_expr="* * * * *", next_run_at=T - timedelta(seconds=5), end_at=T + timedelta(seconds=30)
    )
    make_scheduler(node_id="n1").step()
    assert len(runs_of(job)) == 1
    job.refresh_from_db()
    assert job.next_run_at is None


def test_pending_slot_after_end_at_does_not_fire(tenant, make_scheduler):
    job = make_job(tenant, next_run_at=T - timedelta(seconds=5), end_at=T - timedelta(seconds=10))
    make_scheduler(node_id="n1").step()
    assert runs_of(job) == []
    job.refresh_from_db()
    assert job.next_run_at is None


def test_overlap_skip_records_a_skipped_run(tenant, make_scheduler):
    job = make_job(tenant, next_run_at=T - timedelta(seconds=5), overlap_policy="skip")
    enqueue_runs([run_for(job, scheduled_at=T - timedelta(minutes=1), trigger="schedule")])  # still queued
    make_scheduler(node_id="n1").step()
    new = JobRun.objects.get(job_id=job.id, scheduled_at=T - timedelta(seconds=5))
    assert new.status == "skipped" and new.finished_at is not None


def test_overlap_buffer_one_keeps_one_waiting(tenant, make_scheduler):
    job = make_job(
        tenant, interval_seconds=10, next_run_at=T - timedelta(seconds=25), overlap_policy="buffer_one"
    )
    enqueue_runs([run_for(job, scheduled_at=T - timedelta(minutes=1), trigger="schedule")])
    JobRunRow.objects.filter(job_id=job.id).update(status="running")
    sched = make_scheduler(node_id="n1")
    assert sched.step() is True  # two more slots are already due
    sched.step()
    sched.step()
    statuses = [(r.scheduled_at - T, r.status) for r in runs_of(job)]
    assert statuses == [
        (timedelta(minutes=-1), "running"),
        (timedelta(seconds=-25), "queued"),  # the one buffered behind the running run
        (timedelta(seconds=-15), "skipped"),
        (timedelta(seconds=-5), "skipped"),
    ]


def test_interval_anchors_on_the_slot_not_on_now(tenant, make_scheduler):
    job = make_job(tenant, interval_seconds=7, next_run_at=T - timedelta(seconds=3))
    make_scheduler(node_id="n1").step()
    job.refresh_from_db()
    assert job.next_run_at == T + timedelta(seconds=4)


def test_late_but_under_threshold_fires_every_slot(tenant, make_scheduler):
    job = make_job(tenant, interval_seconds=2, next_run_at=T - timedelta(seconds=10), overlap_policy="allow")
    sched = make_scheduler(node_id="n1")
    steps = 0
    while sched.step():
        steps += 1
        assert steps < 20
    assert [r.scheduled_at - T for r in runs_of(job)] == [timedelta(seconds=s) for s in range(-10, 1, 2)]
    assert {r.trigger for r in runs_of(job)} == {"schedule"}


def test_full_batches_loop_and_many_jobs_fire_once_each(tenant, make_scheduler):
    jobs = [
        make_job(tenant, interval_seconds=60, next_run_at=T - timedelta(seconds=i % 7)) for i in range(25)
    ]
    sched = make_scheduler(node_id="n1", batch_size=10)
    # A full batch says "again" until the due jobs are done (a batch per Citus worker,
    # so there two steps may do what takes three on one server).
    steps = [sched.step() for _ in range(3)]
    assert steps[0] is True and steps[-1] is False and steps in ([True, True, False], [True, False, False])
    assert JobRun.objects.count() == 25
    assert set(JobRun.objects.values_list("job_id", flat=True)) == {j.id for j in jobs}


def test_a_batch_plans_from_rows_not_orm_instances(tenant, make_scheduler):
    """Building a Job model per due job was a fifth of a batch's time
    (docs/decisions/0029-dispatch-hot-path.md):
    the read hands planning plain rows, and the runs are the same."""
    from django.db.models.signals import post_init

    jobs = [
        make_job(tenant, interval_seconds=60, next_run_at=T - timedelta(seconds=i % 5)) for i in range(20)
    ]
    built = []

    def count(sender, instance, **kwargs):
        built.append(instance)

    post_init.connect(count, sender=Job)
    try:
        assert make_scheduler(node_id="n1").step() is False
    finally:
        post_init.disconnect(count, sender=Job)
    assert built == []
    assert sorted(JobRun.objects.values_list("job_id", "scheduled_at")) == sorted(
        (j.id, j.next_run_at) for j in jobs
    )


def test_lost_lease_session_dispatches_nothing_until_a_new_session(tenant, make_scheduler, caplog):
    job = make_job(tenant, next_run_at=T - timedelta(seconds=5))
    sched = make_scheduler(node_id="n1")
    sched.start()
    old = sched.lease.snapshot
    assert len(old.owned) == 256
    # The server ends the lease session (as idle_session_timeout does). The timeout form
    # waits until it is gone: without it the step below could still see its locks.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s::int, 10000)", [old.session_pid])
    # The node's own bookkeeping has not noticed yet (no heartbeat ran): the fence
    # inside the dispatch transaction must still refuse, since pg_locks is empty.
    assert sched.lease.snapshot.usable(now=old.ok_at, lease_seconds=30)
    sched.step()
    assert runs_of(job) == []
    sched.lease.tick_now()  # heartbeat notices
    assert "lease lost" in caplog.text and not sched.lease.snapshot.owned
    sched.lease.tick_now()  # reconnects, re-registers, re-acquires
    new = sched.lease.snapshot
    assert (
        new.session_pid != old.session_pid and new.generation == old.generation + 1 and len(new.owned) == 256
    )
    assert SchedulerNode.objects.get(node_id="n1").partitions == list(range(256))
    sched.step()
    assert len(runs_of(job)) == 1


def test_stale_heartbeat_stops_dispatch(tenant, make_scheduler):
    job = make_job(tenant, next_run_at=T - timedelta(seconds=5))
    sched = make_scheduler(node_id="n1", lease_seconds=3)
    sched.start()
    snap = sched.lease.snapshot
    assert not snap.usable(now=snap.ok_at + 2.1, lease_seconds=3)
    sched.lease.snapshot = partition_leases.LeaseSnapshot(
        snap.session_pid, snap.owned, snap.ok_at - 2.1, snap.generation
    )
    sched.step()
    assert runs_of(job) == []


@pytest.mark.parametrize("per_partition", [False, True], ids=["engine's-form", "per-partition"])
def test_cas_refuses_stale_and_backward_writes(tenant, per_partition, request):
    # Both forms of the statement (the engine's: one for the batch on plain PostgreSQL;
    # one per partition, as on Citus).
    if per_partition:
        request.getfixturevalue("per_partition_forms")
    job = make_job(tenant, next_run_at=T)
    other = make_job(tenant, next_run_at=T)
    p = job.partition_id
    with transaction.atomic():
        cursor = raw_cursor(connection)

        def cas(*rows):
            return fencing.advance_next_run(cursor, list(rows))

        assert cas((p, job.id, T + timedelta(minutes=1), T - timedelta(minutes=1))) == set()
        assert cas((p, job.id, T - timedelta(minutes=1), T)) == set()
        # The partition is part of the key: a row named with the wrong one is not written.
        assert cas(((p + 1) % settings.SCHEDULER_PARTITIONS, job.id, T + timedelta(minutes=1), T)) == set()
        assert cas(
            (p, job.id, T + timedelta(minutes=1), T),
            (other.partition_id, other.id, T + timedelta(minutes=2), T),
        ) == {job.id, other.id}
    job.refresh_from_db()
    assert job.next_run_at == T + timedelta(minutes=1)


@pytest.mark.parametrize("per_partition", [False, True], ids=["engine's-form", "per-partition"])
def test_dispatch_follows_the_per_partition_policy_of_the_executor(
    tenant, make_scheduler, monkeypatch, per_partition, request
):
    """The lock and the compare-and-set of a batch go by the one per-partition policy
    (runs/per_partition.py), as the executor's writes do: on plain PostgreSQL one
    statement each for the batch, naming no list of partitions (each row names its
    own); under the Citus policy one per partition of the batch, each naming its one."""
    if per_partition:
        request.getfixturevalue("per_partition_forms")
    with connection.cursor() as cursor:
        per_partition = per_partition or citus_installed(cursor)
    jobs: list[Job] = []
    while len({j.partition_id for j in jobs}) < 3:
        jobs.append(make_job(tenant, interval_seconds=60, next_run_at=T - timedelta(seconds=5)))
    sent: list[tuple[str, object]] = []
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def recording_execute(self, query, params=None, **kwargs):
        sent.append((str(query), params))
        return execute(self, query, params, **kwargs)

    def recording_executemany(self, query, params_seq, **kwargs):
        params_seq = list(params_seq)
        sent.extend((str(query), params) for params in params_seq)
        return executemany(self, query, params_seq, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", recording_execute)
    monkeypatch.setattr(psycopg.Cursor, "executemany", recording_executemany)
    make_scheduler(node_id="n1").step()

    partitions = sorted({j.partition_id for j in jobs})
    for marker in ("FOR UPDATE OF j", "UPDATE jobs AS j SET next_run_at"):
        statements = [(sql, params) for sql, params in sent if marker in sql]
        assert all("ANY(" not in sql for sql, _ in statements), marker
        named = [params.get("partition") for _, params in statements]
        # Each partition once (on Citus in the order of their workers' batches).
        expected = partitions if per_partition else [None]
        assert (sorted(named) if per_partition else named) == expected, marker
    assert sorted(JobRun.objects.values_list("job_id", flat=True)) == sorted(j.id for j in jobs)


def test_two_nodes_split_partitions_disjointly(make_scheduler):
    a = make_scheduler(node_id="a")
    b = make_scheduler(node_id="b")
    a.start()
    b.start()
    assert len(a.lease.snapshot.owned) == 256 and not b.lease.snapshot.owned
    a.lease.tick_now()  # sees b: releases down to its share
    b.lease.tick_now()  # takes the released ones
    owned_a, owned_b = a.lease.snapshot.owned, b.lease.snapshot.owned
    assert len(owned_a) == 128 and len(owned_b) == 128 and owned_a | owned_b == set(range(256))
    assert owned_a == set(range(0, 256, 2))  # home partitions of the first node id
    with connection.cursor() as cursor:
        assert locks_by_pid(cursor) == {
            a.lease.snapshot.session_pid: owned_a,
            b.lease.snapshot.session_pid: owned_b,
        }
    b.close()
    a.lease.tick_now()
    assert len(a.lease.snapshot.owned) == 256
    assert list(SchedulerNode.objects.values_list("node_id", flat=True)) == ["a"]


def test_dead_session_is_not_a_live_node(make_scheduler):
    a = make_scheduler(node_id="a")
    b = make_scheduler(node_id="b")
    a.start()
    b.start()
    a.lease.tick_now()
    b.lease.tick_now()
    # b's session dies (SIGKILL): its row is still fresh but it is not live any more.
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s::int, 10000)", [b.lease.snapshot.session_pid])
    a.lease.tick_now()
    assert len(a.lease.snapshot.owned) == 256 and a.lease.live_nodes == ("a",)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 255, 256, 300])
def test_fair_shares_cover_all_partitions(n):
    ids = [f"node-{i:03}" for i in range(n)]
    shares = [partition_leases.fair_share(ids, me, 256) for me in ids]
    assert sum(shares) == 256 and max(shares) - min(shares) <= 1


def test_step_runs_partition_maintenance_once(make_scheduler):
    from runs.day_partitions import existing_days

    sched = make_scheduler(node_id="n1", maintain_partitions=True)
    sched.step()
    with connection.cursor() as cursor:
        days = existing_days(cursor)
    assert datetime.now(UTC).date() + timedelta(days=7) in days


def test_a_job_whose_schedule_breaks_does_not_block_the_batch(tenant, make_scheduler):
    broken = make_job(tenant, next_run_at=T - timedelta(seconds=6), time_zone="Mars/Olympus_Mons")
    fine = make_job(tenant, next_run_at=T - timedelta(seconds=5))
    make_scheduler(node_id="n1").step()
    assert runs_of(broken) == [] and len(runs_of(fine)) == 1
    broken.refresh_from_db()
    assert broken.next_run_at is None


def _worker_connections_of_this_session() -> set[tuple[str, int]]:
    """(worker, backend pid) of every connection the workers hold for this session's backend."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT citus_backend_gpid()")
        (gpid,) = cursor.fetchone()
    held = set()
    for node in citus_workers.workers():
        with citus_workers.connect(node) as worker:
            rows = worker.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = %s",
                [f"citus_internal gpid={gpid}"],
            )
            held |= {(node, pid) for (pid,) in rows}
    return held


@pytest.mark.skipif(not os.environ.get("CRONYARD_CITUS_WORKERS"), reason="a make test-citus test")
def test_on_citus_the_next_batch_writes_on_the_worker_connections_of_the_last(tenant, make_scheduler):
    # The run insert writes each shard on a connection of its own. Citus kept one per
    # worker after a transaction, so every batch started a backend per shard again on
    # the workers (about 6 ms each); the scheduler's session now keeps them.
    # A new connection: none kept by earlier tests, and none recycled (CONN_MAX_AGE) between the steps.
    connection.close()
    jobs = [make_job(tenant, next_run_at=T - timedelta(seconds=5)) for _ in range(40)]
    sched = make_scheduler(node_id="n1")
    sched.step()
    assert JobRun.objects.filter(job_id__in=[job.id for job in jobs]).count() == 40
    kept = _worker_connections_of_this_session()
    assert len(kept) > len(citus_workers.workers())
    Job.objects.filter(id__in=[job.id for job in jobs]).update(next_run_at=T - timedelta(seconds=2))
    sched.step()
    assert JobRun.objects.filter(job_id__in=[job.id for job in jobs]).count() == 80
    assert _worker_connections_of_this_session() == kept
