"""The database as the one clock, the one conninfo builder and the one raw cursor.

libpq connection strings for the connections kept outside the ORM (scheduler
leases, executor loops, benchmarks) use the same database, TLS and options as
Django's; `now()` is the database's clock, which every decision about slots uses so
that web hosts, schedulers and executors agree on what is past; `raw_cursor` is the
server-side-binding cursor on Django's connection that the dispatch transaction's
statements use."""

from __future__ import annotations

from datetime import datetime

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.types.json import JsonbLoader

# libpq parameters Django's OPTIONS may carry; Django-only keys are left out.
_LIBPQ_OPTIONS = {
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
    "options",
    "target_session_attrs",
    "passfile",
    "service",
    "gssencmode",
    "channel_binding",
}


def conninfo(settings_dict: dict, *, application_name: str = "") -> str:
    """libpq conninfo for a Django database settings dict (the test database under pytest)."""
    parts = {
        "dbname": settings_dict.get("NAME") or "",
        "user": settings_dict.get("USER") or "",
        "password": settings_dict.get("PASSWORD") or "",
        "host": settings_dict.get("HOST") or "",
        "port": str(settings_dict.get("PORT") or ""),
        "application_name": application_name,
    }
    options = settings_dict.get("OPTIONS") or {}
    parts.update({k: str(v) for k, v in options.items() if k in _LIBPQ_OPTIONS})
    return make_conninfo(**{k: v for k, v in parts.items() if v})


def now() -> datetime:
    """The database's clock (transaction start inside a transaction), aware UTC.

    Schedulers dispatch on this clock; a web host whose clock drifts must not decide
    which slots are past (resume, edit, pause, backfill) on a different one.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def ping() -> None:
    """One round trip to the database; raises when it cannot be reached."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def raw_cursor(db) -> psycopg.Cursor:
    """A server-side-binding cursor on Django's connection (same session, same transaction).

    Django's cursors bind parameters client-side: each batch's arrays were quoted into
    SQL text, a tenth of the scheduler's time at 100k due jobs, and no statement could
    be prepared. Use inside `connection.wrap_database_errors`, so failures are still
    Django's DatabaseError (the scheduler's step() halves the batch on those).
    """
    db.ensure_connection()
    cursor = psycopg.Cursor(db.connection)
    # Django loads jsonb as text for its JSONField to decode; planning wants the values.
    cursor.adapters.register_loader("jsonb", JsonbLoader)
    return cursor
