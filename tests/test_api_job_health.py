"""GET /api/v1/jobs/{id}/ carries the job's `health` through the real gunicorn: exact
figures from seeded runs (expected values computed in tests/support/job_health.py,
not by jobs/health.py), the same values as the job's top-level health fields, and the
object described in the OpenAPI schema."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import requests

from jobs import services
from jobs.models import Job
from jobs.tenant_services import create_tenant
from runs.keys import format_utc
from tests.support import job_health

HOOK = {"type": "http", "url": "https://example.com/hook"}


@pytest.fixture
def acme(transactional_db):
    return create_tenant(slug="acme")


def get(web_server, token: str, path: str) -> requests.Response:
    return requests.get(f"{web_server.url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_job_detail_health_from_seeded_runs(web_server, acme):
    tenant, token = acme
    job = services.create_job(tenant=tenant, fields=dict(name="poller", interval_seconds=60, target=HOOK))
    want = job_health.seed(job)
    late = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1000)
    Job.objects.filter(pk=job.pk).update(next_run_at=late)

    response = get(web_server, token, f"/api/v1/jobs/{job.id}/")
    assert response.status_code == 200, response.text
    body = response.json()
    health = body["health"]
    assert health["consecutive_failures"] == want.consecutive_failures == body["consecutive_failures"]
    assert health["alert_after_failures"] == 3
    assert health["failing"] is True
    assert health["last_success_at"] == format_utc(want.last_success_at) == body["last_success_at"]
    assert health["last_failure_at"] == format_utc(want.last_failure_at) == body["last_failure_at"]
    assert health["overdue_seconds"] == body["overdue_seconds"]
    assert 1000 <= health["overdue_seconds"] < 1100
    assert health["misfire_count"] == want.misfires == body["misfires"]["count"]
    assert health["on_time_threshold_seconds"] == job_health.THRESHOLD
    for name, seconds in (("last_24h", 86400), ("last_7d", 7 * 86400)):
        expected = getattr(want, name)
        window = health[name]
        assert window["seconds"] == seconds
        assert (window["slots"], window["on_time"]) == (expected.slots, expected.on_time), name
        assert window["on_time_rate"] == expected.rate, name
        assert window["lateness_p50_seconds"] == pytest.approx(expected.p50, abs=1e-3), name
        assert window["lateness_p99_seconds"] == pytest.approx(expected.p99, abs=1e-3), name
    # The windows really differ: the older runs are in the week only.
    assert health["last_24h"]["slots"] < health["last_7d"]["slots"]


def test_the_on_time_rate_follows_the_jobs_starting_deadline(web_server, acme):
    tenant, token = acme
    fields = dict(name="strict", interval_seconds=60, target=HOOK, starting_deadline_seconds=30)
    job = services.create_job(tenant=tenant, fields=fields)
    want = job_health.seed(job)
    health = get(web_server, token, f"/api/v1/jobs/{job.id}/").json()["health"]
    assert health["on_time_threshold_seconds"] == 30
    # A start 59.5 s late is on time under the global 60 s, not under the job's 30 s.
    assert (health["last_24h"]["slots"], health["last_24h"]["on_time"]) == (8, 5)
    assert (health["last_24h"]["on_time"], health["last_24h"]["on_time_rate"]) == (
        want.last_24h.on_time,
        want.last_24h.rate,
    )
    assert (health["last_7d"]["on_time"], health["last_7d"]["slots"]) == (
        want.last_7d.on_time,
        want.last_7d.slots,
    )


def test_a_job_without_runs_has_empty_windows(web_server, acme):
    tenant, token = acme
    job = services.create_job(tenant=tenant, fields=dict(name="new", cron_expr="0 3 * * *", target=HOOK))
    health = get(web_server, token, f"/api/v1/jobs/{job.id}/").json()["health"]
    assert health["failing"] is False and health["overdue_seconds"] is None
    assert health["last_success_at"] is None and health["misfire_count"] == 0
    for name in ("last_24h", "last_7d"):
        assert health[name] == {
            "seconds": health[name]["seconds"],
            "slots": 0,
            "on_time": 0,
            "on_time_rate": None,
            "lateness_p50_seconds": None,
            "lateness_p99_seconds": None,
        }


def test_another_tenants_job_health_is_a_404(web_server, acme):
    tenant, _ = acme
    job = services.create_job(tenant=tenant, fields=dict(name="mine", interval_seconds=60, target=HOOK))
    _, other_token = create_tenant(slug="other")
    response = get(web_server, other_token, f"/api/v1/jobs/{job.id}/")
    assert response.status_code == 404
    assert "health" not in response.text


def test_the_list_carries_no_health_and_the_schema_describes_it(web_server, acme):
    tenant, token = acme
    services.create_job(tenant=tenant, fields=dict(name="listed", interval_seconds=60, target=HOOK))
    listed = get(web_server, token, "/api/v1/jobs/").json()["results"]
    assert listed and all("health" not in job for job in listed)

    schema = requests.get(f"{web_server.url}/api/schema/?format=json", timeout=30).json()
    detail = schema["paths"]["/api/v1/jobs/{id}/"]["get"]["responses"]["200"]["content"]["application/json"]
    components = schema["components"]["schemas"]

    def component(node: dict) -> dict:
        ref = node.get("$ref") or node["allOf"][0]["$ref"]
        return components[ref.rsplit("/", 1)[-1]]["properties"]

    health = component(component(detail["schema"])["health"])
    assert {"consecutive_failures", "last_success_at", "overdue_seconds", "misfire_count", "last_24h"} <= set(
        health
    )
    window = component(health["last_7d"])
    assert {"on_time_rate", "lateness_p50_seconds", "lateness_p99_seconds"} <= set(window)
