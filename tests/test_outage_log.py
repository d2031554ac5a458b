"""While the database is down each process logs ONE line when it goes away and ONE
when it is back (with how long it was away), not one line per retry.

The process test stops a private PostgreSQL cluster (the shared test cluster serves
other xdist workers) under a real scheduler and a real executor.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time

import psycopg
import pytest

from scheduler_project.outage import AWAY, BACK, OutageLog
from tests.support.private_pg import PrivatePg, wait_port_closed
from tests.support.processes import Processes
from tests.support.scheduler import wait_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_an_outage_is_one_away_line_and_one_back_line(caplog):
    caplog.set_level(logging.DEBUG, logger="scheduler_project.outage")
    clock = FakeClock()
    outage = OutageLog(name="executor", grace_seconds=0.5, clock=clock)
    for _ in range(30):  # a retry a second for half a minute
        outage.failed(OSError("connection refused"))
        clock.now += 1
    assert outage.away
    outage.ok()
    outage.ok()
    assert lines(caplog, AWAY) == [
        "executor: database unreachable since 1.0s (connection refused); retrying quietly until it is back"
    ]
    assert lines(caplog, BACK) == ["executor: database reachable again after 30.0s away (30 failed attempts)"]
    assert not outage.away


def test_one_broken_connection_replaced_at_once_is_not_an_outage(caplog):
    caplog.set_level(logging.DEBUG, logger="scheduler_project.outage")
    clock = FakeClock()
    outage = OutageLog(name="scheduler", clock=clock)
    for _ in range(3):
        outage.failed(OSError("server closed the connection unexpectedly"))
        clock.now += 0.1
        outage.ok()
        clock.now += 60
    assert lines(caplog, AWAY) == [] and lines(caplog, BACK) == []


def test_a_citus_worker_out_of_reach_is_one_away_line_and_one_back_line_naming_it(caplog):
    # What an executor sees while one Citus worker is down: its claims, which read every
    # shard, fail about once a second, and between them the statements that touch only
    # healthy shards (heartbeats, outcomes) succeed. That is one outage, of that worker.
    caplog.set_level(logging.DEBUG, logger="scheduler_project.outage")
    clock = FakeClock()
    outage = OutageLog(name="executor", grace_seconds=0.5, clock=clock)  # settles after 3 s
    refused = psycopg.OperationalError(
        "connection to the remote node cronyard@127.0.0.1:41867 failed with the following error: "
        "Connection refused"
    )
    for _ in range(20):
        outage.failed(refused)
        clock.now += 0.5
        outage.ok()
        clock.now += 0.5
    assert outage.away
    for _ in range(5):  # the worker is back: nothing fails any more
        outage.ok()
        clock.now += 1
    assert not outage.away
    assert lines(caplog, AWAY) == [
        "executor: database unreachable: Citus worker 127.0.0.1:41867 since 1.0s (connection to the remote "
        "node cronyard@127.0.0.1:41867 failed with the following error: Connection refused); retrying "
        "quietly until it is back"
    ]
    assert lines(caplog, BACK) == [
        "executor: database reachable again: Citus worker 127.0.0.1:41867 after 19.0s away"
        " (20 failed attempts)"
    ]


def test_a_worker_set_aside_is_retried_with_backoff_and_back_only_once_reached(caplog):
    # Batches grouped by worker leave a failed worker out: nothing fails on it any more,
    # which must not read as "back" (a new episode and a second away line would follow
    # at its next try), and it is tried again at growing intervals, not every batch.
    caplog.set_level(logging.DEBUG, logger="scheduler_project.outage")
    clock = FakeClock()
    outage = OutageLog(name="scheduler", grace_seconds=0.5, clock=clock)
    down, healthy = "127.0.0.1:41867", "127.0.0.1:41868"
    refused = psycopg.OperationalError(f"connection to the remote node cronyard@{down} failed: refused")
    tries = []
    for _step in range(300):  # 30 s of batches every 0.1 s
        if down not in outage.set_aside([down, healthy]):
            tries.append(clock.now)
            outage.failed(refused)
        outage.ok()  # the healthy worker's batch
        clock.now += 0.1
    assert outage.away
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    # Each try at the first batch after it is due (batches every 0.1 s).
    expected = [0.5, 1.0, 2.0, 4.0] + [8.0] * (len(gaps) - 4)
    assert len(gaps) >= 5 and gaps == pytest.approx(expected, abs=0.11), gaps
    assert outage.set_aside([healthy]) == set()
    clock.now += 8
    assert outage.set_aside([down]) == set()  # its try is due
    outage.reached([down])
    assert not outage.away and outage.set_aside([down]) == set()
    assert len(lines(caplog, AWAY)) == 1 and len(lines(caplog, BACK)) == 1
    assert f"Citus worker {down} after " in lines(caplog, BACK)[0]


def child_env(pg: PrivatePg) -> dict:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=pg.url,
        DJANGO_SETTINGS_MODULE="scheduler_project.settings",
        PYTHONUNBUFFERED="1",
        SCHEDULER_POLL_SECONDS="0.2",
        EXECUTOR_POLL_SECONDS="0.2",
        SCHEDULER_LEASE_SECONDS="3",
    )
    env.pop("TEST_DB_SUFFIX", None)
    return env


def test_an_error_that_is_not_about_the_connection_is_logged_every_time(caplog):
    caplog.set_level(logging.DEBUG, logger="scheduler_project.outage")
    clock = FakeClock()
    outage = OutageLog(name="executor", clock=clock)
    for _ in range(3):
        outage.failed(psycopg.errors.UndefinedColumn('column "x" does not exist'))
        clock.now += 1
        outage.ok()
    assert len(lines(caplog, 'column "x" does not exist')) == 3
    assert not outage.away and lines(caplog, AWAY) == []


@pytest.mark.processes
def test_processes_started_while_the_database_is_down_wait_for_it(tmp_path):
    pg = PrivatePg()
    try:
        pg.start()
        env = child_env(pg)
        pg.migrate(env)
        pg.stop()
        wait_port_closed(pg.url)
        processes = Processes(env, tmp_path)
        try:
            scheduler = processes.start("run_scheduler")
            executor = processes.start("run_executor")
            for proc in (scheduler, executor):
                wait_until(
                    lambda p=proc: AWAY in processes.log_of(p) or p.poll() is not None,
                    timeout=90,
                    what="the away line",
                )
                assert proc.poll() is None, processes.log_of(proc)[-3000:]
            pg.start()
            wait_until(lambda: "partitions node=" in processes.log_of(scheduler), timeout=60, what="a lease")
            wait_until(lambda: "started: concurrency" in processes.log_of(executor), timeout=60, what="start")
            for proc in (scheduler, executor):
                wait_until(lambda p=proc: BACK in processes.log_of(p), timeout=60, what="the back line")
                assert proc.poll() is None, processes.log_of(proc)[-3000:]
                assert processes.log_of(proc).count(AWAY) == 1
        finally:
            processes.stop_all()
    finally:
        pg.destroy()


@pytest.mark.processes
def test_processes_log_one_away_and_one_back_line_per_outage(tmp_path):
    pg = PrivatePg()
    try:
        pg.start()
        env = child_env(pg)
        pg.migrate(env)
        processes = Processes(env, tmp_path)
        try:
            scheduler = processes.start("run_scheduler")
            executor = processes.start("run_executor")
            wait_until(lambda: "partitions node=" in processes.log_of(scheduler), timeout=60, what="a lease")
            wait_until(lambda: "started: concurrency" in processes.log_of(executor), timeout=60, what="start")
            time.sleep(1)
            pg.stop()
            wait_port_closed(pg.url)
            # Long enough for many retries of every loop: lease ticks every second,
            # reconnects every second, claims every 0.2 s.
            time.sleep(8)
            pg.start()
            for proc in (scheduler, executor):
                wait_until(lambda p=proc: BACK in processes.log_of(p), timeout=60, what="the back line")
            time.sleep(3)  # room for a wrong second "away" line to show up
            for proc in (scheduler, executor):
                text = processes.log_of(proc)
                assert proc.poll() is None, text[-3000:]
                assert text.count(AWAY) == 1, text[-5000:]
                assert text.count(BACK) == 1, text[-5000:]
                away = float(re.search(rf"{BACK} after ([\d.]+)s away", text)[1])
                assert 5 < away < 60, text[-3000:]
                assert "database unreachable (" not in text and "reconnecting" not in text.split(BACK)[1]
        finally:
            processes.stop_all()
    finally:
        pg.destroy()


@pytest.fixture
def make_scheduler():
    from datetime import UTC, datetime

    from tests.support.scheduler import in_process_schedulers

    yield from in_process_schedulers(at=datetime.now(UTC))


@pytest.mark.django_db(transaction=True)
def test_a_scheduler_reports_an_unreachable_citus_worker_once_not_per_batch(make_scheduler, caplog):
    """While one Citus worker is down every dispatch batch that needs it fails, about once a
    second: the scheduler says so once (its outage log), not with a warning per batch; a
    batch that fails for another reason is still a warning every time."""
    from django.db import OperationalError

    caplog.set_level(logging.INFO)
    sched = make_scheduler()
    sched.step()  # leased and dispatching
    sched.lease.outage.settle_seconds = 0.3
    dispatch = sched.dispatch

    def unreachable(snap):
        cause = psycopg.OperationalError(
            "connection to the remote node cronyard@127.0.0.1:41867 failed with the following error: "
            "Connection refused"
        )
        raise OperationalError(str(cause)) from cause

    sched.dispatch = unreachable
    for _ in range(15):
        sched.step()
        time.sleep(0.1)
    sched.dispatch = dispatch
    sched.step()
    time.sleep(0.4)
    sched.step()
    assert lines(caplog, "dispatch failed") == []
    assert [line.split(" since ")[0] for line in lines(caplog, AWAY)] == [
        "scheduler: database unreachable: Citus worker 127.0.0.1:41867"
    ]
    assert len(lines(caplog, "reachable again: Citus worker 127.0.0.1:41867")) == 1

    def refused(snap):
        cause = psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
        raise OperationalError(str(cause)) from cause

    sched.dispatch = refused
    sched.step()
    sched.step()
    assert len(lines(caplog, "dispatch failed")) == 2
