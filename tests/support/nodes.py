"""Node sessions for tests: a node counts as alive only while a session named after it
is connected (scheduler_project.liveness), so a test that registers a node row by hand
holds a real connection with that application_name for as long as the node should live."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from django.db import connection

from scheduler_project import db


@contextlib.contextmanager
def sessions(*node_ids: str) -> Iterator[list[psycopg.Connection]]:
    conns = [
        psycopg.connect(db.conninfo(connection.settings_dict, application_name=n[:63]), autocommit=True)
        for n in node_ids
    ]
    try:
        yield conns
    finally:
        for conn in conns:
            conn.close()
