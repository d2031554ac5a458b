"""Idle circuit-breaker rows are pruned by the schedulers' hourly maintenance: every host
a tenant ever tried (junk ones included) must not keep a `target_hosts` row forever."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import psycopg
import pytest
from django.db import connection

from runs.execution import breakers
from runs.models import TargetHost
from tests.conftest import database_url
from tests.support.scheduler import in_process_schedulers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def make_scheduler():
    yield from in_process_schedulers(at=datetime.now(UTC))


def _rows(*rows: tuple[int, str, str, str, str | None]) -> None:
    """(tenant_id, host, state, idle for, open_until from now) rows, times as intervals."""
    with connection.cursor() as cursor:
        for tenant_id, host, state, idle, open_until in rows:
            cursor.execute(
                "INSERT INTO target_hosts (tenant_id, host, state, failures, cooldown_seconds, requests,"
                " retries, updated_at, open_until)"
                " VALUES (%s, %s, %s, 0, 5, 0, 0, now() - %s::interval, now() + %s::interval)",
                [tenant_id, host, state, idle, open_until],
            )


def _left() -> set[tuple[int, str]]:
    return set(TargetHost.objects.values_list("tenant_id", "host"))


def test_the_schedulers_maintenance_prunes_rows_idle_for_an_hour(make_scheduler):
    _rows(
        (1, "http://junk.example:80", "closed", "61 minutes", None),
        (1, "http://gave-up.example:80", "open", "2 hours", "-2 hours"),  # nobody came back to probe
        (1, "http://recent.example:80", "closed", "59 minutes", None),
        (2, "http://junk.example:80", "half_open", "5 minutes", "-4 minutes"),
    )
    # More than one batch of junk from one tenant.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO target_hosts (tenant_id, host, state, failures, cooldown_seconds, requests, retries,"
            " updated_at) SELECT 3, 'http://junk-' || n || '.example:80', 'closed', 0, 0, 0, 0,"
            " now() - interval '1 day' FROM generate_series(1, %s) AS n",
            [breakers.PRUNE_BATCH + 7],
        )

    make_scheduler(node_id="n1", maintain_partitions=True).step()

    assert _left() == {(1, "http://recent.example:80"), (2, "http://junk.example:80")}


def test_pruning_skips_a_row_an_executor_holds_instead_of_waiting_for_it():
    _rows(
        (1, "http://held.example:80", "closed", "2 hours", None),
        (1, "http://idle.example:80", "closed", "2 hours", None),
    )
    with psycopg.connect(database_url()) as executor:  # a transaction, as admit or record holds
        executor.execute("SELECT 1 FROM target_hosts WHERE host = 'http://held.example:80' FOR UPDATE")
        started = time.monotonic()
        with connection.cursor() as cursor:
            assert breakers.prune_idle(cursor) == 1
        assert time.monotonic() - started < 5
    assert _left() == {(1, "http://held.example:80")}
