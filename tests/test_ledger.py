"""The occurrence ledger: every due slot once, with one outcome.

Real database, the real scheduler step in-process on the database clock, the API
through DRF's client.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta

import pytest
from django.db import connection

from jobs.dispatch.scheduler import Scheduler
from jobs.models import Job
from runs.keys import format_utc
from runs.models import JobRunRow
from tests.conftest import database_url
from tests.support.scheduler import make_job

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = timedelta(minutes=1)


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def ledger(api, job_id, **params) -> list[dict]:
    """Every page of /occurrences, followed through the next links."""
    url = f"/api/v1/jobs/{job_id}/occurrences"
    query = {k: format_utc(v) if isinstance(v, datetime) else v for k, v in params.items()}
    out = []
    response = api.get(url, query)
    while True:
        assert response.status_code == 200, response.content
        body = response.json()
        out += body["results"]
        if not body["next"]:
            return out
        response = api.get(body["next"])


def outcomes(items: list[dict]) -> list[tuple[str, str, str | None]]:
    return [(i["scheduled_at"], i["outcome"], i["reason"]) for i in items]


@pytest.fixture
def scheduler():
    sched = Scheduler(
        node_id="ledger",
        conninfo=database_url(),
        heartbeat_thread=False,
        maintain_partitions=False,
        lease_seconds=30,
    )
    yield sched
    sched.close()


def backdate(job: Job, when: datetime) -> None:
    """The job has existed since `when` (created_at is set by the web host at insert)."""
    Job.objects.filter(pk=job.pk).update(created_at=when, schedule_since=when)
    job.refresh_from_db()


def test_runs_pause_resume_runs_again_lists_every_slot_once(api, scheduler):
    created = api.post(
        "/api/v1/jobs/",
        {
            "name": "every2",
            "interval_seconds": 2,
            "overlap_policy": "allow",
            "target": {"type": "task", "name": "noop"},
        },
        format="json",
    ).json()
    job_id = created["id"]
    start = db_now()

    def run_for(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            scheduler.lease.tick_now()
            scheduler.step()
            time.sleep(0.2)

    run_for(5)
    assert api.post(f"/api/v1/jobs/{job_id}/pause").status_code == 200
    time.sleep(8)
    assert api.post(f"/api/v1/jobs/{job_id}/resume", {}, format="json").status_code == 200
    run_for(5)
    end = db_now()

    items = ledger(api, job_id, **{"from": start - MINUTE, "to": end, "page_size": 3})
    times = [i["scheduled_at"] for i in items]
    assert len(times) == len(set(times)) and times == sorted(times)
    # Every 2 s slot from the first one to the last due one, once.
    first = datetime.fromisoformat(times[0].replace("Z", "+00:00"))
    expected = []
    t = first
    while t <= end:
        expected.append(format_utc(t))
        t += timedelta(seconds=2)
    assert times == expected
    kinds = Counter((i["outcome"], i["reason"]) for i in items)
    assert set(kinds) <= {("fired", None), ("skipped", "paused"), ("pending", None)}
    assert kinds[("skipped", "paused")] >= 3 and kinds[("fired", None)] >= 4
    for item in items:
        if item["outcome"] == "fired":
            assert item["run"]["trigger"] == "schedule" and item["run"]["url"].startswith("/api/v1/runs/")
        else:
            assert item["run"] is None
    # The paused slots form one block between fired ones.
    sequence = "".join(
        "P" if i["reason"] == "paused" else "F" if i["outcome"] == "fired" else "-" for i in items
    )
    assert "FP" in sequence and "PF" in sequence and sequence.count("FP") == 1


@pytest.mark.parametrize(
    ("policy", "extra", "expected"),
    [
        ("skip", {}, [("skipped", "misfire_skip")] * 11),
        ("run_once", {}, [("skipped", "misfire_coalesced")] * 10 + [("fired", None)]),
        ("catch_up", {"max_catch_up": 4}, [("fired", None)] * 4 + [("skipped", "catch_up_limit")] * 7),
    ],
)
def test_each_misfire_policy_gives_its_reasons(api, tenant, scheduler, policy, extra, expected):
    now = db_now()
    last = now.replace(second=0, microsecond=0)
    if (now - last).total_seconds() > 50:  # keep the minute from turning mid-test
        time.sleep(11)
        now = db_now()
        last = now.replace(second=0, microsecond=0)
    first = last - 10 * MINUTE
    job = make_job(tenant, next_run_at=first, misfire_policy=policy, **extra)
    backdate(job, first - MINUTE)
    scheduler.lease.tick_now()
    scheduler.step()
    items = ledger(api, job.id, **{"from": first, "to": last + timedelta(seconds=1)})
    assert [(i["outcome"], i["reason"]) for i in items] == expected
    assert [i["scheduled_at"] for i in items] == [format_utc(first + k * MINUTE) for k in range(11)]


def test_overlap_skip_and_buffer_full_come_from_the_run_rows(api, tenant):
    from jobs.dispatch.planning import run_for
    from runs.enqueue import enqueue_runs

    now = db_now()
    base = now.replace(second=0, microsecond=0) - 5 * MINUTE
    for policy, reason in (("skip", "overlap_skip"), ("buffer_one", "buffer_full")):
        job = make_job(tenant, next_run_at=now + MINUTE, overlap_policy=policy)
        backdate(job, base - MINUTE)
        enqueue_runs([run_for(job, scheduled_at=base, trigger="schedule")])
        JobRunRow.objects.filter(job_id=job.id).update(status="running")
        # buffer_one keeps one waiting run; the next one is the buffer that is full.
        for k in (1, 2):
            enqueue_runs([run_for(job, scheduled_at=base + k * MINUTE, trigger="schedule")])
        items = ledger(api, job.id, **{"from": base, "to": base + 3 * MINUTE})
        got = [(i["outcome"], i["reason"]) for i in items]
        assert got[0] == ("fired", None)
        assert (("skipped", reason) in got) and all(g in (("fired", None), ("skipped", reason)) for g in got)


def test_a_stopped_scheduler_shows_pending_then_overdue(api, tenant, settings):
    settings.SCHEDULER_OVERDUE_ALERT_SECONDS = 120
    now = db_now()
    first = now.replace(second=0, microsecond=0) - 4 * MINUTE
    job = make_job(tenant, next_run_at=first)
    backdate(job, first - MINUTE)
    items = ledger(api, job.id, **{"from": first})
    assert items and all(i["outcome"] == "pending" for i in items)
    by_age = {i["scheduled_at"]: i["reason"] for i in items}
    assert by_age[format_utc(first)] == "overdue"
    assert by_age[items[-1]["scheduled_at"]] is None  # the newest slot is not late yet


def test_a_schedule_edit_records_the_slots_it_left_behind(api, tenant):
    now = db_now()
    first = now.replace(second=0, microsecond=0) - 3 * MINUTE
    job = make_job(tenant, next_run_at=first, cron_expr="* * * * *")
    backdate(job, first - MINUTE)
    response = api.patch(f"/api/v1/jobs/{job.id}/", {"cron": "0 0 1 1 *"}, format="json")
    assert response.status_code == 200, response.content
    items = ledger(api, job.id, **{"from": first})
    # The old schedule's due slots are missed for that reason; the new one has none due yet.
    assert [(i["outcome"], i["reason"]) for i in items] == [("missed", "schedule_changed")] * len(items)
    assert len(items) in (4, 5) and items[0]["scheduled_at"] == format_utc(first)


def test_pages_over_a_long_paused_stretch_are_bounded_and_complete(api, tenant):
    """Three days of a minutely job: paused for most of it, a few runs."""
    from jobs.dispatch.planning import run_for
    from runs.enqueue import enqueue_runs

    now = db_now()
    begin = now.replace(second=0, microsecond=0) - timedelta(days=3)
    job = make_job(tenant, next_run_at=begin, cron_expr="* * * * *")
    backdate(job, begin - MINUTE)
    enqueue_runs([run_for(job, scheduled_at=begin + k * MINUTE, trigger="schedule") for k in range(30)])
    Job.objects.filter(pk=job.pk).update(next_run_at=begin + 30 * MINUTE)
    job.refresh_from_db()
    api.post(f"/api/v1/jobs/{job.id}/pause")
    Job.objects.filter(pk=job.pk).update(next_run_at=begin + 30 * MINUTE)  # paused since then
    api.post(f"/api/v1/jobs/{job.id}/resume", {}, format="json")
    started = time.monotonic()
    items = ledger(api, job.id, **{"from": begin, "to": now - MINUTE, "page_size": 1000})
    elapsed = time.monotonic() - started
    times = [i["scheduled_at"] for i in items]
    assert len(times) == len(set(times)) == 3 * 24 * 60  # [begin, now - 1 min): the last is a minute ago
    kinds = Counter(i["outcome"] for i in items)
    assert kinds == {"fired": 30, "skipped": len(times) - 30}
    print(f"ledger: {len(times)} occurrences in {len(times) // 1000 + 1} pages, {elapsed:.2f} s")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-01T00:00:00Z"}, "to"),
        ({"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "to"),
        ({"page_size": "0"}, "page_size"),
        ({"cursor": "not-a-time"}, "cursor"),
    ],
)
def test_bad_ledger_queries_are_400_naming_the_parameter(api, tenant, query, field):
    job = make_job(tenant, next_run_at=db_now() + MINUTE)
    response = api.get(f"/api/v1/jobs/{job.id}/occurrences", query)
    assert response.status_code == 400 and field in response.json(), response.content


def listed_runs(api, job_id) -> list[str]:
    """The slots /runs/?job= lists for a job, oldest first."""
    response = api.get("/api/v1/runs/", {"job": str(job_id), "page_size": 500})
    assert response.status_code == 200, response.content
    return sorted(r["scheduled_at"] for r in response.json()["results"])


def test_runs_stay_listed_when_start_at_moves_into_the_future(api, tenant):
    """Fired runs are history: a later start_at (the job's life as it is now) never hides them."""
    from jobs.dispatch.planning import run_for
    from runs.enqueue import enqueue_runs

    now = db_now()
    base = now.replace(second=0, microsecond=0) - 10 * MINUTE
    job = make_job(tenant, next_run_at=now + MINUTE, overlap_policy="allow")
    backdate(job, base - MINUTE)
    fired = [base + k * MINUTE for k in range(4)]
    enqueue_runs([run_for(job, scheduled_at=t, trigger="schedule") for t in fired])
    response = api.patch(
        f"/api/v1/jobs/{job.id}/", {"start_at": format_utc(now + timedelta(days=1))}, format="json"
    )
    assert response.status_code == 200, response.content

    items = ledger(api, job.id, **{"from": base - MINUTE})
    assert listed_runs(api, job.id) == [format_utc(t) for t in fired]
    # Exactly the runs: no computed slot before the new start_at, every run once.
    assert outcomes(items) == [(format_utc(t), "fired", None) for t in fired]


def test_runs_backfilled_before_the_job_existed_are_listed(api, tenant):
    """A backfill may fill a window before the job's creation: those runs exist, so the
    ledger lists them; the unfired slots of that window are not the job's (it did not exist)."""
    created = api.post(
        "/api/v1/jobs/",
        {"name": "late", "cron": "* * * * *", "target": {"type": "task", "name": "noop"}},
        format="json",
    )
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]
    now = db_now()
    start = now.replace(second=0, microsecond=0) - 30 * MINUTE
    window = {"start": format_utc(start), "end": format_utc(start + 3 * MINUTE)}
    response = api.post(f"/api/v1/jobs/{job_id}/backfill", window, format="json")
    assert response.status_code == 200 and response.json()["created"] == 4, response.content

    items = ledger(api, job_id, **{"from": start - MINUTE, "to": now - timedelta(seconds=1)})
    backfilled = [format_utc(start + k * MINUTE) for k in range(4)]
    assert listed_runs(api, job_id) == backfilled
    assert [(i["scheduled_at"], i["outcome"], i["run"]["trigger"]) for i in items] == [
        (t, "fired", "backfill") for t in backfilled
    ]


