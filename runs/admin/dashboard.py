"""The operations dashboard (docs/CONTRACT.md, "Console"): lateness, queue depth, nodes, partitions,
tenants and circuits, with server-rendered SVG charts; a read-only page."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.admin import AdminSite
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from jobs import forecast, health
from jobs.models import Tenant
from runs import selectors
from runs.admin import charts, timeseries
from runs.admin.html import STATUS_COLORS
from runs.models import ACTIVE_STATUSES, RunStatus

DASHBOARD_REFRESH_SECONDS = 15
LATENESS_STEP_SECONDS = 300


def page(request: HttpRequest, *, admin_site: AdminSite) -> HttpResponse:
    """The dashboard page (`admin:runs_dashboard`)."""
    now = timezone.now()
    lateness, due = selectors.oldest_due(now=now)
    depth = selectors.queue_depth()
    priorities = sorted({p for p, _ in depth}, reverse=True)
    statuses = [str(s) for s in ACTIVE_STATUSES]
    depth_rows = [
        (p, [depth.get((p, s), 0) for s in statuses], sum(depth.get((p, s), 0) for s in statuses))
        for p in priorities
    ]
    last_hour = selectors.status_counts(since=now - timedelta(hours=1))
    nodes = selectors.scheduler_nodes()
    executors = selectors.executor_nodes()
    refresh = request.GET.get("refresh", str(DASHBOARD_REFRESH_SECONDS))
    context = {
        **admin_site.each_context(request),
        "title": "Operations dashboard",
        "now": now,
        "lateness_seconds": round(lateness, 1),
        "due_jobs": due,
        # Same rule as the API's overdue_seconds and /metrics' cronyard_jobs_overdue.
        "overdue_jobs": sum(
            health.overdue_by_tenant(now=now, late_seconds=settings.SCHEDULER_OVERDUE_ALERT_SECONDS).values()
        ),
        "overdue_after": settings.SCHEDULER_OVERDUE_ALERT_SECONDS,
        "depth_statuses": statuses,
        "depth_rows": depth_rows,
        "depth_totals": [sum(depth.get((p, s), 0) for p in priorities) for s in statuses],
        "last_hour": [(str(s), last_hour.get(s, 0)) for s in RunStatus],
        "last_hour_total": sum(last_hour.values()),
        "nodes": nodes,
        "live_nodes": sum(1 for n in nodes if n.alive),
        "executors": executors,
        "live_executors": sum(1 for n in executors if n.alive),
        "refresh_seconds": int(refresh) if refresh.isdigit() else DASHBOARD_REFRESH_SECONDS,
        "charts": _dashboard_charts(
            now=now, lateness=lateness, depth=depth, priorities=priorities, nodes=nodes
        ),
        "total_partitions": settings.SCHEDULER_PARTITIONS,
        "unowned_partitions": selectors.unowned_partitions(nodes=nodes, total=settings.SCHEDULER_PARTITIONS),
        "tenant_loads": selectors.tenant_load(limit=50),
        "open_circuits": selectors.open_circuits(limit=50),
        "recent_changes": selectors.recent_changes(limit=20),
        "dead_last_day": selectors.dead_count(since=now - timedelta(hours=24)),
        "forecast": _forecast_panel(request.GET.get("forecast_tenant", ""), now=now),
    }
    return TemplateResponse(request, "admin/runs/dashboard.html", context)


def _dashboard_charts(*, now, lateness: float, depth: dict, priorities: list[int], nodes) -> dict:
    """The SVG charts: last hour per minute, lateness percentiles, queue depth, oldest due, partitions."""
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(hours=1)
    minutes = [start + timedelta(minutes=i) for i in range(60)]
    per_minute = timeseries.runs_per_minute(since=start, until=end)
    shown = [s for s in RunStatus if any(k[1] == s for k in per_minute)] or [RunStatus.SUCCEEDED]
    runs = charts.stacked_bars(
        chart="runs_per_minute",
        buckets=minutes,
        series=[(str(s), STATUS_COLORS[s], [per_minute.get((m, s), 0) for m in minutes]) for s in shown],
    )
    step = timedelta(seconds=LATENESS_STEP_SECONDS)
    lat_start = end - timedelta(hours=1)
    lat_buckets = [lat_start + i * step for i in range(int(timedelta(hours=1) / step))]
    pct = timeseries.lateness_percentiles(since=lat_start, until=end, step_seconds=LATENESS_STEP_SECONDS)
    late = charts.lines(
        chart="lateness",
        buckets=lat_buckets,
        series=[
            ("p50", "#1f6feb", [pct[b][0] if b in pct else None for b in lat_buckets]),
            ("p99", "#cf222e", [pct[b][1] if b in pct else None for b in lat_buckets]),
        ],
    )
    active = list(ACTIVE_STATUSES)
    queue = charts.horizontal_stacks(
        chart="queue_depth",
        rows=[
            (f"p{p}", [(str(s), STATUS_COLORS[s], depth.get((p, s), 0)) for s in active]) for p in priorities
        ],
    )
    owners: list[str | None] = [None] * settings.SCHEDULER_PARTITIONS
    live = [n for n in nodes if n.alive]
    for node in live:
        for p in node.owned:
            if 0 <= p < len(owners):
                owners[p] = node.node_id
    colors = {n.node_id: charts.NODE_COLORS[i % len(charts.NODE_COLORS)] for i, n in enumerate(live)}
    return {
        "runs_per_minute": runs,
        "lateness": late,
        "queue_depth": queue,
        "oldest_due": charts.gauge(
            chart="oldest_due", value=lateness, warn=float(settings.SCHEDULER_OVERDUE_ALERT_SECONDS)
        ),
        "partitions": charts.partition_map(owners=owners, colors=colors),
    }


FORECAST_TENANTS = 20


def _forecast_panel(slug: str, *, now) -> dict:
    """The next 24 h of due runs per minute from the schedules (jobs/forecast.py): all
    tenants, or one; the spikes with the schedules behind them; the tenants' share."""
    everyone = forecast.recent(now=now, by_tenant=True)
    tenant = Tenant.objects.filter(slug=slug).first() if slug else None
    shown = forecast.recent(now=now, tenant_id=tenant.id) if tenant else everyone
    spikes = [
        {
            "rank": rank,
            "at": spike.at,
            "count": spike.count,
            "times_mean": spike.times_mean,
            "other_runs": spike.other_runs,
            "repeats": spike.repeats,
            "causes": [
                {
                    "cause": cause,
                    "jobs_url": f"{reverse('admin:jobs_job_changelist')}?{urlencode({'q': cause.cron})}"
                    if cause.cron
                    else None,
                }
                for cause in spike.causes
            ],
        }
        for rank, spike in enumerate(shown.spikes, 1)
    ]
    labels = [
        (s.index, s.count, f"{s.at:%H:%M} UTC: {s.count} runs due ({s.times_mean}x the mean)")
        for s in shown.spikes
    ]
    names = dict(Tenant.objects.filter(id__in=everyone.by_tenant).values_list("id", "slug"))
    loads = sorted(
        (
            {
                "slug": names.get(tenant_id, str(tenant_id)),
                "total": sum(series),
                "peak": max(series),
                "peak_at": everyone.window.step_start(series.index(max(series))),
            }
            for tenant_id, series in everyone.by_tenant.items()
        ),
        key=lambda row: (-row["total"], row["slug"]),
    )
    peak = max(shown.counts, default=0)
    return {
        "tenant": tenant,
        "tenants": sorted(names.values()),
        "window": shown.window,
        "total": shown.total,
        "peak": peak,
        "peak_at": shown.window.step_start(shown.counts.index(peak)) if peak else None,
        "seconds": round(shown.seconds, 2),
        "spikes": spikes,
        "tenant_loads": loads[:FORECAST_TENANTS],
        "chart": charts.forecast_bars(
            chart="forecast",
            start=shown.window.start,
            step_seconds=shown.window.step_seconds,
            counts=shown.counts,
            spikes=labels,
        ),
    }
