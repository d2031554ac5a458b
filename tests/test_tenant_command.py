"""manage.py create_tenant: the token is the last line and authenticates against the API;
a new tenant's signing secret is printed once, on a line of its own."""

from __future__ import annotations

import base64
import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook

from jobs.models import ApiToken, Tenant


def output(*args: str) -> list[str]:
    out = StringIO()
    call_command("create_tenant", *args, stdout=out)
    return out.getvalue().strip().splitlines()


def create(*args: str) -> str:
    return output(*args)[-1]


def client_for(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def test_creates_tenant_and_prints_a_working_token_last(db):
    token = create("globex", "--max-concurrency", "3")
    tenant = Tenant.objects.get(slug="globex")
    assert tenant.max_concurrency == 3
    assert token.startswith("cy_") and " " not in token
    # Only the hash is stored.
    assert not ApiToken.objects.filter(token_hash=token).exists()
    client = client_for(token)
    response = client.post(
        "/api/v1/jobs/",
        {"name": "x", "cron": "@daily", "target": {"type": "http", "url": "https://example.com/"}},
        format="json",
    )
    assert response.status_code == 201
    assert tenant.jobs.count() == 1


def test_duplicate_slug_is_a_command_error(db):
    create("initech")
    with pytest.raises(CommandError, match="already exists"):
        create("initech")
    assert Tenant.objects.filter(slug="initech").count() == 1
    assert ApiToken.objects.filter(tenant__slug="initech").count() == 1


def test_bad_max_concurrency_is_a_command_error(db):
    with pytest.raises(CommandError):
        create("hooli", "--max-concurrency", "0")
    assert not Tenant.objects.filter(slug="hooli").exists()


def test_new_token_for_an_existing_tenant(db):
    first = create("umbrella")
    second = create("umbrella", "--new-token")
    assert first != second
    assert client_for(first).get("/api/v1/jobs/").status_code == 200
    assert client_for(second).get("/api/v1/jobs/").status_code == 200
    with pytest.raises(CommandError, match="no tenant"):
        create("nobody", "--new-token")


def test_tokens_of_one_tenant_do_not_see_another(db):
    a = client_for(create("tenant-a"))
    b = client_for(create("tenant-b"))
    payload = {
        "name": "a-job",
        "interval_seconds": 60,
        "target": {"type": "http", "url": "https://example.com/"},
    }
    job = a.post("/api/v1/jobs/", payload, format="json").json()
    assert b.get(f"/api/v1/jobs/{job['id']}/").status_code == 404
    assert b.get("/api/v1/jobs/").json()["results"] == []


def test_the_signing_secret_is_printed_once_on_a_line_of_its_own(db):
    lines = output("stark")
    (line,) = [line for line in lines if line.startswith("signing secret: ")]
    secret = line.removeprefix("signing secret: ")
    # The Standard Webhooks form: whsec_ and base64 of 32 random bytes, which the
    # specification's library takes as a secret.
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/]{43}=", secret)
    assert len(base64.b64decode(secret.removeprefix("whsec_"))) == 32
    Webhook(secret)
    assert Tenant.objects.get(slug="stark").signing_secret == secret
    assert lines[-1].startswith("cy_")  # the token stays the last line
    # Never printed again: not with another token, not with a changed limit.
    for again in (output("stark", "--new-token"), output("stark", "--update", "--max-runs-per-minute", "5")):
        assert not any("signing secret" in line or secret in line for line in again)
    # One secret per tenant.
    assert [line for line in output("wayne") if line.startswith("signing secret: ")] not in ([], [line])
