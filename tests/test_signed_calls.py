"""Signed HTTP calls, checked the way a target checks them: with the Standard Webhooks
specification's own library (the `standardwebhooks` package), never with our code. Real
executor processes, a real HTTP target on 127.0.0.1, secrets as `create_tenant` prints
them, and the rotation through the API of the real web server."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path

import pytest
import requests
import time_machine
from django.core.management import call_command
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from jobs.models import Tenant
from runs.keys import parse_utc, run_key
from runs.services import replay_run
from tests.support.executor import http_spec, queue_runs, wait_status
from tests.support.http_target import Received, Reply

pytestmark = pytest.mark.processes

# The library's own tolerance for a message's age (standardwebhooks.webhooks).
TOLERANCE = timedelta(minutes=5)
SIGNING_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def created(slug: str) -> tuple[Tenant, str, str]:
    """A tenant made by `manage.py create_tenant`, with the signing secret and the API
    token it printed."""
    out = StringIO()
    call_command("create_tenant", slug, "--max-concurrency", "50", stdout=out)
    lines = out.getvalue().strip().splitlines()
    (secret,) = [
        line.removeprefix("signing secret: ") for line in lines if line.startswith("signing secret:")
    ]
    return Tenant.objects.get(slug=slug), secret, lines[-1]


def verify(secret: str, call: Received) -> None:
    Webhook(secret).verify(call.body, call.headers, json_parse=False)


def refusal(secret: str, body: bytes, headers: dict[str, str]) -> str:
    with pytest.raises(WebhookVerificationError) as refused:
        Webhook(secret).verify(body, headers, json_parse=False)
    return str(refused.value)


def readme_verifier(secret: str) -> str:
    """The verifier README.md shows (section "Verifying calls"), with `secret` in it."""
    section = (
        (Path(__file__).resolve().parent.parent / "README.md").read_text().split("## Verifying calls")[1]
    )
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert code.count("\n") == 5 and '"whsec_..."' in code
    return code.replace('"whsec_..."', repr(secret))


def signatures(call: Received) -> list[str]:
    return call.headers["webhook-signature"].split(" ")


def assert_no_secret(text: str, secrets: list[str], where: str) -> None:
    for secret in secrets:
        assert secret not in text, f"a signing secret leaked in {where}"
        assert secret.removeprefix("whsec_") not in text, f"a signing secret's key leaked in {where}"


def test_every_call_is_signed_and_verifies_with_the_standard_library(processes, http_target):
    tenant, secret, _ = created("signed")
    _, other_secret, _ = created("other")
    http_target.script("/flaky", Reply(503), then=Reply(200))
    json_target = {**http_spec(http_target.url("/json")), "body": {"report": "daily", "n": 1}}
    text_target = {
        **http_spec(http_target.url("/text"), method="PUT"),
        "body": "plain ünïcode text",
        "headers": {"Content-Type": "text/plain; charset=utf-8"},
    }
    # Stored before these names were reserved (queued straight, past the API's rules):
    # ours replace them, whatever their case, rather than go out beside them.
    legacy_headers = {"Webhook-Signature": "v1,forged", "WEBHOOK-ID": "forged", "webhook-timestamp": "1"}
    legacy_target = {**http_spec(http_target.url("/legacy")), "headers": legacy_headers}
    keys = {
        "/json": queue_runs(tenant, json_target)[0],
        "/text": queue_runs(tenant, text_target)[0],
        "/empty": queue_runs(tenant, http_spec(http_target.url("/empty"), method="GET"))[0],
        "/flaky": queue_runs(
            tenant, http_spec(http_target.url("/flaky")), retry_backoff_seconds=0, retry_backoff_cap_seconds=0
        )[0],
        "/legacy": queue_runs(tenant, legacy_target)[0],
    }
    started = int(time.time())
    proc = processes.start("run_executor")
    for key in keys.values():
        wait_status(key, "succeeded")
    finished = int(time.time()) + 1

    calls = {path: http_target.received(path) for path in keys}
    assert [len(c) for c in calls.values()] == [1, 1, 1, 2, 1]
    assert json.loads(calls["/json"][0].body) == {"report": "daily", "n": 1}
    assert calls["/text"][0].body == "plain ünïcode text".encode()
    assert calls["/empty"][0].body == b"" and calls["/empty"][0].method == "GET"
    for path, key in keys.items():
        for attempt, call in enumerate(calls[path], start=1):
            # The run key with its attempt: unique per attempt, ASCII.
            assert call.headers["webhook-id"] == f"{run_key(*key)}#{attempt}"
            assert call.headers["webhook-id"].isascii()
            assert call.headers["idempotency-key"] == run_key(*key)
            assert started <= int(call.headers["webhook-timestamp"]) <= finished
            assert len(signatures(call)) == 1  # no rotation: one secret signs
            names = [name.lower() for name, _ in call.header_lines]
            assert [names.count(h) for h in SIGNING_HEADERS] == [1, 1, 1], path
            verify(secret, call)
            # Another tenant's secret, or one byte changed, and the library refuses.
            assert refusal(other_secret, call.body, call.headers) == "No matching signature found"
            assert refusal(secret, call.body + b" ", call.headers) == "No matching signature found"
    # README.md's five lines verify a call as the library does.
    (call,) = calls["/json"]
    exec(readme_verifier(secret), {"body": call.body, "headers": call.headers})
    with pytest.raises(WebhookVerificationError):
        exec(readme_verifier(other_secret), {"body": call.body, "headers": call.headers})
    first, second = calls["/flaky"]
    assert first.headers["webhook-id"] != second.headers["webhook-id"]
    assert_no_secret(processes.log_of(proc), [secret, other_secret], "the executor log")


def test_a_replayed_call_older_than_the_tolerance_is_rejected_by_the_library(processes, http_target):
    tenant, secret, _ = created("replayed")
    http_target.script("/once", Reply(400), then=Reply(200))  # dead at once: an operator may replay it
    (key,) = queue_runs(tenant, {**http_spec(http_target.url("/once")), "body": {"x": 1}})
    processes.start("run_executor")
    wait_status(key, "dead")
    (call,) = http_target.received("/once")
    sent = datetime.fromtimestamp(int(call.headers["webhook-timestamp"]), UTC)

    # The same bytes and headers sent again later (a captured request replayed by
    # someone else): accepted while within the library's tolerance, refused after it.
    with time_machine.travel(sent + TOLERANCE - timedelta(seconds=5), tick=False):
        verify(secret, call)
    with time_machine.travel(sent + TOLERANCE + timedelta(seconds=1), tick=False):
        assert refusal(secret, call.body, call.headers) == "Message timestamp too old"

    # An operator's replay is a new attempt: a new webhook-id, a fresh timestamp.
    replay_run(job_id=key[0], scheduled_at=key[1], actor="test")
    wait_status(key, "succeeded")
    _, again = http_target.received("/once")
    assert again.headers["webhook-id"] == f"{run_key(*key)}#2" != call.headers["webhook-id"]
    verify(secret, again)


def test_a_rotation_signs_with_both_secrets_during_the_overlap_then_with_the_new_one(
    processes, http_target, web_server
):
    tenant, old, token = created("rotating")
    bystander, bystander_secret, _ = created("bystander")
    rotate = web_server.url + "/api/v1/signing-secret/rotate"
    asked = datetime.now(UTC)
    answer = requests.post(rotate, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["Cache-Control"] == "no-store"
    body = answer.json()
    assert set(body) == {"secret", "previous_valid_until"}
    new = body["secret"]
    assert new.startswith("whsec_") and new != old
    # SIGNING_SECRET_OVERLAP_SECONDS' default, on the database clock.
    overlap_end = parse_utc(body["previous_valid_until"])
    assert abs(overlap_end - (asked + timedelta(hours=24))) < timedelta(minutes=1)
    assert requests.post(rotate, timeout=30).status_code == 401  # a tenant's token only
    assert Tenant.objects.get(pk=bystander.pk).signing_secret == bystander_secret

    http_target.script("/during", then=Reply(200))
    (during,) = queue_runs(tenant, {**http_spec(http_target.url("/during")), "body": {"phase": "overlap"}})
    (other,) = queue_runs(bystander, http_spec(http_target.url("/bystander")))
    proc = processes.start("run_executor")
    wait_status(during, "succeeded")
    (call,) = http_target.received("/during")
    assert len(signatures(call)) == 2
    verify(old, call)  # targets that still hold the old secret keep verifying
    verify(new, call)  # and those already switched verify too
    wait_status(other, "succeeded")
    (unrelated,) = http_target.received("/bystander")
    assert len(signatures(unrelated)) == 1
    verify(bystander_secret, unrelated)

    # The overlap is over (its end moved to the past, as 24 h would): the next claim
    # carries the new secret only, without the executor being told.
    past = datetime.now(UTC) - timedelta(seconds=1)
    Tenant.objects.filter(pk=tenant.pk).update(previous_signing_secret_until=past)
    (after,) = queue_runs(tenant, {**http_spec(http_target.url("/after")), "body": {"phase": "after"}})
    wait_status(after, "succeeded")
    (call,) = http_target.received("/after")
    assert len(signatures(call)) == 1
    verify(new, call)
    assert refusal(old, call.body, call.headers) == "No matching signature found"

    secrets = [old, new, bystander_secret]
    assert_no_secret(processes.log_of(proc), secrets, "the executor log")
    web_log = web_server.log_path.read_text(errors="replace")
    assert "signing secret rotated: tenant=rotating" in web_log  # who rotated, when: logged
    assert_no_secret(web_log, secrets, "the web server's log")
