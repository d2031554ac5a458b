"""Runs reference an immutable version of their job's target instead of carrying a copy.

A run executes the version it was created with: its retries and replays too, whatever
edits came since; the next run takes the new one. A run written before target versions
existed (its own copy, no version) still executes that copy. Each claim here is the
executor's own statement on its own connection (tests/support/executor.claim_now).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.models import JobTarget
from jobs.services import create_job, delete_job, trigger_job, update_job
from runs.models import JobRun, JobRunRow
from runs.services import replay_run
from tests.support.executor import claim_now, http_spec

pytestmark = pytest.mark.django_db(transaction=True)

V1 = http_spec("https://hooks.example.com/v1", headers={"Authorization": "Bearer one"})
V2 = http_spec("https://hooks.example.com/v2", headers={"Authorization": "Bearer two"})


def versions(job) -> list[tuple[int, dict]]:
    return list(JobTarget.objects.filter(job_id=job.id).order_by("version").values_list("version", "target"))


def claimed_target(job_id) -> dict:
    (run,) = [r for r in claim_now(limit=50) if r.job_id == job_id]
    return run.target


def test_a_run_its_retry_and_its_replay_execute_the_version_it_was_created_with(tenant):
    job = create_job(tenant=tenant, fields={"name": "hook", "interval_seconds": 3600, "target": V1})
    v1 = job.target  # as stored: the rules fill in defaults
    assert versions(job) == [(1, v1)]
    first = trigger_job(job=job)
    run = JobRun.objects.get(job_id=job.id, scheduled_at=first)
    # The row holds the reference, not a copy of the target.
    assert (run.target, run.target_version) == (None, 1)

    job = update_job(job=job, changes={"target": V2})
    v2 = job.target
    assert v2["url"].endswith("/v2") and job.target_version == 2 and versions(job) == [(1, v1), (2, v2)]
    assert claimed_target(job.id) == v1

    # Dead, then replayed under the same key after the edit: still the version it was made with.
    JobRunRow.objects.filter(pk=run.pk).update(status="dead", lease_until=None, finished_at=datetime.now(UTC))
    replay_run(job_id=job.id, scheduled_at=first, actor="test")
    assert claimed_target(job.id) == v1

    JobRunRow.objects.filter(pk=run.pk).update(status="succeeded", lease_until=None)
    trigger_job(job=job)
    assert claimed_target(job.id) == v2


def test_an_edit_that_leaves_the_target_as_it_was_writes_no_version(tenant):
    job = create_job(tenant=tenant, fields={"name": "hook", "interval_seconds": 3600, "target": V1})
    stored = job.target
    job = update_job(job=job, changes={"target": dict(V1), "name": "renamed", "max_attempts": 2})
    assert job.target_version == 1 and versions(job) == [(1, stored)]


def test_a_run_written_before_target_versions_executes_its_own_copy(tenant):
    """What the upgrade leaves (runs migration 0018): old runs keep their copy and no version."""
    job = create_job(tenant=tenant, fields={"name": "hook", "interval_seconds": 3600, "target": V2})
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    JobRunRow.objects.create(
        job_id=job.id, tenant=tenant, partition_id=job.partition_id, scheduled_at=at, not_before=at,
        target=V1, target_version=None, job_name=job.name,
    )  # fmt: skip
    assert claimed_target(job.id) == V1


def test_deleting_a_job_deletes_its_target_versions(tenant):
    job = create_job(tenant=tenant, fields={"name": "hook", "interval_seconds": 3600, "target": V1})
    update_job(job=job, changes={"target": V2})
    delete_job(job=job)
    assert not JobTarget.objects.filter(job_id=job.id).exists()
