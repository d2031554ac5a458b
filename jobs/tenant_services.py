"""Writes to tenants and their API tokens, one transaction each, keyword-only (the job
writes are jobs/services.py)."""

from __future__ import annotations

import hashlib
import secrets

from django.core.exceptions import ValidationError
from django.db import transaction

from jobs.models import ApiToken, Tenant
from runs.execution import signing

TOKEN_PREFIX = "cy_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def create_tenant(
    *,
    slug: str,
    name: str = "",
    max_concurrency: int = 10,
    weight: int = 1,
    max_runs_per_minute: int | None = None,
) -> tuple[Tenant, str]:
    """The tenant, with its signing secret (`tenant.signing_secret`: the caller shows it
    once), and its first API token."""
    check_rate_limit(max_runs_per_minute)
    tenant = Tenant.objects.create(
        slug=slug,
        name=name or slug,
        max_concurrency=max_concurrency,
        weight=weight,
        max_runs_per_minute=max_runs_per_minute,
        signing_secret=signing.new_secret(),
    )
    return tenant, _issue_token(tenant=tenant, label="created with tenant")


def check_rate_limit(value: int | None) -> None:
    """The model field's own range (1..MAX_RUNS_PER_MINUTE or None); a ValidationError names it."""
    if value is None:
        return
    try:
        Tenant._meta.get_field("max_runs_per_minute").run_validators(value)
    except ValidationError as exc:
        raise ValidationError({"max_runs_per_minute": exc.messages}) from exc


@transaction.atomic
def set_rate_limit(*, tenant: Tenant, max_runs_per_minute: int | None) -> Tenant:
    """Set or clear (None) a tenant's dispatch rate limit; the next batch applies it."""
    check_rate_limit(max_runs_per_minute)
    Tenant.objects.filter(pk=tenant.pk).update(max_runs_per_minute=max_runs_per_minute)
    tenant.max_runs_per_minute = max_runs_per_minute
    return tenant


@transaction.atomic
def issue_token(*, tenant: Tenant, label: str = "") -> str:
    return _issue_token(tenant=tenant, label=label)


def _issue_token(*, tenant: Tenant, label: str) -> str:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    ApiToken.objects.create(tenant=tenant, token_hash=hash_token(token), prefix=token[:10], label=label)
    return token
