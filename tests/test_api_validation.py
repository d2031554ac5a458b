"""Every bad job body is a field-level 400 that writes nothing; auth and tenant scoping."""

from __future__ import annotations

import copy
import json
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import Job
from jobs.tenant_services import create_tenant

JOBS = "/api/v1/jobs/"
BASE = {
    "name": "nightly report",
    "cron": "30 2 * * *",
    "timezone": "UTC",
    "target": {"type": "http", "url": "https://example.com/hook"},
}
DROP = object()  # marks a key to remove from the base body


def body(**changes) -> dict:
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is DROP:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def http(**target) -> dict:
    return {"type": "http", "url": "https://example.com/hook", **target}


def past() -> str:
    return (timezone.now() - timedelta(hours=1)).isoformat()


BIG = "x" * (64 * 1024 + 1)


def nested(levels: int, leaf: object = 1) -> object:
    """`leaf` inside `levels` objects: {"a": {"a": ... leaf}}."""
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


BAD_BODIES = [
    # (case id, body, field that must carry the error)
    ("cron-syntax", body(cron="61 * * * *"), "cron"),
    ("cron-garbage", body(cron="every day at noon"), "cron"),
    ("cron-too-few-fields", body(cron="* * *"), "cron"),
    ("cron-never-fires", body(cron="0 0 30 2 *"), "cron"),
    ("cron-blank-only-trigger", body(cron=""), "schedule"),
    ("cron-wrong-type", body(cron=5), "cron"),
    ("unknown-zone", body(timezone="Mars/Olympus_Mons"), "timezone"),
    ("leap-second-zone", body(timezone="right/America/New_York"), "timezone"),
    ("posix-zone", body(timezone="posix/Europe/Paris"), "timezone"),
    ("zone-path", body(timezone="../../../etc/localtime"), "timezone"),
    ("zone-absolute-path", body(timezone="/usr/share/zoneinfo/UTC"), "timezone"),
    ("zone-factory", body(timezone="Factory"), "timezone"),
    ("zone-case-variant", body(timezone="europe/paris"), "timezone"),
    ("zone-wrong-type", body(timezone=1), "timezone"),
    ("no-trigger", body(cron=DROP), "schedule"),
    ("cron-and-interval", body(interval_seconds=60), "schedule"),
    ("all-three-triggers", body(interval_seconds=60, run_at="2099-01-01T00:00:00Z"), "schedule"),
    ("interval-zero", body(cron=DROP, interval_seconds=0), "interval_seconds"),
    ("interval-negative", body(cron=DROP, interval_seconds=-5), "interval_seconds"),
    ("interval-string", body(cron=DROP, interval_seconds="60"), "interval_seconds"),
    ("interval-fraction", body(cron=DROP, interval_seconds=1.5), "interval_seconds"),
    ("interval-bool", body(cron=DROP, interval_seconds=True), "interval_seconds"),
    ("interval-huge", body(cron=DROP, interval_seconds=10**12), "interval_seconds"),
    ("run_at-past", body(cron=DROP, run_at=past()), "run_at"),
    ("run_at-garbage", body(cron=DROP, run_at="tomorrow"), "run_at"),
    ("run_at-naive", body(cron=DROP, run_at="2099-01-01T00:00:00"), "run_at"),
    ("misfire-unknown", body(misfire_policy="sometimes"), "misfire_policy"),
    ("overlap-unknown", body(overlap_policy="queue"), "overlap_policy"),
    ("target-ftp", body(target=http(url="ftp://example.com/x")), "target"),
    ("target-no-scheme", body(target=http(url="example.com/hook")), "target"),
    ("target-loopback-ip", body(target=http(url="http://127.0.0.1:8080/hook")), "target"),
    ("target-localhost", body(target=http(url="http://localhost/hook")), "target"),
    ("target-private-ip", body(target=http(url="http://10.1.2.3/hook")), "target"),
    ("target-metadata-ip", body(target=http(url="http://169.254.169.254/latest/meta-data")), "target"),
    ("target-ipv6-loopback", body(target=http(url="http://[::1]/hook")), "target"),
    ("target-url-missing", body(target={"type": "http"}), "target"),
    ("target-unknown-type", body(target={"type": "smtp", "to": "a@example.com"}), "target"),
    ("target-no-type", body(target={"url": "https://example.com/"}), "target"),
    ("target-not-object", body(target="https://example.com/"), "target"),
    ("target-missing", body(target=DROP), "target"),
    ("target-bad-method", body(target=http(method="FETCH")), "target"),
    ("target-headers-list", body(target=http(headers=["X-A: 1"])), "target"),
    ("target-header-int-value", body(target=http(headers={"X-A": 1})), "target"),
    ("target-header-newline", body(target=http(headers={"X-A": "a\r\nX-Evil: 1"})), "target"),
    ("target-header-reserved", body(target=http(headers={"Idempotency-Key": "mine"})), "target"),
    # Control characters the HTTP client refuses to send (every run would die).
    ("target-header-vertical-tab", body(target=http(headers={"X-A": "a\x0bb"})), "target"),
    ("target-header-form-feed", body(target=http(headers={"X-A": "a\x0cb"})), "target"),
    ("target-header-del", body(target=http(headers={"X-A": "a\x7fb"})), "target"),
    ("target-header-escape", body(target=http(headers={"X-A": "\x1b[31m"})), "target"),
    ("target-timeout-zero", body(target=http(timeout_seconds=0)), "target"),
    ("target-timeout-big", body(target=http(timeout_seconds=301)), "target"),
    ("target-timeout-string", body(target=http(timeout_seconds="30")), "target"),
    ("target-unknown-key", body(target=http(retries=3)), "target"),
    ("target-body-too-big", body(target=http(body=BIG)), "target"),
    ("target-json-body-too-big", body(target=http(body={"blob": BIG})), "target"),
    ("task-name-missing", body(target={"type": "task", "kwargs": {}}), "target"),
    ("task-name-blank", body(target={"type": "task", "name": " "}), "target"),
    ("task-kwargs-list", body(target={"type": "task", "name": "noop", "kwargs": [1]}), "target"),
    ("task-kwargs-too-big", body(target={"type": "task", "name": "noop", "kwargs": {"a": BIG}}), "target"),
    ("task-timeout-zero", body(target={"type": "task", "name": "noop", "timeout_seconds": 0}), "target"),
    ("task-timeout-negative", body(target={"type": "task", "name": "noop", "timeout_seconds": -5}), "target"),
    ("task-timeout-big", body(target={"type": "task", "name": "noop", "timeout_seconds": 86_401}), "target"),
    ("task-timeout-string", body(target={"type": "task", "name": "noop", "timeout_seconds": "30"}), "target"),
    ("task-timeout-float", body(target={"type": "task", "name": "noop", "timeout_seconds": 1.5}), "target"),
    ("task-timeout-bool", body(target={"type": "task", "name": "noop", "timeout_seconds": True}), "target"),
    ("task-timeout-null", body(target={"type": "task", "name": "noop", "timeout_seconds": None}), "target"),
    ("name-empty", body(name=""), "name"),
    ("name-blank", body(name="   "), "name"),
    ("name-too-long", body(name="n" * 201), "name"),
    ("name-missing", body(name=DROP), "name"),
    ("name-number", body(name=5), "name"),
    ("end-before-start", body(start_at="2099-01-02T00:00:00Z", end_at="2099-01-01T00:00:00Z"), "end_at"),
    ("end-equals-start", body(start_at="2099-01-01T00:00:00Z", end_at="2099-01-01T00:00:00Z"), "end_at"),
    ("end-in-past", body(end_at=past()), "end_at"),
    ("start-garbage", body(start_at="soon"), "start_at"),
    ("unknown-field-typo", body(cron=DROP, intervall_seconds=60), "intervall_seconds"),
    ("unknown-field", body(colour="blue"), "colour"),
    ("max-catch-up-zero", body(max_catch_up=0), "max_catch_up"),
    ("max-catch-up-big", body(max_catch_up=10_001), "max_catch_up"),
    ("max-attempts-zero", body(max_attempts=0), "max_attempts"),
    ("max-attempts-big", body(max_attempts=101), "max_attempts"),
    ("lease-too-short", body(lease_seconds=4), "lease_seconds"),
    ("lease-too-long", body(lease_seconds=3601), "lease_seconds"),
    ("priority-ten", body(priority=10), "priority"),
    ("priority-negative", body(priority=-1), "priority"),
    ("priority-string", body(priority="9"), "priority"),
    ("paused-string", body(paused="yes"), "paused"),
    ("backoff-negative", body(retry_backoff_seconds=-1), "retry_backoff_seconds"),
    (
        "backoff-cap-below-base",
        body(retry_backoff_seconds=100, retry_backoff_cap_seconds=50),
        "retry_backoff_cap_seconds",
    ),
    # jsonb cannot store NUL; the port must be a real one.
    ("target-nul-in-body", body(target=http(body="a\x00b")), "target"),
    ("target-nul-in-header", body(target=http(headers={"X-A": "a\x00"})), "target"),
    ("target-port-too-big", body(target=http(url="https://example.com:99999/hook")), "target"),
    ("target-port-zero", body(target=http(url="https://example.com:0/hook")), "target"),
    # Nesting: a target's body and kwargs at most 32 levels, a request body at most 64.
    ("target-body-too-deep", body(target=http(body=nested(33))), "target"),
    ("target-body-470-deep", body(target=http(body=nested(470))), "target"),
    ("task-kwargs-too-deep", body(target={"type": "task", "name": "echo", "kwargs": nested(33)}), "target"),
    (
        "task-kwarg-too-deep",
        body(target={"type": "task", "name": "echo", "kwargs": {"k": nested(32)}}),
        "target",
    ),
    ("dst-policy-too-deep", body(dst_policy=nested(100)), "dst_policy"),
]


