"""The one definition of "this node is alive", for schedulers and executors alike.

A node (a row of scheduler_nodes or executor_nodes) is alive when BOTH hold:

* its heartbeat is younger than two scheduler leases (SCHEDULER_LEASE_SECONDS), on
  the database clock, so web hosts with drifting clocks agree with the nodes; and
* the node's own session is still connected (`pg_stat_activity.application_name` =
  the node id, as libpq truncates it to 63 bytes). A SIGKILLed node's socket is
  closed by the kernel, so it drops out at once instead of two leases later.

The schedulers' rebalancing (jobs/dispatch/partition_leases.py), the admin lists, the dashboard and
/metrics all evaluate this SQL; nothing computes liveness in Python, so they
cannot disagree (they once used three rules: 1 lease, 2 leases, 2 leases + session).
"""

from __future__ import annotations

import os
import secrets
import socket

from django.conf import settings
from django.db.models import BooleanField, QuerySet
from django.db.models.expressions import RawSQL

LEASES_OF_SILENCE = 2


def make_node_id() -> str:
    """A node's id (schedulers and executors), also its session's application_name.

    Host and pid say where it runs; the random suffix makes a restarted process that
    got the same pid a new node. At most 75 characters (the columns hold 100).
    """
    return f"{socket.gethostname()[:60]}:{os.getpid()}:{secrets.token_hex(3)}"


def window_seconds(lease_seconds: float | None = None) -> float:
    """How long a heartbeat stays fresh: two leases (the configured one by default)."""
    lease = settings.SCHEDULER_LEASE_SECONDS if lease_seconds is None else lease_seconds
    return float(LEASES_OF_SILENCE * lease)


def alive_sql(alias: str) -> str:
    """A boolean SQL expression over the node row `alias`; takes one parameter, window_seconds()."""
    return (
        f"({alias}.heartbeat_at > now() - make_interval(secs => %s)"
        " AND EXISTS (SELECT 1 FROM pg_stat_activity a"
        f" WHERE a.application_name = left({alias}.node_id, 63) AND a.datname = current_database()))"
    )


def with_alive(queryset: QuerySet, *, lease_seconds: float | None = None) -> QuerySet:
    """The node rows of `queryset` annotated with `alive` and `heartbeat_age_seconds` (database clock)."""
    table = queryset.model._meta.db_table
    return queryset.annotate(
        alive=RawSQL(alive_sql(f'"{table}"'), [window_seconds(lease_seconds)], output_field=BooleanField()),
        heartbeat_age_seconds=RawSQL(
            f'GREATEST(0, EXTRACT(EPOCH FROM now() - "{table}".heartbeat_at))::float8', []
        ),
    )
