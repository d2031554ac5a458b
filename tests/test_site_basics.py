"""What a newcomer meets first: the site root, and the API's answer to an oversized body."""

from __future__ import annotations

import json
import re

import pytest
from django.conf import settings

from jobs.models import Job
from tests.support.runsapi import make_job

pytestmark = pytest.mark.django_db


def test_root_is_a_landing_page_linking_every_part(client):
    response = client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Cronyard" in html and "exactly once" in html
    links = set(re.findall(r'href="([^"]+)"', html))
    assert {"/admin/", "/api/docs/", "/api/redoc/", "/api/schema/", "/metrics", "/api/v1/health"} <= links
    for link in links:
        assert client.get(link).status_code in (200, 302), link  # 302: the console asks for a login


def test_admin_view_site_points_at_the_landing_page(admin_client):
    html = admin_client.get("/admin/").content.decode()
    assert re.search(r'<a href="/">View site</a>', html), html[:2000]


@pytest.mark.parametrize("method", ["post", "patch"])
def test_body_over_the_upload_limit_is_413_naming_the_limit_in_bytes(api, tenant, method):
    existing = make_job(tenant, "existing")
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    body = json.dumps({"name": "x" * (limit + 1), "cron": "* * * * *", "target": {"type": "http"}})
    path = "/api/v1/jobs/" if method == "post" else f"/api/v1/jobs/{existing.pk}/"
    response = getattr(api, method)(path, body, content_type="application/json")
    assert response.status_code == 413, response.content[:300]
    payload = response.json()
    assert payload["limit_bytes"] == limit
    assert f"{limit} bytes" in payload["detail"]
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" not in payload["detail"]
    assert list(Job.objects.values_list("name", flat=True)) == ["existing"]  # nothing written
