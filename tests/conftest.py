"""Shared fixtures: tenants and API clients, child processes on the test database,
and a real HTTP target on 127.0.0.1."""

from __future__ import annotations

import os

import pytest

from tests.support.processes import Processes


@pytest.fixture
def tenant_and_token(db):
    from jobs.tenant_services import create_tenant

    return create_tenant(slug="acme", max_concurrency=10)


@pytest.fixture
def tenant(tenant_and_token):
    return tenant_and_token[0]


@pytest.fixture
def api(tenant_and_token):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant_and_token[1]}")
    return client


def database_url() -> str:
    """URL of the database the tests run against (the test database, not the dev one)."""
    from django.db import connection

    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def child_env(transactional_db):
    """Environment for manage.py child processes: same test database, short timings.

    Connections persist as the product's settings say (CONN_MAX_AGE): the processes under
    test reconnect after an outage, and on Citus keep their worker connections, as users'
    do."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        DJANGO_SETTINGS_MODULE="scheduler_project.settings",
        PYTHONUNBUFFERED="1",
        SCHEDULER_POLL_SECONDS="0.2",
        EXECUTOR_POLL_SECONDS="0.2",
        SCHEDULER_ALLOW_PRIVATE_TARGETS="true",
        EXECUTOR_TASK_MODULES="runs.builtin_tasks,tests.support.tasks",
    )
    return env


@pytest.fixture
def processes(child_env, tmp_path):
    procs = Processes(child_env, tmp_path)
    yield procs
    try:
        procs.stop_all()
    finally:
        print(procs.summary())


@pytest.fixture
def per_partition_forms(monkeypatch):
    """The Citus statement forms (one statement per partition) on this plain PostgreSQL,
    in this process: the per-partition policy answers yes whatever the engine, for the
    executor's and the scheduler's statements alike (runs/per_partition.py)."""
    from runs import per_partition

    monkeypatch.setattr(per_partition, "one_statement_per_partition", lambda *, citus: True)


@pytest.fixture
def http_target():
    from tests.support.http_target import HttpTarget

    server = HttpTarget()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def steps():
    """Executors whose steps a test awaits in-process (tests/support/executor.Steps)."""
    from tests.support.executor import Steps

    opened: list[Steps] = []

    def make(**options) -> Steps:
        opened.append(Steps(**options))
        return opened[-1]

    yield make
    for s in opened:
        s.close()


@pytest.fixture(scope="session")
def web_server(django_db_setup, django_db_blocker, tmp_path_factory):
    """gunicorn as `make run` starts it (DEBUG off, collectstatic, WhiteNoise) on the test
    database; one per test session (per xdist worker that asks for it)."""
    from tests.support.web import WebServer

    with django_db_blocker.unblock():
        url = database_url()
    server = WebServer(database_url=url, workdir=tmp_path_factory.mktemp("web"))
    server.start()
    yield server
    server.stop()
