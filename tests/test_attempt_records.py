"""Every writer of the attempts history gives the same keys in the same formats
(runs/attempts.py), and readers render entries stored before that was true."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from runs import attempts
from runs.api.serializers import RunDetailSerializer
from runs.models import JobRun
from runs.services import cancel_run
from tests.support.executor import claim_now, queue_runs, reap_now, row, set_running, task_target

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
WHOLE_SECOND = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)


def assert_one_shape(entry: dict) -> None:
    assert set(entry) == set(attempts.FIELDS)
    for key in ("started_at", "finished_at"):
        assert entry[key] is None or STAMP.match(entry[key]), (key, entry[key])
    assert entry["duration_ms"] is None or isinstance(entry["duration_ms"], float)


def test_the_record_formats_timestamps_with_microseconds_even_when_zero():
    entry = attempts.AttemptRecord(
        attempt=1,
        owner="x",
        started_at=WHOLE_SECOND,
        finished_at=WHOLE_SECOND + timedelta(milliseconds=1500),
        duration_ms=1500,
        outcome="succeeded",
        result_code=200,
        error="",
        retry_in_s=None,
    ).to_json()
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
