"""The status strip at the top of the admin home and the dashboard: jobs failing, runs
dead, jobs overdue, jobs paused, each a link to the list that shows exactly those rows.

The counts are read through the admin's own pages (`get_queryset` and the view
permission of the jobs list and the dead-letter queue), so a count never shows rows
its list would not, and a user who may not see a list gets no count for it. `?tenant=`
narrows the strip to one tenant, and its links carry the lists' tenant filter; a slug
that names no tenant is said so above counts for every tenant. Each
count is capped at STRIP_CAP rows and each reads a partial index holding only its rows
(jobs/migrations/0015 says which), so a page view costs the same at a million jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from django.contrib.admin import AdminSite
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse

from jobs import health
from jobs.models import Job, Tenant
from runs.models import DeadRun

STRIP_CAP = 1000
# Past this many tenants the menu becomes a text box: a page must not list them all.
TENANT_MENU_CAP = 200
FAILING_HELP = "failed attempts in a row reached the job's alert_after_failures"
OVERDUE_HELP = "next slot later than SCHEDULER_OVERDUE_ALERT_SECONDS: no scheduler has dispatched it"


@dataclass(frozen=True)
class StripCount:
    key: str  # failing | dead | overdue | paused: the element id's and the tests' handle
    label: str
    help: str
    count: int
    capped: bool  # there are more than `count`
    url: str


@dataclass(frozen=True)
class Strip:
    counts: list[StripCount]
    tenant: Tenant | None
    tenants: list[str]  # slugs, for the tenant menu; empty when there are too many to list
    unknown_tenant: str  # a `?tenant=` that names no tenant: the page says so


def strip(request: HttpRequest, *, admin_site: AdminSite, now: datetime) -> Strip:
    """The strip as `request.user` may see it, for `?tenant=<slug>` or everyone."""
    slug = request.GET.get("tenant", "")
    tenant = Tenant.objects.filter(slug=slug).first() if slug else None
    counts: list[StripCount] = []
    jobs = _visible(request, admin_site=admin_site, model=Job)
    if jobs is not None:
        url = reverse(f"{admin_site.name}:jobs_job_changelist")
        for key, label, rule, query, help_text in (
            ("failing", "jobs failing", health.FAILING, {"health": "failing"}, FAILING_HELP),
            ("overdue", "jobs overdue", health.overdue(now=now), {"health": "overdue"}, OVERDUE_HELP),
            ("paused", "jobs paused", Q(paused=True), {"paused__exact": "1"}, "no slot fires until resumed"),
        ):
            counts.append(
                _count(
                    key=key,
                    label=label,
                    help_text=help_text,
                    rows=jobs.filter(rule),
                    url=url,
                    query=query,
                    tenant=tenant,
                )
            )
    dead = _visible(request, admin_site=admin_site, model=DeadRun)
    if dead is not None:
        url = reverse(f"{admin_site.name}:runs_deadrun_changelist")
        runs = _count(
            key="dead",
            label="runs dead",
            help_text="the dead-letter queue",
            rows=dead,
            url=url,
            query={},
            tenant=tenant,
        )
        counts.insert(1 if counts else 0, runs)
    slugs = list(Tenant.objects.order_by("slug").values_list("slug", flat=True)[: TENANT_MENU_CAP + 1])
    return Strip(
        counts=counts,
        tenant=tenant,
        tenants=slugs if len(slugs) <= TENANT_MENU_CAP else [],
        unknown_tenant=slug if slug and tenant is None else "",
    )


def _visible(request: HttpRequest, *, admin_site: AdminSite, model) -> QuerySet | None:
    """The rows the model's admin list shows this user, or None when it shows them none."""
    if not admin_site.is_registered(model):
        return None
    model_admin = admin_site.get_model_admin(model)
    if not model_admin.has_view_or_change_permission(request):
        return None
    return model_admin.get_queryset(request)


def _count(
    *, key: str, label: str, help_text: str, rows: QuerySet, url: str, query: dict, tenant: Tenant | None
) -> StripCount:
    if tenant is not None:
        rows = rows.filter(tenant_id=tenant.id)
        query = {**query, "tenant__id__exact": tenant.id}
    # `SELECT count(*) FROM (... LIMIT n)`: no ordering, and nothing past the cap is read.
    found = rows.order_by()[: STRIP_CAP + 1].count()
    return StripCount(
        key=key,
        label=label,
        help=help_text,
        count=min(found, STRIP_CAP),
        capped=found > STRIP_CAP,
        url=f"{url}?{urlencode(query)}" if query else url,
    )
