"""The web process as an operator starts it: gunicorn through scheduler_project/serve.py.

It refuses to start without collected static files (one line saying what to run, not a
server answering 500 on every console page), keeps no control socket in the user's
home, and guards /metrics with METRICS_TOKEN when it is set.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from scheduler_project import serve
from tests.conftest import database_url
from tests.support.web import WebServer, free_port


def test_without_collected_static_files_it_exits_saying_what_to_run(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "DEBUG": "false",
        "STATIC_ROOT": str(tmp_path / "never-collected"),
        "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none",
    }
    command = serve.gunicorn_command(port=free_port(), workers=1, python=sys.executable)
    done = subprocess.run(command, cwd=serve.ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1, done.stderr
    assert "collectstatic --noinput" in errors[0] and str(tmp_path / "never-collected") in errors[0]
    assert "Traceback" not in done.stderr


@pytest.mark.django_db(transaction=True)
def test_metrics_token_and_no_control_socket_in_home(tmp_path):
    """On a shared network /metrics names every tenant and target host: with
    METRICS_TOKEN set, only a scraper holding the token reads it."""
    home = tmp_path / "home"
    home.mkdir()
    server = WebServer(
        database_url=database_url(),
        workdir=tmp_path,
        env={"HOME": str(home), "METRICS_TOKEN": "scrape-token-1"},
    )
    server.workers = 1
    server.start()
    try:
        assert requests.get(server.url + "/metrics", timeout=10).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert requests.get(server.url + "/metrics", headers=wrong, timeout=10).status_code == 401
        right = {"Authorization": "Bearer scrape-token-1"}
        answer = requests.get(server.url + "/metrics", headers=right, timeout=10)
        assert answer.status_code == 200 and "cronyard_queue_depth" in answer.text
        # gunicorn's default control socket is $HOME/.gunicorn/gunicorn.ctl: none is made.
        assert list(home.iterdir()) == []
    finally:
        server.stop()
