"""The jobs the dispatch benchmarks fire: what users schedule (docs/CONTRACT.md, "Benchmark workload"),
or intervals only.

    realistic  cron in a dozen IANA zones (hourly `0 * * * *` and `H * * * *`, daily
               `0 9 * * *` local, weekdays `0 9 * * 1-5`, `*/5 * * * *`) plus 15 %
               intervals (1 min, 5 min, 1 h)
    interval   every job `interval_seconds = 3600` in UTC (the cheapest case, kept as
               the second row because earlier numbers were measured on it)

bench/dispatch.py (Cronyard) and bench/raw_dispatch.py (the limit) both build their
jobs here, so they fire the same rows: same ids (seeded, so `H` hashes the same),
same expressions, zones, targets and snapshot columns. Jobs are written with COPY:
1,000,000 ORM instances would take longer than dispatching them.

`verify` is what every dispatch round ends with: 0 duplicates, 0 missing, and the
new next_run_at of a sample of jobs equal to what `jobs.dispatch.planning.next_slot` says.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg.types.json import Jsonb

WORKLOADS = ("realistic", "interval")
ZONES = (
    "UTC",
    "America/New_York",
    "America/Chicago",
    "America/Los_Angeles",
    "America/Sao_Paulo",
    "Europe/London",
    "Europe/Berlin",
    "Europe/Moscow",
    "Asia/Kolkata",
    "Asia/Shanghai",
    "Asia/Tokyo",
    "Australia/Sydney",
)
# One cycle of 20 jobs: (cron_expr, interval_seconds). Zones cycle over 12, so the
# 60 (shape, zone) pairs all occur.
REALISTIC_SHAPES = (
    *[("0 * * * *", None)] * 4,
    *[("H * * * *", None)] * 4,
    *[("0 9 * * *", None)] * 4,
    *[("0 9 * * 1-5", None)] * 2,
    *[("*/5 * * * *", None)] * 3,
    ("", 60),
    ("", 300),
    ("", 3600),
)
TARGET = {"type": "http", "url": "http://127.0.0.1:9/noop", "method": "POST", "headers": {}, "body": ""}
# The Job columns COPY writes; every other column takes the model's default.
_PER_ROW = ("id", "name", "cron_expr", "time_zone", "interval_seconds", "partition_id", "next_run_at")
VERIFY_SAMPLE = 2_000


def job_shape(workload: str, i: int) -> tuple[str, str, int | None]:
    """(cron_expr, time_zone, interval_seconds) of the i-th job of `workload`."""
    if workload == "interval":
        return "", "UTC", 3600
    cron, interval = REALISTIC_SHAPES[i % len(REALISTIC_SHAPES)]
    return cron, ZONES[i % len(ZONES)], interval


def create_jobs(url: str, *, n: int, workload: str, later: datetime, seed: int = 12) -> None:
    """Empty the dispatch tables and COPY `n` jobs of `workload` in, next_run_at = `later`."""
    from jobs.models import Job, Tenant
    from jobs.services import partition_for
    from runs.execution.signing import new_secret

    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE job_runs, run_history, job_misfires, job_slot_ranges, scheduler_nodes, job_targets,"
            " jobs"
        )
    tenant, _ = Tenant.objects.get_or_create(
        slug="bench", defaults={"name": "bench", "max_concurrency": 1000, "signing_secret": new_secret()}
    )
    # Defaults as the model sets them (Python-side defaults: the columns have none).
    template = Job(tenant=tenant, target=TARGET, created_at=later, updated_at=later)
    fixed = {
        f.column: getattr(template, f.attname)
        for f in Job._meta.concrete_fields
        if f.name not in _PER_ROW and f.column != "id"
    }
    fixed["target"] = Jsonb(TARGET)
    fixed["dst_policy"] = Jsonb(fixed["dst_policy"])
    columns = [*_PER_ROW, *fixed]
    tail = tuple(fixed.values())
    rng = random.Random(seed)
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY jobs ({', '.join(columns)}) FROM STDIN") as copy:
            for i in range(n):
                job_id = uuid.UUID(int=rng.getrandbits(128), version=4)
                cron, zone, interval = job_shape(workload, i)
                copy.write_row(
                    (job_id, f"bench-{i}", cron, zone, interval, partition_for(job_id), later, *tail)
                )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO job_targets (partition_id, job_id, version, target, created_at)"
            " SELECT partition_id, id, target_version, target, now() FROM jobs"
        )
        conn.execute("VACUUM ANALYZE jobs")


def make_due(conn: psycopg.Connection) -> datetime:
    """Every job due at one moment, a second ago (on time: within the misfire threshold)."""
    moment = conn.execute("SELECT date_trunc('second', now()) - interval '1 second'").fetchone()[0]
    conn.execute("UPDATE jobs SET next_run_at = %s", [moment])
    return moment


def verify(conn: psycopg.Connection, *, n: int, moment: datetime, runs_table: str = "job_runs") -> dict:
    """Duplicates, missing runs and next times that differ from the product's, after a round
    (`runs_table`: a trusted constant, job_runs or the minimal limit's table)."""
    from jobs.dispatch.planning import next_slot
    from jobs.models import Job

    duplicates = conn.execute(
        f"SELECT count(*) FROM (SELECT 1 FROM {runs_table} GROUP BY job_id, scheduled_at"
        " HAVING count(*) > 1) d"
    ).fetchone()[0]
    fired = conn.execute(
        f"SELECT count(DISTINCT job_id) FROM {runs_table} WHERE scheduled_at = %s", [moment]
    ).fetchone()[0]
    extra = conn.execute(f"SELECT count(*) FROM {runs_table} WHERE scheduled_at <> %s", [moment]).fetchone()[
        0
    ]
    # A dense job (`H * * * *`, 1 min) can fire again while a long round runs: its next
    # time follows its latest run, not the moment.
    sample = list(Job.objects.order_by("?")[:VERIFY_SAMPLE])
    latest = dict(
        conn.execute(
            f"SELECT job_id, max(scheduled_at) FROM {runs_table} WHERE job_id = ANY(%s) GROUP BY job_id",
            [[job.id for job in sample]],
        ).fetchall()
    )
    wrong_next = 0
    for job in sample:
        last = latest.get(job.id, moment)
        wrong_next += job.next_run_at != next_slot(job, after=last, anchor=last)
    return {"duplicates": duplicates, "missing": n - fired, "extra": extra, "wrong_next": wrong_next}


def later_than_now() -> datetime:
    return datetime.now(UTC) + timedelta(days=1)


def retained_partitions() -> int:
    """Give job_runs the day partitions a database has after RUN_RETENTION_DAYS of use
    (empty), as well as the days ahead; returns how many it created. A claim or an insert
    that names no day is planned over every partition (on Citus, on the worker, for each
    statement): a fresh database's nine partitions made every round look faster than a
    month-old installation runs (docs/SCALING.md). Needs Django set up."""
    from datetime import UTC, timedelta
    from datetime import datetime as dt

    from django.conf import settings

    from runs.day_partitions import maintain

    retention = settings.RUN_RETENTION_DAYS
    start = dt.now(UTC).date() - timedelta(days=retention)
    return len(maintain(days_ahead=retention + 7, retention_days=retention, today=start).created)