@pytest.mark.parametrize(("payload", "field"), [pytest.param(b, f, id=i) for i, b, f in BAD_BODIES])
def test_bad_job_body_is_field_level_400_and_writes_nothing(api, payload, field):
    before = Job.objects.count()
    response = api.post(JOBS, payload, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert field in errors, errors
    assert (
        isinstance(errors[field], list) and errors[field] and all(isinstance(m, str) for m in errors[field])
    )
    assert Job.objects.count() == before


def test_the_base_body_is_valid(api):
    # Guards the table above: every case differs from a body that does get created.
    response = api.post(JOBS, body(), format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.count() == 1


def test_cron_error_carries_the_schedule_message(api):
    response = api.post(JOBS, body(cron="0 0 30 2 *"), format="json")
    assert "can never fire" in response.json()["cron"][0]


@pytest.mark.parametrize(
    ("raw", "content_type"),
    [
        (b'{"name": "x", ', "application/json"),
        (b"not json at all", "application/json"),
        (b"[1, 2, 3]", "application/json"),
        (b'"just a string"', "application/json"),
        (b"", "application/json"),
    ],
    ids=["truncated", "garbage", "list", "string", "empty"],
)
def test_malformed_json_is_400(api, raw, content_type):
    response = api.generic("POST", JOBS, raw, content_type=content_type)
    assert response.status_code == 400, response.content
    assert response["Content-Type"].startswith("application/json")
    assert Job.objects.count() == 0


def test_private_targets_allowed_when_the_setting_says_so(api, settings):
    settings.SCHEDULER_ALLOW_PRIVATE_TARGETS = True
    response = api.post(JOBS, body(target=http(url="http://127.0.0.1:9/hook")), format="json")
    assert response.status_code == 201, response.content


def test_unresolvable_host_name_does_not_fail_creation(api):
    response = api.post(JOBS, body(target=http(url="https://not-yet-in-dns.invalid/hook")), format="json")
    assert response.status_code == 201, response.content


@pytest.fixture
def job(api):
    response = api.post(JOBS, body(), format="json")
    assert response.status_code == 201
    return response.json()


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"interval_seconds": "60"}, "interval_seconds"),
        ({"interval_seconds": 0}, "interval_seconds"),
        ({"cron": None}, "schedule"),
        ({"cron": "* * * * *", "interval_seconds": 60}, "schedule"),
        ({"timezone": "Nowhere/Special"}, "timezone"),
        ({"run_at": "2001-01-01T00:00:00Z"}, "run_at"),
        ({"name": ""}, "name"),
        ({"intervall_seconds": 60}, "intervall_seconds"),
        ({"target": {"type": "http", "url": "http://192.168.0.1/"}}, "target"),
        ({"overlap_policy": "maybe"}, "overlap_policy"),
        ({"start_at": "2099-02-01T00:00:00Z", "end_at": "2099-01-01T00:00:00Z"}, "end_at"),
        ({"paused": "false"}, "paused"),
        ({"target": http(body=nested(470))}, "target"),
        ({"target": {"type": "task", "name": "echo", "kwargs": nested(33)}}, "target"),
    ],
)
def test_bad_patch_is_400_and_leaves_the_job_as_it_was(api, job, patch, field):
    stored = Job.objects.values().get(pk=job["id"])
    response = api.patch(f"{JOBS}{job['id']}/", patch, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert Job.objects.values().get(pk=job["id"]) == stored


def test_no_token_is_401(db, tenant):
    client = APIClient()
    for method, path in [("get", JOBS), ("post", JOBS), ("get", "/api/v1/schedules/preview?cron=*+*+*+*+*")]:
        response = (
            getattr(client, method)(path, body(), format="json") if method == "post" else client.get(path)
        )
        assert response.status_code == 401, (method, path)
        assert response.json()["detail"]
    assert Job.objects.count() == 0


def test_bad_token_is_401(db, tenant):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer cy_not-a-real-token")
    assert client.get(JOBS).status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Basic dXNlcjpwYXNz")
    assert client.get(JOBS).status_code == 401


def test_another_tenants_job_is_404(api, job):
    _, other_token = create_tenant(slug="other")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_token}")
    path = f"{JOBS}{job['id']}"
    assert other.get(f"{path}/").status_code == 404
    assert other.patch(f"{path}/", {"name": "stolen"}, format="json").status_code == 404
    assert other.delete(f"{path}/").status_code == 404
    for action in ("pause", "resume", "trigger", "preview", "misfires"):
        method = other.get if action in ("preview", "misfires") else other.post
        assert method(f"{path}/{action}").status_code == 404, action
    assert (
        other.post(
            f"{path}/backfill", {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"}
        ).status_code
        == 404
    )
    assert other.get(JOBS).json()["results"] == []
    stored = Job.objects.get(pk=job["id"])
    assert stored.name == BASE["name"] and not stored.paused
    assert not stored.tenant.slug == "other"


def test_non_uuid_job_id_is_404(api):
    assert api.get(f"{JOBS}not-a-uuid/").status_code == 404
    assert api.get(f"{JOBS}12345/").status_code == 404


def test_bad_list_filter_is_400(api):
    response = api.get(f"{JOBS}?paused=perhaps")
    assert response.status_code == 400
    assert "paused" in response.json()


def test_error_bodies_are_json_not_html(api):
    response = api.post(JOBS, json.dumps(body(cron="bad")), content_type="application/json")
    assert response["Content-Type"].startswith("application/json")


def test_request_over_the_upload_limit_is_a_json_413(api):
    huge = json.dumps(body(target=http(body="x" * (2 * 1024 * 1024))))
    response = api.generic("POST", JOBS, huge, content_type="application/json")
    assert response.status_code == 413  # docs/CONTRACT.md, "REST API": a 413 naming the limit
    assert response["Content-Type"].startswith("application/json")
    assert "1048576 bytes" in response.json()["detail"]
    assert Job.objects.count() == 0


def test_two_triggers_message_uses_api_names(api):
    response = api.post(JOBS, body(interval_seconds=60), format="json")
    assert response.json()["schedule"] == [
        "Set exactly one of cron, interval_seconds or run_at (got cron, interval_seconds)."
    ]


@pytest.mark.parametrize("where", ["body", "url", "kwargs"])
def test_lone_surrogate_in_target_is_400_not_500(api, where):
    # Raw JSON: a \ud800 escape decodes to a string that cannot be encoded as UTF-8.
    target = {
        "body": '{"type": "http", "url": "https://example.com/h", "body": "\\ud800"}',
        "url": '{"type": "http", "url": "https://example.com/\\ud800"}',
        "kwargs": '{"type": "task", "name": "noop", "kwargs": {"k": "\\ud800"}}',
    }[where]
    raw = '{"name": "s", "interval_seconds": 60, "target": ' + target + "}"
    response = api.generic("POST", JOBS, raw.encode(), content_type="application/json")
    assert response.status_code == 400, response.content
    assert "target" in response.json()
    assert Job.objects.count() == 0


def test_a_hashed_cron_gets_the_same_answer_whatever_id_the_server_picks(api):
    # Identical POSTs of `1 0 H(29-31) 4 *` must all get the same answer: validation that
    # hashed with one id while the job got another gave some 201s and some 400s.
    payload = {"name": "h", "cron": "1 0 H(29-31) 4 *", "target": {"type": "task", "name": "noop"}}
    codes = [api.post("/api/v1/jobs/", payload, format="json").status_code for _ in range(40)]
    assert codes == [201] * 40
    days = {job.next_run_at.day for job in Job.objects.all()}
    assert days <= {29, 30}
    refused = {**payload, "cron": "1 0 H(29-31) 2 *"}
    for _ in range(10):
        response = api.post("/api/v1/jobs/", refused, format="json")
        assert response.status_code == 400 and "cron" in response.json(), response.content
    assert Job.objects.count() == 40


@pytest.mark.parametrize(
    ("target", "field"),
    [
        (http(body=nested(33)), "body"),
        ({"type": "task", "name": "echo", "kwargs": nested(33)}, "kwargs"),
    ],
)
def test_a_target_nested_too_deep_names_the_field_and_the_limit(api, target, field):
    response = api.post(JOBS, body(target=target), format="json")
    assert response.status_code == 400, response.content
    assert response.json() == {
        "target": [f"{field}: nested more than 32 levels deep; the limit is 32 levels."]
    }
    at_the_limit = {**target, field: nested(32)}
    assert api.post(JOBS, body(target=at_the_limit), format="json").status_code == 201


def raw_with(field: str, value: str, **fields) -> bytes:
    """A JSON object whose `field` is the raw JSON text `value` (too deep to build and dump)."""
    return json.dumps({**fields, field: "@@"}).replace('"@@"', value).encode()


def deep_text(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("levels", [63, 64, 1000, 100_000])
def test_a_body_nested_too_deep_is_a_400_on_every_body_endpoint(api, job, levels):
    """Deeper than 64 levels a request body is refused whole, by the JSON parser, also when
    it is too deep for the decoder itself: a 400 saying so, never a 500."""
    stored = Job.objects.values().get(pk=job["id"])
    run = f"/api/v1/runs/{job['id']}/2026-01-01T00:00:00Z"
    calls = [
        ("POST", JOBS, raw_with("target", deep_text(levels), **body())),
        ("PATCH", f"{JOBS}{job['id']}/", raw_with("target", deep_text(levels))),
        ("POST", f"{JOBS}{job['id']}/resume", raw_with("catch_up", deep_text(levels))),
        ("POST", f"{JOBS}{job['id']}/backfill", raw_with("start", deep_text(levels))),
        ("POST", f"{run}/replay", raw_with("dry_run", deep_text(levels))),
    ]
    api.raise_request_exception = False  # a crash must show as the 500 a client would get
    for method, path, raw in calls:
        response = api.generic(method, path, raw, content_type="application/json")
        assert response.status_code == 400, (method, path, response.content[:300])
        errors = response.json()
        if levels == 63:  # the object is the first level: 64 in all, within the bound
            assert "nested" not in str(errors), errors
        else:
            problem = errors.get("detail") or next(iter(errors.values()))
            assert "nested more than 64 levels deep" in str(problem), errors
    assert Job.objects.count() == 1 and Job.objects.values().get(pk=job["id"]) == stored


@pytest.mark.parametrize("field", ["target", "dst_policy"])
def test_a_form_encoded_json_field_nested_too_deep_is_a_400(api, field):
    """Form posts carry a JSON field as text that the field itself decodes."""
    fields = {"name": "form", "cron": "* * * * *", "target": json.dumps(http()), field: deep_text(1000)}
    api.raise_request_exception = False
    response = api.post(JOBS, fields, format="multipart")
    assert response.status_code == 400, response.content[:300]
    assert "nested more than 64 levels deep" in str(response.json()[field]), response.json()
    assert Job.objects.count() == 0


def test_the_real_server_answers_a_body_too_deep_to_parse_with_a_400(web_server, transactional_db):
    """Through gunicorn, whose stack is not the test client's: the bound does not depend on it."""
    import requests

    _, token = create_tenant(slug="deep")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    for levels in (1000, 100_000, 100):
        raw = raw_with("target", deep_text(levels), **body())
        response = requests.post(f"{web_server.url}{JOBS}", data=raw, headers=headers, timeout=60)
        assert response.status_code == 400, (levels, response.text[:300])
        assert "nested more than 64 levels deep" in response.text, response.text[:300]
    assert Job.objects.count() == 0


def test_header_values_are_refused_exactly_when_the_http_client_refuses_them():
    """The rule is aiohttp's (it raises "Forbidden control character" when it writes the
    request): compared on every ASCII character and a few that look like line breaks."""
    from aiohttp.http_writer import _serialize_headers
    from multidict import CIMultiDict

    from jobs.rules.target import check_target

    def client_sends(value: str) -> bool:
        try:
            _serialize_headers("POST /hook HTTP/1.1", CIMultiDict({"X-A": value}))
        except ValueError:
            return False
        return True

    def accepted(value: str) -> bool:
        try:
            check_target(http(headers={"X-A": value}), allow_private=False)
        except ValueError as exc:
            assert all("'X-A'" in str(p) for p in exc.args), exc.args
            return False
        return True

    for char in [*map(chr, range(128)), "\x85", "\u2028", "\u2029", "\ufeff", "\xa0", "é"]:
        if char == "\x00":
            continue  # NUL: jsonb cannot store it; refused earlier, with its own message
        value = f"a{char}b"
        assert accepted(value) == client_sends(value), repr(char)


@pytest.mark.parametrize("char", ["\x0b", "\x0c", "\x7f"])
def test_a_header_the_client_cannot_send_is_a_400_naming_it_at_edit_too(api, job, char):
    url = f"{JOBS}{job['id']}/"
    response = api.patch(url, {"target": http(headers={"X-Signature": f"v1{char}x"})}, format="json")
    assert response.status_code == 400, response.content
    (message,) = response.json()["target"]
    assert "X-Signature" in message and "control character" in message, message
    assert api.get(url).json()["target"].get("headers") in ({}, None)


def test_a_too_deep_value_under_a_key_that_is_not_unicode_is_still_a_400(api):
    raw = '{"name": "s", "interval_seconds": 60, "target": {"type": "http", "url": "https://example.com/", '
    raw += '"\\ud800": ' + "[" * 40 + "]" * 40 + "}}"
    api.raise_request_exception = False
    response = api.generic("POST", JOBS, raw.encode(), content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    assert "nested more than 32 levels deep" in response.json()["target"][0]
