"""Day partitions of job_runs and run_history: creating them ahead, retention, the
one-maintainer lock.

Both tables are `PARTITION BY RANGE (scheduled_at)` with one partition per UTC day
(`job_runs_pYYYYMMDD`, `run_history_pYYYYMMDD`) plus a default partition
(`job_runs_default`, `run_history_default`), which catches backfills into days
that were already dropped or not created yet. The two keep the same days: a success
moves its row from one to the other within its day. Retention drops whole days, which is
instant and leaves no bloat, instead of DELETEing millions of rows. The table itself,
its keys and indexes belong to runs/migrations: a new partition copies the parent's,
so nothing here names them.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db import OperationalError, connection, transaction

from runs.models import ACTIVE_STATUSES

log = logging.getLogger(__name__)

PARENT = "job_runs"
DEFAULT = "job_runs_default"
# Succeeded runs (docs/decisions/0085-run-history.md): no run in it is open.
HISTORY = "run_history"
ACTIVE_SQL = "(" + ", ".join(f"'{status}'" for status in ACTIVE_STATUSES) + ")"
# A day partition's name, its day captured: a regular expression that Python and
# PostgreSQL read alike (partition_name writes it).
NAME_PATTERN = "job_runs_p([0-9]{8})"
# The same in SQL: the start (UTC midnight) of every day partition, as `day_start` rows.
DAY_STARTS_SQL = f"""
SELECT to_date(substring(c.relname FROM '^{NAME_PATTERN}$'), 'YYYYMMDD')::timestamp
       AT TIME ZONE 'UTC' AS day_start
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'job_runs'::regclass AND c.relname ~ '^{NAME_PATTERN}$'
"""


@dataclass(frozen=True)
class MaintenanceReport:
    created: list[str]
    dropped: list[str]
    moved_rows: int
    skipped: bool = False  # wait=False found another maintainer at work: nothing done


def partition_name(day: date, parent: str = PARENT) -> str:
    return f"{parent}_p{day:%Y%m%d}"


def existing_days(cursor, parent: str = PARENT) -> list[date]:
    cursor.execute(
        """
        SELECT c.relname FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent
        WHERE p.relname = %s
        """,
        [parent],
    )
    days = []
    for (name,) in cursor.fetchall():
        match = re.match(rf"^{parent}_p([0-9]{{8}})$", name)
        if match:
            days.append(datetime.strptime(match.group(1), "%Y%m%d").date())
    return sorted(days)


def _create_day(cursor, day: date, parent: str = PARENT) -> int:
    """Create one day partition, first moving that day's rows out of the default partition.

    PostgreSQL refuses to create a partition whose range already has rows in the
    default partition, so the rows are moved into a plain table that is then attached.
    """
    name = partition_name(day, parent)
    default = f"{parent}_default"
    lower = datetime(day.year, day.month, day.day, tzinfo=UTC)
    upper = lower + timedelta(days=1)
    cursor.execute(
        f"SELECT 1 FROM {default} WHERE scheduled_at >= %s AND scheduled_at < %s LIMIT 1", [lower, upper]
    )
    if cursor.fetchone() is None:
        cursor.execute(
            f"CREATE TABLE {name} PARTITION OF {parent} FOR VALUES FROM (%s) TO (%s)", [lower, upper]
        )
        return 0
    cursor.execute(f"CREATE TABLE {name} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    cursor.execute(
        f"""
        WITH moved AS (
            DELETE FROM {default} WHERE scheduled_at >= %s AND scheduled_at < %s RETURNING *
        )
        INSERT INTO {name} SELECT * FROM moved
        """,
        [lower, upper],
    )
    moved = cursor.rowcount
    cursor.execute(
        f"ALTER TABLE {parent} ATTACH PARTITION {name} FOR VALUES FROM (%s) TO (%s)", [lower, upper]
    )
    return moved


# How long retention waits for a lock before skipping a day until the next run. A DROP
# needs an ACCESS EXCLUSIVE lock on job_runs itself, and while it waits every new query
# on job_runs queues behind it: the wait must stay short.
DROP_LOCK_TIMEOUT_MS = 1_000
# The transaction-level advisory lock (hashed) of "one maintainer at a time".
MAINTAINER_LOCK = "cronyard.maintain_partitions"
_LOCK_NOT_AVAILABLE = "55P03"


def maintain(
    *,
    days_ahead: int = 7,
    retention_days: int,
    today: date | None = None,
    lock_timeout_ms: int = DROP_LOCK_TIMEOUT_MS,
    wait: bool = True,
) -> MaintenanceReport:
    """Create partitions from today through today+days_ahead; drop days older than retention.

    One maintainer at a time, whoever calls (the command, every scheduler node each
    hour). `wait=False` (the schedulers) skips at once when another one is
    at work, so nodes that start together do not queue behind each other; the report
    then says `skipped`.
    """
    today = today or datetime.now(UTC).date()
    created: list[str] = []
    dropped: list[str] = []
    moved = 0
    with transaction.atomic(), connection.cursor() as cursor:
        if wait:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [MAINTAINER_LOCK])
        else:
            cursor.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))", [MAINTAINER_LOCK])
            if not cursor.fetchone()[0]:
                return MaintenanceReport(created=[], dropped=[], moved_rows=0, skipped=True)
        have = set(existing_days(cursor))
        for parent in (PARENT, HISTORY):
            days = have if parent == PARENT else set(existing_days(cursor, HISTORY))
            for offset in range(days_ahead + 1):
                day = today + timedelta(days=offset)
                if day not in days:
                    moved += _create_day(cursor, day, parent)
                    created.append(partition_name(day, parent))
        oldest_kept = today - timedelta(days=retention_days)
        for day in sorted(have):
            if day < oldest_kept and _drop_day_if_idle(cursor, partition_name(day), lock_timeout_ms):
                dropped.append(partition_name(day))
        # A history day goes once its job_runs day has: a run that day kept open (a long
        # retry chain) still finds its history day when it succeeds.
        kept = set(existing_days(cursor))
        for day in existing_days(cursor, HISTORY):
            name = partition_name(day, HISTORY)
            if day < oldest_kept and day not in kept and _drop_if_granted(cursor, name, lock_timeout_ms):
                dropped.append(name)
        # Row by row, so no table lock is needed: a replay that commits first leaves its
        # row queued, and DELETE re-checks the status of a row it waited for.
        cursor.execute(
            f"DELETE FROM {DEFAULT} WHERE scheduled_at < %s AND status NOT IN {ACTIVE_SQL}",
            [datetime(oldest_kept.year, oldest_kept.month, oldest_kept.day, tzinfo=UTC)],
        )
        cursor.execute(
            f"DELETE FROM {HISTORY}_default WHERE scheduled_at < %s",
            [datetime(oldest_kept.year, oldest_kept.month, oldest_kept.day, tzinfo=UTC)],
        )
        # The occurrence ledger's unfired ranges follow the runs' retention: the ledger
        # speaks for the same window (jobs.ledger.life_start).
        cursor.execute(
            "DELETE FROM job_slot_ranges WHERE last_at < %s",
            [datetime(oldest_kept.year, oldest_kept.month, oldest_kept.day, tzinfo=UTC)],
        )
    if created or dropped:
        log.info("run partitions: created %s, dropped %s, moved %d rows", created, dropped, moved)
    return MaintenanceReport(created=created, dropped=dropped, moved_rows=moved)


def _has_active(cursor, name: str) -> bool:
    cursor.execute(f"SELECT 1 FROM {name} WHERE status IN {ACTIVE_SQL} LIMIT 1")
    return cursor.fetchone() is not None


def _drop_day_if_idle(cursor, name: str, lock_timeout_ms: int) -> bool:
    """Drop one old day unless it holds a queued, running or retrying run.

    A day still holding an active run (a long retry chain, a replay) is kept until that
    run is final; dropping it would lose the run and fence its executor for no reason.
    The check and the drop must be atomic with respect to replay and cancel: a replay
    that turned a dead run back into `queued` but had not committed was invisible to
    the check, and the DROP then waited for it and removed the fresh run. SHARE ROW
    EXCLUSIVE waits for every open writer of this day and keeps new ones out, so the
    re-check under it sees their committed result and nothing can change before the DROP.
    A lock that is not granted within `lock_timeout_ms` skips the day until next time.
    """
    if _has_active(cursor, name):
        return False  # cheap first look without a lock: most old days are simply busy or idle
    return _drop_if_granted(cursor, name, lock_timeout_ms, recheck=True)


def _drop_if_granted(cursor, name: str, lock_timeout_ms: int, *, recheck: bool = False) -> bool:
    """DROP one day partition under a lock granted within `lock_timeout_ms`, else keep it
    until next time; `recheck`: not if it holds an active run under the lock."""
    cursor.execute("SELECT current_setting('lock_timeout')")
    (previous,) = cursor.fetchone()
    try:
        with transaction.atomic():  # a savepoint: a lock timeout undoes only this day
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{int(lock_timeout_ms)}ms"])
            cursor.execute(f"LOCK TABLE {name} IN SHARE ROW EXCLUSIVE MODE")
            if recheck and _has_active(cursor, name):
                return False
            cursor.execute(f"DROP TABLE {name}")
            return True
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
            raise
        log.warning(
            "run retention: %s is busy (no lock within %d ms); kept until next run",
            name,
            lock_timeout_ms,
        )
        return False
    finally:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])
