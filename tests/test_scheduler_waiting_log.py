"""What a scheduler says while it holds no partitions yet: that it waits for its share."""

from __future__ import annotations

import logging

import pytest

from jobs.dispatch.scheduler import Scheduler
from tests.conftest import database_url

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_node_without_partitions_logs_that_it_waits(caplog):
    kwargs = {"heartbeat_thread": False, "maintain_partitions": False, "lease_seconds": 30}
    first = Scheduler(conninfo=database_url(), node_id="first", **kwargs)
    second = Scheduler(conninfo=database_url(), node_id="second", **kwargs)
    try:
        first.start()  # takes every partition until its next heartbeat sees the second node
        with caplog.at_level(logging.INFO, logger="jobs.dispatch.scheduler"):
            assert second.step() is False
        assert not second.lease.snapshot.owned
        lines = [r.getMessage() for r in caplog.records if r.name == "jobs.dispatch.scheduler"]
        assert "not dispatching node=second: waiting for its share of partitions" in lines, lines
        assert not any("no usable lease" in line for line in lines), lines
    finally:
        second.close()
        first.close()
