"""The local Citus cluster's workers, for `make test-citus` tests that look at a worker
directly (its sessions, a transaction prepared on it): CRONYARD_CITUS_WORKERS, set by
scripts/citus_cluster.py, names them."""

from __future__ import annotations

import os

import psycopg
from psycopg.conninfo import make_conninfo

from runs.execution.connections import database_conninfo
from scheduler_project.citus import parse_workers, split_node


def workers() -> list[str]:
    """'host:port' of every worker."""
    return parse_workers(os.environ["CRONYARD_CITUS_WORKERS"])


def connect(node: str) -> psycopg.Connection:
    """An autocommit connection to the test database on the worker `node`."""
    host, port = split_node(node)
    return psycopg.connect(make_conninfo(database_conninfo(), host=host, port=port), autocommit=True)
