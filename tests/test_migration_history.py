"""A fresh install and an upgraded database end with one schema.

Three checks on two scratch databases of the test server (on Citus, databases of the
whole cluster):

- history: a fresh database migrated in one go to the migrations recorded in
  tests/upgraded_schema.txt must show exactly the schema recorded there, which is what
  a database upgraded release by release through those migrations has. A migration
  whose DDL or logic was edited after it shipped (or that still took it from code that
  changed since) shows up as a difference;
- path: the same fresh database, migrated on to today's last migrations, must equal a
  database that went there one migration at a time from the first release, with rows
  in it (a tenant, a job, a misfire, runs in a day partition and in the default one,
  and an occurrence-ledger range once that table exists);
- data: those rows are still there at the end, carrying the keys the key migrations
  gave them (and the tenant a signing secret); a success stored whole in run_history
  before runs 0024 made its row sparse reads as it did.

`CRONYARD_RECORD_SCHEMA=1` extends tests/upgraded_schema.txt to today's last
migrations, and only after the recorded part still matches: the file can take in new
migrations, never a changed old one.
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from psycopg import sql

from scheduler_project.citus import drop_database, parse_workers, prepare_database
from tests.support.schema import schema

RECORDED = Path(__file__).resolve().parent / "upgraded_schema.txt"
RECORD_ENV = "CRONYARD_RECORD_SCHEMA"
# The first release: job_runs and its day partitions (runs 0001 needs jobs 0001 only).
FIRST_RELEASE = [("runs", "0001_initial")]


def read_recorded() -> tuple[list[tuple[str, str]], list[str]]:
    targets, lines = [], []
    for line in RECORDED.read_text().splitlines():
        if line.startswith("#") or not line:
            continue
        if line.startswith("targets: "):
            targets = [tuple(t.split(".", 1)) for t in line.removeprefix("targets: ").split()]
        else:
            lines.append(line)
    return targets, lines


def write_recorded(targets: list[tuple[str, str]], lines: list[str]) -> None:
    header = RECORDED.read_text().split("\ntargets: ", 1)[0]
    body = "\n".join(lines)
    RECORDED.write_text(f"{header}\ntargets: {' '.join(f'{a}.{n}' for a, n in sorted(targets))}\n{body}\n")


# --- scratch databases --------------------------------------------------------------


def _citus_workers() -> list[str]:
    if connections["default"].settings_dict["ENGINE"] != "scheduler_project.citus_db":
        return []
    return parse_workers(os.environ.get("CRONYARD_CITUS_WORKERS", ""))


@contextmanager
def scratch_database(suffix: str) -> Iterator[str]:
    """An empty database on the test server, as a Django alias; one per xdist worker."""
    base = connections["default"].settings_dict
    name = f"test_history_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{suffix}"
    user = base["USER"]
    coordinator = f"{base['HOST'] or '127.0.0.1'}:{base['PORT'] or 5432}"
    workers = _citus_workers()
    if workers:
        drop_database(nodes=[coordinator, *workers], db=name, user=user)
        prepare_database(coordinator=coordinator, workers=workers, db=name, user=user)
    else:
        with psycopg.connect(
            host=base["HOST"] or "127.0.0.1", port=base["PORT"] or 5432, user=user,
            password=base.get("PASSWORD") or None, dbname="postgres", autocommit=True,
        ) as conn:  # fmt: skip
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    alias = f"history_{suffix}"
    connections.settings[alias] = {**base, "NAME": name}
    try:
        yield alias
    finally:
        connections[alias].close()
        del connections[alias]
        del connections.settings[alias]
        drop_database(nodes=[coordinator, *workers], db=name, user=user)


def migrate(alias: str, targets: list[tuple[str, str]]) -> None:
    """In one go, as `manage.py migrate` does."""
    executor = MigrationExecutor(connections[alias])
    executor.migrate(targets)


def migrate_one_at_a_time(alias: str, *, fill: dict) -> int:
    """Every migration not applied yet, each in its own step (its own transaction, as
    an upgrade to each release would), calling fill[key] right after that migration."""
    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    state = None
    for migration, _ in plan:
        key = (migration.app_label, migration.name)
        state = executor.migrate([key], plan=[(migration, False)], state=state)
        if key in fill:
            fill[key](state.apps, alias)
    return len(plan)


def leaves(alias: str) -> list[tuple[str, str]]:
    return sorted(MigrationExecutor(connections[alias]).loader.graph.leaf_nodes())


def schema_of(alias: str) -> dict[str, list[str]]:
    with connections[alias].cursor() as cursor:
        return schema(cursor)


# --- rows of the first releases, written through the models of their time -----------

JOB_ID = uuid.uuid4()
PARTITION = 17
TARGET = {"type": "task", "name": "noop"}


def first_release_rows(apps, alias: str) -> list[datetime]:
    """A tenant, a job, a misfire, and a run today, in three days (day partitions) and next
    year (the default partition). Returns the runs' scheduled_at."""
    now = datetime.now(UTC).replace(microsecond=0)  # after the migration made today's partition
    tenant = apps.get_model("jobs", "Tenant").objects.using(alias).create(slug="acme")
    apps.get_model("jobs", "Job").objects.using(alias).create(
        id=JOB_ID, name="j", interval_seconds=60, target=TARGET, partition_id=PARTITION, tenant=tenant
    )
    apps.get_model("jobs", "Misfire").objects.using(alias).create(
        job_id=JOB_ID, policy="skip", missed_count=2, first_missed_at=now, last_missed_at=now, runs_created=0
    )
    times = [now, now + timedelta(days=3), now + timedelta(days=365)]
    for at in times:
        apps.get_model("runs", "JobRun").objects.using(alias).create(
            job_id=JOB_ID, tenant=tenant, partition_id=PARTITION, scheduled_at=at, not_before=at,
            target=TARGET, status="succeeded",
        )  # fmt: skip
    return times


