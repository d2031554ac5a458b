"""Writes to tenants, their API tokens and their signing secrets, one transaction each,
keyword-only (the job writes are jobs/services.py)."""

from __future__ import annotations

import hashlib
import logging
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Count, F

from jobs import audit
from jobs.models import ApiToken, AuditAction, Job, Tenant, TenantDispatchWindow
from runs import counters
from runs.execution import signing
from runs.models import TargetHost
from scheduler_project import db

TOKEN_PREFIX = "cy_"

log = logging.getLogger(__name__)


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
    return tenant, _issue_token(tenant=tenant, label="created with tenant")[0]


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
def issue_token(*, tenant: Tenant, actor: str, label: str = "") -> str:
    """A new API token for the tenant (the caller shows it once), audited by its prefix."""
    token, row = _issue_token(tenant=tenant, label=label)
    audit.record(
        actor=actor,
        action=AuditAction.ISSUE_TOKEN,
        tenant_id=tenant.pk,
        changes={"token_prefix": row.prefix, "label": label},
    )
    return token


@transaction.atomic
def set_token_revoked(*, token: ApiToken, revoked: bool, actor: str) -> None:
    """Revoke a token (or take a revocation back), audited by its prefix. A revoked
    token's next request is refused (jobs/api/auth.py reads `revoked` on every call)."""
    if not ApiToken.objects.filter(pk=token.pk).exclude(revoked=revoked).update(revoked=revoked):
        return  # already so: nothing changed, nothing to record
    token.revoked = revoked
    audit.record(
        actor=actor,
        action=AuditAction.REVOKE_TOKEN,
        tenant_id=token.tenant_id,
        changes={"token_prefix": token.prefix, "revoked": [not revoked, revoked]},
    )


def _issue_token(*, tenant: Tenant, label: str) -> tuple[str, ApiToken]:
    """The clear token (shown once) and its row, which keeps only a hash and the prefix."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(tenant=tenant, token_hash=hash_token(token), prefix=token[:10], label=label)
    return token, row


@transaction.atomic
def rotate_signing_secret(*, tenant: Tenant, actor: str) -> tuple[str, datetime]:
    """A new signing secret for the tenant (the caller shows it once) and until when the
    one it replaces keeps signing beside it: SIGNING_SECRET_OVERLAP_SECONDS on the
    database clock, the clock the executors' claim compares it with.

    One UPDATE, so two rotations at once serialise on the row: the second makes the
    first one's secret the previous one. A rotation during an overlap ends that
    overlap: only the two newest secrets sign.
    """
    secret = signing.new_secret()
    # Whole seconds: the end is shown (API answer, console), and a second is nothing here.
    until = db.now().replace(microsecond=0) + timedelta(seconds=settings.SIGNING_SECRET_OVERLAP_SECONDS)
    Tenant.objects.filter(pk=tenant.pk).update(
        previous_signing_secret=F("signing_secret"),
        signing_secret=secret,
        previous_signing_secret_until=until,
    )
    audit.record(
        actor=actor,
        action=AuditAction.ROTATE_SIGNING_SECRET,
        tenant_id=tenant.pk,
        changes={"previous_secret_signs_until": until},
    )
    log.info("signing secret rotated: tenant=%s actor=%r previous valid until %s", tenant.slug, actor, until)
    return secret, until


def jobs_per_tenant(*, tenant_ids: list[int]) -> dict[int, int]:
    """{tenant id: how many jobs it has} for those of `tenant_ids` with any, in one grouped
    read. A tenant with jobs may not be deleted (delete_tenant); the console's tenant list and
    its delete page show the same counts."""
    if not tenant_ids:
        return {}
    counted = Job.objects.filter(tenant_id__in=tenant_ids).order_by().values_list("tenant_id")
    return dict(counted.annotate(n=Count("*")))


class TenantHasJobs(Exception):
    """The tenant still has jobs: delete them first (each job's delete takes its runs)."""

    def __init__(self, jobs: int):
        super().__init__(f"the tenant still has {jobs} job{'s' if jobs != 1 else ''}: delete its jobs first")
        self.jobs = jobs


@transaction.atomic
def delete_tenant(*, tenant: Tenant, actor: str) -> None:
    """Delete a tenant that has no jobs left, with its tokens, audit entries, breakers and
    dispatch windows; TenantHasJobs otherwise.

    Runs carry no foreign key to their job (the run table is partitioned), so a cascade
    from the tenant would delete its jobs and leave their queued runs for the executors,
    which never read the jobs table, to call. A tenant's jobs go one by one through
    jobs.services.delete_job, which takes their runs; a tenant with millions of jobs is
    not a console request's work. The tenant row is locked first: a job created
    meanwhile waits on it (its foreign key check) and then fails, instead of slipping in
    under the check.
    """
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
    jobs = jobs_per_tenant(tenant_ids=[tenant.pk]).get(tenant.pk)
    if jobs:
        raise TenantHasJobs(jobs)
    # No foreign keys on these two (each says why); they go with the tenant.
    TargetHost.objects.filter(tenant_id=tenant.pk).delete()
    TenantDispatchWindow.objects.filter(tenant_id=tenant.pk).delete()
    with connection.cursor() as cursor:
        counters.forget_tenant(cursor, tenant_id=tenant.pk)
    tenant.delete()
    log.info("tenant deleted: tenant=%s actor=%r", tenant.slug, actor)
