"""Every writer of the attempts history stores the same values in the same formats
(runs/attempts.py), and readers render entries stored in older shapes."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from runs import attempts
from runs.api.serializers import RunDetailSerializer
from runs.keys import format_utc
from runs.models import JobRun, JobRunRow
from runs.services import cancel_run
from tests.support.executor import (
    claim_now,
    http_spec,
    queue_runs,
    reap_now,
    row,
    set_running,
    task_target,
)
from tests.support.http_target import Reply

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
WHOLE_SECOND = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)


def assert_one_shape(entry: dict) -> None:
    assert set(entry) == set(attempts.FIELDS)
    for key in ("started_at", "finished_at"):
        assert entry[key] is None or STAMP.match(entry[key]), (key, entry[key])
    assert entry["duration_ms"] is None or isinstance(entry["duration_ms"], float)


def stored(entry: object) -> dict:
    """A stored entry, checked to be in today's shape, as readers show it."""
    assert isinstance(entry, list) and len(entry) == len(attempts.FIELDS), entry
    for key in ("started_at", "finished_at"):
        value = entry[attempts.FIELDS.index(key)]
        assert value is None or isinstance(value, int), (key, value)
    shown = attempts.from_stored(entry)
    assert_one_shape(shown)
    return shown


def a_success(*, took_ms: float, duration_ms: float) -> attempts.AttemptRecord:
    """The record of a success that started at WHOLE_SECOND and finished `took_ms` later."""
    return attempts.AttemptRecord(
        attempt=1,
        owner="w:1",
        started_at=WHOLE_SECOND,
        finished_at=WHOLE_SECOND + timedelta(milliseconds=took_ms),
        duration_ms=duration_ms,
        outcome="succeeded",
        result_code=200,
        error="",
        retry_in_s=None,
    )


def test_the_record_formats_timestamps_with_microseconds_even_when_zero():
    entry = a_success(took_ms=1500, duration_ms=1500).to_display()
    assert entry["started_at"] == "2026-03-08T07:00:00.000000Z"
    assert entry["finished_at"] == "2026-03-08T07:00:01.500000Z"
    assert entry["duration_ms"] == 1500.0
    assert_one_shape(entry)


def test_a_stored_entry_is_an_array_that_reads_back_as_the_record_shows_it():
    record = a_success(took_ms=1500.0017, duration_ms=1500.04)
    entry = record.to_stored()
    # Exact microseconds, not a float's approximation of them.
    assert entry[2:4] == [1772953200000000, 1772953201500002]
    assert stored(entry) == record.to_display()
    assert attempts.from_micros(entry[3]) == record.finished_at


def test_the_array_is_smaller_than_the_object_it_replaces(db):
    record = attempts.AttemptRecord(
        attempt=1,
        owner="vm:13468:39c547",
        started_at=WHOLE_SECOND,
        finished_at=WHOLE_SECOND + timedelta(milliseconds=73.4),
        duration_ms=73.4,
        outcome="retry",
        result_code=503,
        error="HTTP 503: try again",
        retry_in_s=0.445,
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_column_size(%s::jsonb), pg_column_size(%s::jsonb)",
            [json.dumps(record.to_stored()), json.dumps(record.to_display())],
        )
        array, obj = cursor.fetchone()
    assert array < obj * 0.6, (array, obj)


def test_an_operator_cancel_writes_the_shared_shape(tenant):
    (key,) = queue_runs(tenant, task_target("noop"))
    JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
        status="running", attempt=1, owner="w:1", started_at=WHOLE_SECOND, lease_until=datetime.now(UTC)
    )
    cancel_run(job_id=key[0], scheduled_at=key[1], actor="ops", now=WHOLE_SECOND + timedelta(seconds=2))
    entry = stored(row(key).attempts[-1])
    assert entry["started_at"] == "2026-03-08T07:00:00.000000Z" and entry["duration_ms"] == 2000.0


@pytest.mark.django_db(transaction=True)
def test_a_reaped_lease_writes_the_shared_shape(tenant):
    (key,) = queue_runs(tenant, task_target("noop"), not_before=datetime.now(UTC) + timedelta(days=1))
    set_running(key, lease=timedelta(seconds=-60))
    assert len(reap_now()) == 1
    entry = stored(row(key).attempts[-1])
    assert (entry["outcome"], entry["finished_at"], entry["retry_in_s"]) == ("lease expired", None, 0)


@pytest.mark.django_db(transaction=True)
def test_a_cancel_by_a_newer_run_writes_the_shared_shape_with_its_duration(tenant):
    job = uuid.uuid4()
    older, newer = queue_runs(
        tenant, task_target("noop"), count=2, job_id=job, overlap_policy="cancel_previous"
    )
    set_running(older)
    JobRunRow.objects.filter(job_id=older[0], scheduled_at=older[1]).update(
        started_at=datetime.now(UTC) - timedelta(seconds=3)
    )
    assert [r.scheduled_at for r in claim_now()] == [newer[1]]
    entry = stored(row(older).attempts[-1])
    assert entry["outcome"] == "cancelled" and entry["duration_ms"] >= 3000


