"""The database as the one clock and the one conninfo builder.

libpq connection strings for the connections kept outside the ORM (scheduler
leases, executor loops, benchmarks) use the same database, TLS and options as
Django's; `now()` is the database's clock, which every decision about slots uses so
that web hosts, schedulers and executors agree on what is past."""

from __future__ import annotations

from datetime import datetime

from psycopg.conninfo import make_conninfo

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