@pytest.mark.parametrize(
    ("query", "whole"),
    [
        ({"from": "0001-01-01T00:00:00Z"}, True),  # from the beginning
        ({"from": "0001-01-01T00:00:00Z", "to": "9999-12-31T23:59:59.999999Z"}, True),
        ({"to": "0001-01-01T12:00:00Z"}, False),  # a window before anything: empty
        ({"from": "0001-01-01T00:00:00Z", "to": "0001-01-01T12:00:00Z"}, False),
        ({"from": "9999-12-31T23:59:59.999999Z"}, False),
    ],
)
def test_windows_at_the_ends_of_the_calendar_are_clamped_not_500(api, tenant, query, whole):
    from jobs.dispatch.planning import run_for
    from runs.enqueue import enqueue_runs

    now = db_now()
    first = now.replace(second=0, microsecond=0) - 3 * MINUTE
    # Ended after its last run: no slot falls due while the test runs.
    job = make_job(tenant, next_run_at=now + MINUTE, end_at=first + 2 * MINUTE)
    backdate(job, first)
    enqueue_runs([run_for(job, scheduled_at=first + k * MINUTE, trigger="schedule") for k in range(3)])
    everything = outcomes(ledger(api, job.id, **{"from": first - MINUTE, "to": now + MINUTE}))
    assert everything == [(format_utc(first + k * MINUTE), "fired", None) for k in range(3)]
    api.raise_request_exception = False  # a crash must show as the 500 a client would get
    response = api.get(f"/api/v1/jobs/{job.id}/occurrences", {"page_size": 1000, **query})
    assert response.status_code == 200, response.content
    assert outcomes(response.json()["results"]) == (everything if whole else [])
