"""Tenant max_runs_per_minute is set through the command, the admin and the service;
bad values are refused naming the field, and nothing is half-written."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction

from jobs import tenant_services
from jobs.models import Tenant


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def command(*args: str) -> str:
    out = StringIO()
    call_command("create_tenant", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_the_command_sets_changes_and_clears_the_limit():
    command("globex", "--max-runs-per-minute", "1000")
    assert Tenant.objects.get(slug="globex").max_runs_per_minute == 1000
    assert "max_runs_per_minute=250" in command("globex", "--update", "--max-runs-per-minute", "250")
    assert Tenant.objects.get(slug="globex").max_runs_per_minute == 250
    command("globex", "--update", "--max-runs-per-minute", "off")
    assert Tenant.objects.get(slug="globex").max_runs_per_minute is None
    command("initech")
    assert Tenant.objects.get(slug="initech").max_runs_per_minute is None


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["0", "-5", "1000001", "fast"])
def test_the_command_refuses_bad_values_naming_the_option(value):
    with pytest.raises(CommandError, match="--max-runs-per-minute"):
        command("hooli", "--max-runs-per-minute", value)
    assert not Tenant.objects.filter(slug="hooli").exists()
    command("hooli", "--max-runs-per-minute", "7")
    with pytest.raises(CommandError, match="--max-runs-per-minute"):
        command("hooli", "--update", "--max-runs-per-minute", value)
    assert Tenant.objects.get(slug="hooli").max_runs_per_minute == 7


@pytest.mark.django_db
def test_the_service_names_the_field_and_the_database_refuses_out_of_range(tenant):
    with pytest.raises(ValidationError) as raised:
        tenant_services.set_rate_limit(tenant=tenant, max_runs_per_minute=0)
    assert list(raised.value.message_dict) == ["max_runs_per_minute"]
    with pytest.raises(IntegrityError), transaction.atomic():
        Tenant.objects.filter(pk=tenant.pk).update(max_runs_per_minute=0)
    assert Tenant.objects.get(pk=tenant.pk).max_runs_per_minute is None


def tenant_form(**overrides) -> dict:
    data = {
        "slug": "wayne",
        "name": "Wayne",
        "max_concurrency": "10",
        "weight": "1",
        "max_runs_per_minute": "",
        "tokens-TOTAL_FORMS": "0",
        "tokens-INITIAL_FORMS": "0",
    }
    return {**data, **overrides}


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["0", "1000001", "many"])
def test_admin_form_error_names_the_field(admin_client, value):
    response = admin_client.post("/admin/jobs/tenant/add/", tenant_form(max_runs_per_minute=value))
    assert response.status_code == 200
    assert "max_runs_per_minute" in response.context["adminform"].form.errors
    assert not Tenant.objects.filter(slug="wayne").exists()


@pytest.mark.django_db
def test_admin_sets_and_clears_the_limit(admin_client):
    response = admin_client.post("/admin/jobs/tenant/add/", tenant_form(max_runs_per_minute="500"))
    assert response.status_code == 302
    tenant = Tenant.objects.get(slug="wayne")
    assert tenant.max_runs_per_minute == 500
    token = tenant.tokens.get()
    change = {
        "tokens-TOTAL_FORMS": "1",
        "tokens-INITIAL_FORMS": "1",
        "tokens-0-id": str(token.pk),
        "tokens-0-tenant": str(tenant.pk),
    }
    response = admin_client.post(f"/admin/jobs/tenant/{tenant.pk}/change/", tenant_form(**change))
    assert response.status_code == 302
    assert Tenant.objects.get(pk=tenant.pk).max_runs_per_minute is None
    assert "max_runs_per_minute" in admin_client.get("/admin/jobs/tenant/").content.decode()
