"""GET /dead-letter/: the tenant's dead runs with what was sent (secrets redacted), every
attempt, the last error, and a replay link that works."""

from __future__ import annotations

import pytest

from runs.attempts import history
from runs.keys import run_key
from runs.models import JobRun
from runs.target_secrets import redact_target
from tests.support.http_target import Reply
from tests.support.runsapi import make_dead_run, make_job, make_run, minute_slots

pytestmark = pytest.mark.django_db


def test_dead_letter_lists_only_dead_runs_newest_first(api, tenant):
    job, other = make_job(tenant, "webhook"), make_job(tenant, "report")
    slots = minute_slots(6)
    make_dead_run(job, slots[3], attempts=5)
    make_dead_run(other, slots[1], attempts=2)
    make_dead_run(job, slots[0], attempts=3)
    # Every other status, some newer than the dead runs: none of them is dead-letter.
    make_run(job, slots[5], status="queued")
    make_run(other, slots[2], status="running", attempt=1)
    make_run(other, slots[4], status="retrying", attempt=2)
    make_run(job, slots[4], status="succeeded")
    make_run(job, slots[2], status="skipped")
    make_run(other, slots[5], status="cancelled")
    make_run(other, slots[0], status="succeeded")

    body = api.get("/api/v1/dead-letter/").json()
    results = body["results"]
    assert [(r["job_name"], r["scheduled_at"]) for r in results] == [
        ("webhook", slots[0].strftime("%Y-%m-%dT%H:%M:%SZ")),
        ("report", slots[1].strftime("%Y-%m-%dT%H:%M:%SZ")),
        ("webhook", slots[3].strftime("%Y-%m-%dT%H:%M:%SZ")),
    ]
    assert {r["status"] for r in results} == {"dead"}
    assert body["next"] is None

    first = results[0]
    assert first["attempt"] == 3 and len(first["attempts"]) == 3
    assert [a["outcome"] for a in first["attempts"]] == ["retry", "retry", "dead"]
    assert first["last_error"] == "HTTP 500" and first["result_code"] == 500
    assert first["replay_url"] == f"http://testserver/api/v1/runs/{job.id}/{first['scheduled_at']}/replay"

    only_report = api.get(f"/api/v1/dead-letter?job={other.id}").json()["results"]
    assert [r["job_name"] for r in only_report] == ["report"]


def test_dead_letter_payload_is_redacted(api, tenant):
    make_dead_run(make_job(tenant, "secretive"), minute_slots(1)[0])
    (entry,) = api.get("/api/v1/dead-letter/").json()["results"]
    target = entry["target"]
    assert target["headers"] == {
        "Authorization": "***",
        "X-Api-Key": "***",
        "Cookie": "***",
        "X-Auth-Token": "***",
        "Content-Type": "application/json",
        "X-Team": "blue",
    }
    assert target["url"] == "https://hooks.example.com/run?token=***&team=blue"
    assert (target["method"], target["body"], target["timeout_seconds"]) == ("POST", '{"hello": "world"}', 10)
    for secret in ("very-secret", "k-123", "session=s1", "t-1", "abc123"):
        assert secret not in str(entry)


def test_redaction_of_other_target_shapes():
    assert redact_target(
        {
            "type": "http",
            "url": "https://bob:hunter2@example.com/x?api_key=1&a=2",
            "headers": [["Cookie", "c"]],
        }
    ) == {
        "type": "http",
        "url": "https://bob:***@example.com/x?api_key=***&a=2",
        "headers": [["Cookie", "***"]],
    }
    assert redact_target({"type": "task", "name": "send", "kwargs": {"password": "p", "to": "x@y"}}) == {
        "type": "task",
        "name": "send",
        "kwargs": {"password": "***", "to": "x@y"},
    }
    assert (
        redact_target({"type": "http", "url": "https://example.com/plain"})["url"]
        == "https://example.com/plain"
    )
    assert redact_target(None) == {}


def test_replay_from_the_dead_letter_queue(api, tenant):
    make_dead_run(make_job(tenant, "retry-me"), minute_slots(1)[0], attempts=4)
    (entry,) = api.get("/api/v1/dead-letter/").json()["results"]
    response = api.post(entry["replay_url"])
    assert response.status_code == 200 and response.json()["status"] == "queued"
    assert api.get("/api/v1/dead-letter/").json()["results"] == []
    run = JobRun.objects.get()
    assert (run.status, run.attempt, len(run.attempts)) == ("queued", 4, 4)


def test_dead_letter_paginates(api, tenant):
    job = make_job(tenant, "many")
    for moment in minute_slots(7):
        make_dead_run(job, moment)
    page = api.get("/api/v1/dead-letter/?page_size=3").json()
    seen = [r["scheduled_at"] for r in page["results"]]
    while page["next"]:
        page = api.get(page["next"]).json()
        seen += [r["scheduled_at"] for r in page["results"]]
    assert len(seen) == len(set(seen)) == 7 and seen == sorted(seen, reverse=True)


@pytest.mark.processes
def test_dead_run_replayed_through_the_api_runs_again_under_the_same_key(processes, http_target, api, tenant):
    """End to end with a real executor: a 400 makes the run dead; after the API replay the
    executor calls again with the same Idempotency-Key and the next attempt number."""
    from tests.support.executor import http_spec, queue_runs, wait_status

    http_target.script("/once", Reply(400, body=b"not yet"), then=Reply(200))
    (key,) = queue_runs(tenant, http_spec(http_target.url("/once")), job_name="replayed")
    processes.start("run_executor")
    dead = wait_status(key, "dead")
    assert dead.attempt == 1
    (entry,) = api.get("/api/v1/dead-letter/").json()["results"]
    assert entry["key"] == run_key(*key) and entry["attempts"][0]["result_code"] == 400

    assert api.post(entry["replay_url"]).status_code == 200
    done = wait_status(key, "succeeded")
    assert done.attempt == 2 and done.trigger == "replay" and done.result_code == 200
    assert [a["outcome"] for a in history(done)] == ["dead", "succeeded"]
    first, second = http_target.received("/once")
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"] == run_key(*key)
    assert (first.headers["x-run-attempt"], second.headers["x-run-attempt"]) == ("1", "2")
    assert api.get("/api/v1/dead-letter/").json()["results"] == []