def test_entries_stored_in_older_shapes_still_render(tenant):
    (key,) = queue_runs(tenant, task_target("noop"))
    old = {"attempt": 1, "owner": "w:1", "started_at": "2026-03-08T07:00:00Z", "outcome": "retry"}
    # An array shorter than FIELDS (written before a later field) and one longer (by a
    # later version) read by position.
    short = [2, "w:1", 1772953200000000, None, None, "retry"]
    long = [3, "w:2", None, None, None, "dead", 500, "HTTP 500", None, "a later field"]
    JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
        attempts=[old, "garbage", short, long]
    )
    shown = RunDetailSerializer(row(key)).data["attempts"]
    assert [tuple(e) for e in shown] == [attempts.FIELDS] * 3
    assert shown[0]["started_at"] == "2026-03-08T07:00:00Z" and shown[0]["retry_in_s"] is None
    assert shown[1]["started_at"] == "2026-03-08T07:00:00.000000Z" and shown[1]["error"] is None
    assert (shown[2]["outcome"], shown[2]["error"]) == ("dead", "HTTP 500")


# --- a first success stores no entry; every reader shows the same history ------------------


def detail(api, key) -> dict:
    response = api.get(f"/api/v1/runs/{key[0]}/{format_utc(key[1])}/")
    assert response.status_code == 200, response.content
    return response.json()


def console_table(admin_client, run: JobRun) -> str:
    page = admin_client.get(f"/admin/runs/jobrun/{run.pk}/change/").content.decode()
    (table,) = re.findall(r'<table class="attempts">.*?</table>', page, re.S)
    return table


def run_once(s, *, write: bool = True) -> None:
    s.run(s.executor.claim_once())
    s.calls_done()
    if write:
        s.run(s.executor.write_outcomes_once())


@pytest.mark.django_db(transaction=True)
def test_a_first_attempt_success_stores_no_entry_and_shows_the_one_its_columns_say(
    api, admin_client, steps, tenant, http_target
):
    (key,) = queue_runs(tenant, http_spec(http_target.url("/ok")))
    s = steps()
    run_once(s)
    run = row(key)
    assert run.status == "succeeded"
    assert run.attempts == []  # nothing stored: the columns below say it
    (shown,) = detail(api, key)["attempts"]
    assert tuple(shown) == attempts.FIELDS
    assert_one_shape(shown)
    duration = round((run.finished_at - run.started_at).total_seconds() * 1000, 1)
    assert shown == {
        "attempt": 1,
        "owner": s.executor.owner,
        "started_at": attempts.format_moment(run.started_at),
        "finished_at": attempts.format_moment(run.finished_at),
        "duration_ms": duration,
        "outcome": "succeeded",
        "result_code": 200,
        "error": "",
        "retry_in_s": None,
    }
    assert (run.owner, run.result_code, run.attempt) == (s.executor.owner, 200, 1)
    table = console_table(admin_client, run)
    assert table.count("<tr>") == 2 and "succeeded" in table and s.executor.owner in table


@pytest.mark.django_db(transaction=True)
def test_a_retried_then_succeeded_run_keeps_its_whole_history_with_the_success(
    api, admin_client, steps, tenant, http_target
):
    http_target.script("/flaky", Reply(503), then=Reply(200))
    (key,) = queue_runs(
        tenant, http_spec(http_target.url("/flaky")), retry_backoff_seconds=0, retry_backoff_cap_seconds=0
    )
    s = steps()
    run_once(s)
    assert row(key).status == "retrying"
    run_once(s)
    run = row(key)
    assert run.status == "succeeded"
    assert [(a["attempt"], a["outcome"]) for a in map(stored, run.attempts)] == [
        (1, "retry"),
        (2, "succeeded"),
    ]
    shown = detail(api, key)["attempts"]
    assert shown == attempts.history(run) == [stored(a) for a in run.attempts]
    assert shown[1]["duration_ms"] is not None and shown[1]["result_code"] == 200
    assert console_table(admin_client, run).count("<tr>") == 3


@pytest.mark.django_db(transaction=True)
def test_a_dead_run_shows_its_stored_history(api, steps, tenant, http_target):
    http_target.script("/gone", then=Reply(503))
    (key,) = queue_runs(tenant, http_spec(http_target.url("/gone")), max_attempts=1)
    s = steps()
    run_once(s)
    run = row(key)
    assert run.status == "dead" and [stored(a)["outcome"] for a in run.attempts] == ["dead"]
    assert detail(api, key)["attempts"] == attempts.history(run)


@pytest.mark.django_db(transaction=True)
def test_a_reaped_run_that_then_succeeds_keeps_the_expiry_and_the_success(api, steps, tenant, http_target):
    (key,) = queue_runs(tenant, http_spec(http_target.url("/ok")))
    set_running(key, lease=timedelta(seconds=-60))
    assert len(reap_now()) == 1
    reaped = row(key)
    assert [stored(a)["outcome"] for a in reaped.attempts] == ["lease expired"]
    assert detail(api, key)["attempts"] == attempts.history(reaped)
    JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(not_before=datetime.now(UTC))
    run_once(steps())
    run = row(key)
    assert run.status == "succeeded"
    assert [(a["attempt"], a["outcome"]) for a in map(stored, run.attempts)] == [
        (1, "lease expired"),
        (2, "succeeded"),
    ]
    assert detail(api, key)["attempts"] == attempts.history(run)


def test_a_success_stored_before_the_rule_reads_as_stored(tenant):
    (key,) = queue_runs(tenant, task_target("noop"))
    # Its duration differs from its columns' (12.34 vs 20 ms): what is shown is what is
    # stored, as an object (the shape of those rows).
    success = a_success(took_ms=20, duration_ms=12.34).to_display()
    JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
        status="succeeded", attempt=1, owner="w:1", started_at=WHOLE_SECOND, attempts=[success]
    )
    assert attempts.history(row(key)) == [success]