def ledger_range(apps, alias: str) -> None:
    now = datetime.now(UTC)
    apps.get_model("jobs", "SlotRange").objects.using(alias).create(
        job_id=JOB_ID, first_at=now, last_at=now, outcome="skipped", reason="paused", anchor=now
    )


def history_success(apps, alias: str) -> None:
    """A success as runs 0023's release wrote it into run_history: every column stored,
    uncommon values among them (runs 0024 makes the common ones NULL for later rows)."""
    at = SUCCESS_AT
    apps.get_model("runs", "RunHistoryRow").objects.using(alias).create(
        job_id=JOB_ID, tenant_id=apps.get_model("jobs", "Tenant").objects.using(alias).get().id,
        partition_id=PARTITION, scheduled_at=at, not_before=at + timedelta(seconds=5), status="succeeded",
        trigger="manual", attempt=2, target_version=1, job_name="j", started_at=at, finished_at=at,
        result_code=200,
    )  # fmt: skip


# An hour from now: today's day partition, or tomorrow's (both made ahead).
SUCCESS_AT = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)


# --- the test -----------------------------------------------------------------------


def test_a_fresh_install_and_an_upgraded_database_end_with_one_schema(django_db_blocker):
    targets, recorded = read_recorded()
    assert targets and recorded, f"{RECORDED} has no targets or no schema"
    # Not the test database's transaction: two databases of their own, in autocommit, as
    # `manage.py migrate` sees a database.
    with (
        django_db_blocker.unblock(),
        scratch_database("fresh") as fresh,
        scratch_database("upgraded") as upgraded,
    ):
        migrate(fresh, targets)
        fresh_at_targets = schema_of(fresh)["schema"]
        assert_same(recorded, fresh_at_targets, "upgraded through the releases (recorded)", "fresh install")
        migrate(fresh, leaves(fresh))
        fresh_now = schema_of(fresh)

        migrate(upgraded, FIRST_RELEASE)
        first_apps = MigrationExecutor(connections[upgraded]).loader.project_state(FIRST_RELEASE).apps
        run_times = first_release_rows(first_apps, upgraded)
        steps = migrate_one_at_a_time(
            upgraded,
            fill={
                ("jobs", "0004_occurrence_ledger"): ledger_range,
                ("runs", "0023_run_history"): history_success,
            },
        )
        assert steps > 20  # a real walk through the releases, not one step
        assert_same(schema_of(upgraded), fresh_now, "upgraded one migration at a time", "fresh install")

        with connections[upgraded].cursor() as cursor:
            cursor.execute("SELECT scheduled_at, partition_id FROM job_runs WHERE job_id = %s", [JOB_ID])
            assert sorted(cursor.fetchall()) == [(at, PARTITION) for at in run_times]
            cursor.execute("SELECT count(*) FROM job_runs_default")
            assert cursor.fetchone() == (1,)
            for table in ("job_misfires", "job_slot_ranges"):
                cursor.execute(f"SELECT partition_id FROM {table}")
                assert cursor.fetchall() == [(PARTITION,)], table
            # A tenant from before signed calls has a secret of its own (jobs 0014).
            cursor.execute("SELECT signing_secret FROM tenants")
            ((secret,),) = cursor.fetchall()
            assert secret.startswith("whsec_") and len(base64.b64decode(secret.removeprefix("whsec_"))) == 32
            # The job's target became its version 1 (jobs 0018); the runs written before keep
            # their own copy and name no version (runs 0018), which the claim falls back to.
            cursor.execute("SELECT job_id, partition_id, version, target->>'name' FROM job_targets")
            assert cursor.fetchall() == [(JOB_ID, PARTITION, 1, TARGET["name"])]
            cursor.execute("SELECT DISTINCT target_version, target->>'name' FROM job_runs")
            assert cursor.fetchall() == [(None, TARGET["name"])]
            # A success stored whole before runs 0024 reads as it did through the view.
            cursor.execute(
                "SELECT status, trigger, attempt, not_before - scheduled_at, lease_until, max_attempts,"
                " job_name FROM runs WHERE job_id = %s AND scheduled_at = %s",
                [JOB_ID, SUCCESS_AT],
            )
            assert cursor.fetchall() == [("succeeded", "manual", 2, timedelta(seconds=5), None, 5, "j")]

        if os.environ.get(RECORD_ENV):
            write_recorded(leaves(fresh), fresh_now["schema"])


def assert_same(expected, actual, expected_name: str, actual_name: str) -> None:
    if isinstance(expected, dict):
        for section in expected:
            assert_same(expected[section], actual[section], expected_name, actual_name)
        return
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    assert not missing and not extra, (
        f"only in the database {expected_name}:\n  " + "\n  ".join(missing)
        + f"\nonly in the database {actual_name}:\n  " + "\n  ".join(extra)
    )  # fmt: skip
