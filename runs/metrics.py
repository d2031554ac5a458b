"""/metrics: Prometheus text computed from the database at scrape time, so any web
worker answers the same.

Gauges are read from the tables. Counters (`_total`, for `rate()` and `increase()`) are
the sums of what every scheduler and executor counted and flushed into
`process_counters` (runs/counters.py). Each query is bounded: active runs come from the
partial claim/running indexes, windows only from runs scheduled in the last
TOTALS_WINDOW (the recent day partitions), never a count(*) of the whole job_runs.
Every declared series is exported from the first scrape, 0 until it counts something:
an alert rule on a missing series never fires. docs/CONTRACT.md ("Metrics") lists them.
Restrict access at the proxy, or set METRICS_TOKEN to require `Authorization: Bearer`.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobs import health
from runs import counters, selectors
from runs.models import ACTIVE_STATUSES

TOTALS_WINDOW = timedelta(hours=24)
# Per-tenant series stop here: a label per tenant, bounded like the tenant_* gauges.
TENANTS_SHOWN = 1000


class CronyardCollector(Collector):
    def __init__(self, *, now: datetime):
        self.now = now

    def collect(self) -> Iterator[Metric]:
        now = self.now
        lateness, due = selectors.oldest_due(now=now)
        yield GaugeMetricFamily(
            "cronyard_oldest_due_seconds",
            "Seconds since the next_run_at of the most overdue unpaused job (0 when none is due).",
            value=lateness,
        )
        yield GaugeMetricFamily("cronyard_jobs_due", "Unpaused jobs whose next_run_at has passed.", value=due)
        late = settings.SCHEDULER_OVERDUE_ALERT_SECONDS
        overdue = health.overdue_by_tenant(now=now, late_seconds=late)
        tenants = selectors.tenant_slugs(limit=TENANTS_SHOWN)
        yield _labelled(
            "cronyard_jobs_overdue",
            "Unpaused jobs whose next slot is late by more than SCHEDULER_OVERDUE_ALERT_SECONDS, per tenant "
            "(0 for a tenant with none).",
            "tenant",
            sorted({**dict.fromkeys(tenants, 0), **overdue}.items()),
        )
        yield _labelled(
            "cronyard_jobs_failing",
            "Jobs whose streak of failed runs has reached their alert_after_failures, per tenant "
            "(0 for a tenant with none).",
            "tenant",
            sorted({**dict.fromkeys(tenants, 0), **health.failing_by_tenant()}.items()),
        )
        yield _labelled(
            # Prometheus' base unit of time is the second and a moment is Unix seconds
            # (process_start_time_seconds); `_timestamp_seconds` says it is a moment, not a
            # duration, and `time() - x` is its age. A gauge: it can only be set, not rated.
            "cronyard_tenant_last_success_timestamp_seconds",
            "Unix time (seconds) the newest succeeded run of the tenant finished, per tenant "
            "(0 for a tenant with no success yet).",
            "tenant",
            selectors.tenant_last_success(limit=TENANTS_SHOWN),
        )
        yield from self.counters()

        depth = GaugeMetricFamily(
            "cronyard_queue_depth", "Active runs by priority and status.", labels=["priority", "status"]
        )
        counts = selectors.queue_depth()
        for priority in sorted({p for p, _ in counts} | {0}):
            for run_status in ACTIVE_STATUSES:
                depth.add_metric([str(priority), str(run_status)], counts.get((priority, run_status), 0))
        yield depth

        window = selectors.window_totals(since=now - TOTALS_WINDOW)
        expiries = window.pop("lease_expiries")
        yield _labelled(
            # A gauge over a sliding window, so no `_total`: Prometheus keeps that suffix for
            # counters, which only go up and which rate() may be applied to.
            "cronyard_runs_last_24h",
            "Runs scheduled in the last 24 h: dispatched (all rows), succeeded, retried "
            "(attempts used beyond the first), dead, skipped, cancelled. A sliding window, not a counter.",
            "status",
            window.items(),
        )
        yield GaugeMetricFamily(
            "cronyard_lease_expiries_last_24h",
            "Attempts whose lease expired before they reported, over runs scheduled in the last 24 h.",
            value=expiries,
        )

        nodes = selectors.scheduler_nodes()
        yield _labelled(
            "cronyard_partitions_owned",
            "Partitions a scheduler node holds, as of its last heartbeat.",
            "node",
            ((node.node_id, node.partitions) for node in nodes),
        )
        yield _labelled(
            "cronyard_scheduler_heartbeat_age_seconds",
            "Seconds since a node's last heartbeat.",
            "node",
            ((node.node_id, node.heartbeat_age_seconds) for node in nodes),
        )
        yield GaugeMetricFamily(
            "cronyard_scheduler_nodes",
            "Live scheduler nodes (heartbeat younger than two leases and lease session connected).",
            value=sum(1 for n in nodes if n.alive),
        )
        executors = selectors.executor_nodes()
        yield GaugeMetricFamily(
            "cronyard_executor_nodes",
            "Live executors (the same liveness rule as scheduler nodes).",
            value=sum(1 for n in executors if n.alive),
        )
        yield _labelled(
            "cronyard_executor_in_flight",
            "Runs an executor holds, as of its last heartbeat.",
            "node",
            ((node.node_id, node.in_flight) for node in executors),
        )
        yield GaugeMetricFamily(
            "cronyard_partitions_unowned",
            "Partitions that no live scheduler node holds.",
            value=selectors.unowned_partitions(nodes=nodes, total=settings.SCHEDULER_PARTITIONS),
        )

        loads = selectors.tenant_load(limit=TENANTS_SHOWN)
        yield _labelled(
            "cronyard_tenant_running",
            "Running runs per tenant (tenants with active runs).",
            "tenant",
            ((load.slug, load.running) for load in loads),
        )
        yield _labelled(
            "cronyard_tenant_max_concurrency",
            "max_concurrency of tenants with active runs.",
            "tenant",
            ((load.slug, load.max_concurrency) for load in loads),
        )
        circuits = GaugeMetricFamily(
            "cronyard_circuit_open",
            "1 per tenant and target host (scheme://host:port) whose circuit breaker is open or half-open.",
            labels=["tenant", "host"],
        )
        for circuit in selectors.open_circuits(limit=TENANTS_SHOWN):
            circuits.add_metric([circuit.tenant_slug, circuit.host], 1)
        yield circuits

    def counters(self) -> Iterator[Metric]:
        """Every counter of runs/counters.py, summed over the processes that counted."""
        found = selectors.counter_totals()
        for spec in counters.SPECS:
            family = CounterMetricFamily(spec.name, spec.help, labels=[spec.label] if spec.label else None)
            for label, value in counters.samples(spec, found):
                family.add_metric([label] if spec.label else [], value)
            yield family


def _labelled(
    name: str, documentation: str, label: str, samples: Iterable[tuple[str, float]]
) -> GaugeMetricFamily:
    """A gauge with one label: one sample per (label value, value)."""
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for key, value in samples:
        family.add_metric([key], value)
    return family


def metrics_token() -> str:
    return getattr(settings, "METRICS_TOKEN", "") or os.environ.get("METRICS_TOKEN", "")


def authorized(request: HttpRequest) -> bool:
    token = metrics_token()
    if not token:
        return True
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not authorized(request):
        response = HttpResponse("metrics token required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = "Bearer"
        return response
    # A registry per scrape: nothing global, nothing left over between requests.
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CronyardCollector(now=timezone.now()))
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
