"""Runs API: listing with filters and cursor pagination, tenant isolation, detail by run
key, replay and cancel (including two replays racing on the same dead run)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone
from urllib.parse import quote
from uuid import uuid4

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from runs import attempts, services
from runs.keys import format_utc, run_key
from runs.models import JobRun, JobRunRow
from runs.selectors import target_of
from tests.support.runsapi import make_dead_run, make_job, make_run, minute_slots

pytestmark = pytest.mark.django_db


def walk(api, url: str) -> tuple[list[dict], int]:
    items, pages = [], 0
    while url:
        response = api.get(url)
        assert response.status_code == 200, response.content
        body = response.json()
        items.extend(body["results"])
        pages += 1
        url = body["next"]
    return items, pages


def detail_path(run) -> str:
    return f"/api/v1/runs/{run.job_id}/{format_utc(run.scheduled_at)}/"


@pytest.fixture
def other_api(db):
    from jobs.tenant_services import create_tenant

    tenant, token = create_tenant(slug="other", max_concurrency=5)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    client.tenant = tenant
    return client


def test_cursor_walk_is_newest_first_without_duplicates_or_gaps(api, tenant):
    # 3 jobs x 40 minutes: every instant is shared by three runs, so ties are exercised.
    jobs = [make_job(tenant, f"job-{i}") for i in range(3)]
    for moment in minute_slots(40):
        for job in jobs:
            make_run(job, moment)
    assert JobRun.objects.count() == 120

    items, pages = walk(api, "/api/v1/runs/?page_size=25")
    assert pages == 5
    keys = [(r["job_id"], r["scheduled_at"]) for r in items]
    assert len(keys) == len(set(keys)) == 120
    expected = list(JobRun.objects.order_by("-scheduled_at", "-id").values_list("job_id", "scheduled_at"))
    assert keys == [(str(j), format_utc(s)) for j, s in expected]

    first = api.get("/api/v1/runs/").json()
    assert len(first["results"]) == 50 and first["previous"] is None and first["next"]
    second = api.get(first["next"]).json()
    assert second["previous"] and [r["url"] for r in api.get(second["previous"]).json()["results"]] == [
        r["url"] for r in first["results"]
    ]
    assert len(api.get("/api/v1/runs/?page_size=100000").json()["results"]) == 120  # capped at 500


def test_run_shape(api, tenant):
    job = make_job(tenant, "shape", priority=7)
    moment = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    make_run(job, moment, status="retrying", attempt=2, result_code=503, last_error="HTTP 503")
    (run,) = api.get("/api/v1/runs").json()["results"]
    assert run["job_id"] == str(job.id)
    assert run["job_name"] == "shape"
    assert run["scheduled_at"] == "2026-03-08T07:00:00Z"
    assert run["not_before"] == "2026-03-08T07:00:00Z"
    assert run["key"] == f"{job.id}/2026-03-08T07:00:00Z"
    assert (run["status"], run["trigger"], run["attempt"], run["priority"]) == ("retrying", "schedule", 2, 7)
    assert (run["result_code"], run["last_error"]) == (503, "HTTP 503")
    assert run["lease_until"] is None and run["started_at"] is None and run["finished_at"] is None
    assert run["url"] == f"http://testserver/api/v1/runs/{job.id}/2026-03-08T07:00:00Z/"
    assert "target" not in run  # the list stays light; the detail has the snapshot


def test_filters(api, tenant):
    a, b = make_job(tenant, "a"), make_job(tenant, "b")
    slots = minute_slots(10)  # newest first
    for i, moment in enumerate(slots):
        make_run(a, moment, status="dead" if i % 2 else "succeeded")
        make_run(b, moment, status="queued")

    def names(query: str) -> list[tuple[str, str]]:
        items, _ = walk(api, f"/api/v1/runs/?{query}")
        return [(r["job_name"], r["status"]) for r in items]

    assert len(names(f"job={a.id}")) == 10 and {n for n, _ in names(f"job={a.id}")} == {"a"}
    assert names("status=dead") == [("a", "dead")] * 5
    assert names(f"status=queued&job={a.id}") == []
    # after is inclusive, before exclusive: [slots[5], slots[2]) holds slots 5, 4, 3.
    after, before = quote(format_utc(slots[5])), quote(format_utc(slots[2]))
    window, _ = walk(api, f"/api/v1/runs/?job={b.id}&scheduled_after={after}&scheduled_before={before}")
    assert [r["scheduled_at"] for r in window] == [format_utc(slots[i]) for i in (3, 4, 5)]
    # An offset other than Z means the same instant.
    local = quote(slots[5].astimezone(timezone(timedelta(hours=-5))).isoformat())
    assert len(names(f"job={b.id}&scheduled_after={local}")) == 6


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=exploded", "status"),
        ("status=DEAD", "status"),
        ("job=not-a-uuid", "job"),
        ("job=123", "job"),
        ("scheduled_after=yesterday", "scheduled_after"),
        ("scheduled_before=2026-13-40T99:00:00Z", "scheduled_before"),
        ("scheduled_after=2026-03-09T00:00:00Z&scheduled_before=2026-03-08T00:00:00Z", "scheduled_before"),
    ],
)
def test_bad_filters_are_field_level_400s(api, tenant, query, field):
    response = api.get(f"/api/v1/runs/?{query}")
    assert response.status_code == 400, response.content
    body = response.json()
    assert list(body) == [field] and isinstance(body[field], list) and body[field][0]
    dead_letter = api.get(f"/api/v1/dead-letter/?{query}")
    assert dead_letter.status_code == 400 and list(dead_letter.json()) == [field]


@pytest.mark.parametrize("path", ["/api/v1/runs/", "/api/v1/dead-letter/"])
def test_run_filters_read_times_like_every_other_parameter(api, tenant, path):
    """One RFC 3339 reading for every time the API takes: a zone is required."""
    naive = api.get(path, {"scheduled_after": "2026-03-08T07:00:00"})
    assert naive.status_code == 400 and "UTC offset" in naive.json()["scheduled_after"][0], naive.content
    for value in ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "2026-03-08T07:00:00+05:30"):
        assert api.get(path, {"scheduled_after": value}).status_code == 200, value
        assert api.get(path, {"scheduled_before": value}).status_code == 200, value


def test_mangled_cursor_is_a_400(api, tenant):
    response = api.get("/api/v1/runs/?cursor=bz1ub3QtYW4taW50")
    assert response.status_code == 400 and list(response.json()) == ["cursor"]


def test_empty_filter_means_no_filter(api, tenant):
    make_run(make_job(tenant, "any"), minute_slots(1)[0])
    assert len(api.get("/api/v1/runs/?status=&job=&scheduled_after=").json()["results"]) == 1


def test_unauthenticated_is_401(db):
    assert APIClient().get("/api/v1/runs/").status_code == 401
    assert APIClient().post(f"/api/v1/runs/{uuid4()}/2026-03-08T07:00:00Z/replay").status_code == 401


def test_tenant_isolation(api, tenant, other_api):
    mine = make_run(make_job(tenant, "mine"), datetime(2026, 3, 8, 7, tzinfo=UTC), status="dead")
    theirs_job = make_job(other_api.tenant, "theirs")
    theirs = make_dead_run(theirs_job, datetime(2026, 3, 8, 7, tzinfo=UTC))

    assert [r["job_name"] for r in api.get("/api/v1/runs/").json()["results"]] == ["mine"]
    assert api.get(f"/api/v1/runs/?job={theirs_job.id}").json()["results"] == []
    assert [r["job_name"] for r in api.get("/api/v1/dead-letter/").json()["results"]] == ["mine"]
    assert api.get(detail_path(theirs)).status_code == 404
    assert api.post(detail_path(theirs) + "replay").status_code == 404
    assert api.post(detail_path(theirs) + "cancel").status_code == 404
    theirs.refresh_from_db()
    assert theirs.status == "dead"  # untouched
    assert other_api.get(detail_path(theirs)).status_code == 200
    assert other_api.get(detail_path(mine)).status_code == 404


def test_detail_by_key_in_every_spelling(api, tenant):
    job = make_job(tenant, "detail")
    whole = make_run(job, datetime(2026, 3, 8, 7, 0, tzinfo=UTC))
    micro = make_run(job, datetime(2026, 3, 8, 7, 0, 0, 123456, tzinfo=UTC), trigger="manual")
    base = f"/api/v1/runs/{job.id}"

    for path in (
        f"{base}/2026-03-08T07:00:00Z/",
        f"{base}/2026-03-08T07:00:00Z",
        f"{base}/2026-03-08T07%3A00%3A00Z/",
        f"{base}/2026-03-08T02:00:00-05:00/",
        f"{base}/2026-03-08T07:00:00.000000Z",
    ):
        response = api.get(path)
        assert response.status_code == 200, (path, response.content)
        assert response.json()["key"] == whole.run_key

    body = api.get(f"{base}/2026-03-08T07:00:00.123456Z/").json()
    assert body["scheduled_at"] == "2026-03-08T07:00:00.123456Z" and body["trigger"] == "manual"
    assert body["key"] == micro.run_key == run_key(job.id, micro.scheduled_at)
    assert body["url"].endswith(f"{base}/2026-03-08T07:00:00.123456Z/")
    assert body["replay_url"].endswith(f"{base}/2026-03-08T07:00:00.123456Z/replay")
    # What the list hands out works as is.
    for item in api.get(f"/api/v1/runs/?job={job.id}").json()["results"]:
        assert api.get(item["url"]).json()["key"] == item["key"]


def test_detail_has_redacted_target_and_attempts(api, tenant):
    run = make_dead_run(make_job(tenant, "secretive"), datetime(2026, 3, 8, 7, tzinfo=UTC), attempts=2)
    body = api.get(detail_path(run)).json()
    headers = body["target"]["headers"]
    assert (
        headers["Authorization"]
        == headers["X-Api-Key"]
        == headers["Cookie"]
        == headers["X-Auth-Token"]
        == "***"
    )
    assert headers["Content-Type"] == "application/json" and headers["X-Team"] == "blue"
    assert "abc123" not in body["target"]["url"] and "team=blue" in body["target"]["url"]
    assert "very-secret" not in str(body)
    assert [a["attempt"] for a in body["attempts"]] == [1, 2]
    assert body["attempts"][-1]["outcome"] == "dead"
    run.refresh_from_db()
    assert target_of(run)["headers"]["Authorization"] == "Bearer very-secret"  # the stored version is intact


def test_detail_errors(api, tenant):
    job = make_job(tenant, "errs")
    make_run(job, datetime(2026, 3, 8, 7, tzinfo=UTC))
    response = api.get(f"/api/v1/runs/{job.id}/not-a-time/")
    assert response.status_code == 400 and list(response.json()) == ["scheduled_at"]
    assert api.get(f"/api/v1/runs/{job.id}/2026-03-08T07:00:00/").status_code == 400  # no zone
    assert api.get(f"/api/v1/runs/{job.id}/2026-03-08T08:00:00Z/").status_code == 404
    assert api.get(f"/api/v1/runs/{uuid4()}/2026-03-08T07:00:00Z/").status_code == 404
    assert api.get("/api/v1/runs/not-a-uuid/2026-03-08T07:00:00Z/").status_code == 404
    assert api.post(f"/api/v1/runs/{job.id}/nope/replay").status_code == 400
    assert api.post(f"/api/v1/runs/{job.id}/2026-03-08T08:00:00Z/cancel").status_code == 404


def test_replay_dead_run_requeues_same_key_and_attempt(api, tenant):
    run = make_dead_run(make_job(tenant, "flaky"), datetime(2026, 3, 8, 7, tzinfo=UTC), attempts=5)
    history = list(run.attempts)
    response = api.post(detail_path(run) + "replay")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "queued" and body["trigger"] == "replay"
    assert body["attempt"] == 5 and body["attempts"] == attempts.history(run)
    assert body["key"] == run.run_key and body["finished_at"] is None and body["lease_until"] is None

    fresh = JobRun.objects.get(pk=run.pk)
    assert (fresh.status, fresh.attempt, fresh.attempts, fresh.trigger) == ("queued", 5, history, "replay")
    assert fresh.finished_at is None and fresh.not_before > run.not_before
    assert JobRun.objects.filter(job_id=run.job_id).count() == 1  # the same row, not a new one

    again = api.post(detail_path(run) + "replay/")
    assert again.status_code == 409
    assert again.json()["status"] == "queued" and "cannot replay" in again.json()["detail"]


def test_replay_rules(api, tenant):
    job = make_job(tenant, "rules")
    slots = minute_slots(4)
    cancelled = make_run(job, slots[0], status="cancelled", attempt=1, finished_at=slots[0])
    running = make_run(job, slots[1], status="running", attempt=1, owner="exec-1")
    succeeded = make_run(job, slots[2], status="succeeded", attempt=1)
    assert api.post(detail_path(cancelled) + "replay").json()["status"] == "queued"
    for run in (running, succeeded):
        response = api.post(detail_path(run) + "replay")
        assert response.status_code == 409 and response.json()["status"] == run.status
        run.refresh_from_db()
        assert run.trigger == "schedule"


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_replays_queue_the_run_once(tenant):
    """The first replay holds its row lock while the second starts: the second must wait,
    see the committed 'queued' and refuse, not queue the run a second time."""
    run = make_dead_run(make_job(tenant, "racy"), datetime(2026, 3, 8, 7, tzinfo=UTC))
    first_updated, outcomes = threading.Event(), {}

    def first():
        try:
            with transaction.atomic():
                services.replay_run(job_id=run.job_id, scheduled_at=run.scheduled_at, actor="first")
                first_updated.set()
                # Keep the transaction open while the second replay runs into the row lock.
                threading.Event().wait(0.5)
            outcomes["first"] = "queued"
        finally:
            connection.close()

    def second():
        try:
            first_updated.wait(5)
            services.replay_run(job_id=run.job_id, scheduled_at=run.scheduled_at, actor="second")
            outcomes["second"] = "queued"
        except services.RunConflict as exc:
            outcomes["second"] = f"conflict:{exc.status}"
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert outcomes == {"first": "queued", "second": "conflict:queued"}
    fresh = JobRun.objects.get(pk=run.pk)
    assert (fresh.status, fresh.attempt) == ("queued", run.attempt)


def test_cancel(api, tenant):
    job = make_job(tenant, "cancel-me")
    slots = minute_slots(5)
    queued = make_run(job, slots[0])
    retrying = make_run(job, slots[1], status="retrying", attempt=1)
    running = make_run(
        job,
        slots[2],
        status="running",
        attempt=2,
        owner="exec-9",
        started_at=slots[2],
        lease_until=slots[2] + timedelta(minutes=5),
        attempts=[{"attempt": 1, "outcome": "retry"}],
    )
    succeeded = make_run(job, slots[3], status="succeeded", attempt=1)

    body = api.post(detail_path(queued) + "cancel").json()
    assert body["status"] == "cancelled" and body["finished_at"] is not None
    # Who: the tenant and the prefix of the token used, as in the audit log.
    assert body["last_error"].startswith("cancelled by tenant:acme token:cy_")
    assert api.post(detail_path(retrying) + "cancel/").json()["status"] == "cancelled"

    body = api.post(detail_path(running) + "cancel").json()
    assert body["status"] == "cancelled" and body["lease_until"] is None and body["attempt"] == 2
    # The cut-short attempt is in the history (its own fenced write will never land).
    assert [a["outcome"] for a in body["attempts"]] == ["retry", "cancelled"]
    assert body["attempts"][-1]["attempt"] == 2 and body["attempts"][-1]["owner"] == "exec-9"

    response = api.post(detail_path(succeeded) + "cancel")
    assert response.status_code == 409 and response.json()["status"] == "succeeded"
    again = api.post(detail_path(queued) + "cancel")
    assert again.status_code == 409 and again.json()["status"] == "cancelled"
    succeeded.refresh_from_db()
    assert succeeded.status == "succeeded" and succeeded.last_error == ""


def test_the_attempt_a_cancel_cut_short_is_fenced(tenant):
    """The executor's completion is `WHERE status='running' AND attempt=n`; after a cancel
    the same statement matches nothing."""
    job = make_job(tenant, "fenced")
    run = make_run(job, minute_slots(1)[0], status="running", attempt=1, owner="exec-1")
    services.cancel_run(job_id=run.job_id, scheduled_at=run.scheduled_at, actor="ops")
    late = JobRunRow.objects.filter(pk=run.pk, status="running", attempt=1).update(status="succeeded")
    assert late == 0 and JobRun.objects.get(pk=run.pk).status == "cancelled"


def test_replay_and_cancel_are_post_only(api, tenant):
    run = make_dead_run(make_job(tenant, "verbs"), datetime(2026, 3, 8, 7, tzinfo=UTC))
    assert api.get(detail_path(run) + "replay").status_code == 405
    assert api.delete(detail_path(run)).status_code == 405
    run.refresh_from_db()
    assert run.status == "dead"
