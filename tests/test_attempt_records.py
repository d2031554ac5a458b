"""Every writer of the attempts history gives the same keys in the same formats
(runs/attempts.py), and readers render entries stored before that was true."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from runs import attempts
from runs.api.serializers import RunDetailSerializer
from runs.keys import format_utc
from runs.models import JobRun
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


def a_success(*, took_ms: float, duration_ms: float) -> dict:
    """The entry of a success that started at WHOLE_SECOND and finished `took_ms` later."""
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
    ).to_json()


def test_the_record_formats_timestamps_with_microseconds_even_when_zero():
    entry = a_success(took_ms=1500, duration_ms=1500)
    assert entry["started_at"] == "2026-03-08T07:00:00.000000Z"
    assert entry["finished_at"] == "2026-03-08T07:00:01.500000Z"
    assert entry["duration_ms"] == 1500.0
    assert_one_shape(entry)


def test_an_operator_cancel_writes_the_shared_shape(tenant):
    (key,) = queue_runs(tenant, task_target("noop"))
    JobRun.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
        status="running", attempt=1, owner="w:1", started_at=WHOLE_SECOND, lease_until=datetime.now(UTC)
    )
    cancel_run(job_id=key[0], scheduled_at=key[1], actor="ops", now=WHOLE_SECOND + timedelta(seconds=2))
    entry = row(key).attempts[-1]
    assert_one_shape(entry)
    assert entry["started_at"] == "2026-03-08T07:00:00.000000Z" and entry["duration_ms"] == 2000.0


@pytest.mark.django_db(transaction=True)
def test_a_reaped_lease_writes_the_shared_shape(tenant):
    (key,) = queue_runs(tenant, task_target("noop"), not_before=datetime.now(UTC) + timedelta(days=1))
    set_running(key, lease=timedelta(seconds=-60))
    assert len(reap_now()) == 1
    entry = row(key).attempts[-1]
    assert_one_shape(entry)
    assert (entry["outcome"], entry["finished_at"], entry["retry_in_s"]) == ("lease expired", None, 0)


@pytest.mark.django_db(transaction=True)
def test_a_cancel_by_a_newer_run_writes_the_shared_shape_with_its_duration(tenant):
    job = uuid.uuid4()
    older, newer = queue_runs(
        tenant, task_target("noop"), count=2, job_id=job, overlap_policy="cancel_previous"
    )
    set_running(older)
    JobRun.objects.filter(job_id=older[0], scheduled_at=older[1]).update(
        started_at=datetime.now(UTC) - timedelta(seconds=3)
    )
    assert [r.scheduled_at for r in claim_now()] == [newer[1]]
    entry = row(older).attempts[-1]
    assert_one_shape(entry)
    assert entry["outcome"] == "cancelled" and entry["duration_ms"] >= 3000


def test_entries_stored_in_older_shapes_still_render(tenant):
    (key,) = queue_runs(tenant, task_target("noop"))
    old = {"attempt": 1, "owner": "w:1", "started_at": "2026-03-08T07:00:00Z", "outcome": "succeeded"}
    JobRun.objects.filter(job_id=key[0], scheduled_at=key[1]).update(attempts=[old, "garbage"])
    (shown,) = RunDetailSerializer(row(key)).data["attempts"]
    assert tuple(shown) == attempts.FIELDS
    assert shown["started_at"] == "2026-03-08T07:00:00Z" and shown["retry_in_s"] is None


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
    assert [(a["attempt"], a["outcome"]) for a in run.attempts] == [(1, "retry"), (2, "succeeded")]
    shown = detail(api, key)["attempts"]
    assert shown == run.attempts
    assert shown[1]["duration_ms"] is not None and shown[1]["result_code"] == 200
    assert console_table(admin_client, run).count("<tr>") == 3


@pytest.mark.django_db(transaction=True)
def test_a_dead_run_shows_its_stored_history(api, steps, tenant, http_target):
    http_target.script("/gone", then=Reply(503))
    (key,) = queue_runs(tenant, http_spec(http_target.url("/gone")), max_attempts=1)
    s = steps()
    run_once(s)
    run = row(key)
    assert run.status == "dead" and [a["outcome"] for a in run.attempts] == ["dead"]
    assert detail(api, key)["attempts"] == run.attempts


@pytest.mark.django_db(transaction=True)
def test_a_reaped_run_that_then_succeeds_keeps_the_expiry_and_the_success(api, steps, tenant, http_target):
    (key,) = queue_runs(tenant, http_spec(http_target.url("/ok")))
    set_running(key, lease=timedelta(seconds=-60))
    assert len(reap_now()) == 1
    reaped = row(key)
    assert [a["outcome"] for a in reaped.attempts] == ["lease expired"]
    assert detail(api, key)["attempts"] == reaped.attempts
    JobRun.objects.filter(job_id=key[0], scheduled_at=key[1]).update(not_before=datetime.now(UTC))
    run_once(steps())
    run = row(key)
    assert run.status == "succeeded"
    assert [(a["attempt"], a["outcome"]) for a in run.attempts] == [(1, "lease expired"), (2, "succeeded")]
    assert detail(api, key)["attempts"] == run.attempts


def test_a_success_stored_before_the_rule_reads_as_stored(tenant):
    (key,) = queue_runs(tenant, task_target("noop"))
    # Its duration differs from its columns' (12.34 vs 20 ms): what is shown is what is stored.
    stored = a_success(took_ms=20, duration_ms=12.34)
    JobRun.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
        status="succeeded", attempt=1, owner="w:1", started_at=WHOLE_SECOND, attempts=[stored]
    )
    assert attempts.history(row(key)) == [stored]
