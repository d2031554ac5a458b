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


@pytest.mark.parametrize(
    "path",
    ["/api/v1/nothing-here/", "/api/v2/jobs/", "/api/", "/api/v1/runs/only-a-job-id/"],
)
def test_unknown_api_paths_answer_json_404s(web_server, path):
    answer = requests.get(web_server.url + path, timeout=10)
    assert answer.status_code == 404
    assert answer.headers["Content-Type"].startswith("application/json")
    assert path in answer.json()["detail"] and "/api/v1/" in answer.json()["detail"]


@pytest.mark.parametrize("path", ["/api/v1/", "/api/v1"])
def test_the_api_root_lists_the_resources(web_server, path):
    answer = requests.get(web_server.url + path, timeout=10)
    assert answer.status_code == 200
    resources = answer.json()["resources"]
    assert {"jobs", "runs", "dead_letter", "audit", "tasks", "health"} <= set(resources)
    # Every listed resource exists: without a token it is a 401/403, never a 404.
    for name, url in resources.items():
        status = requests.get(url, timeout=10).status_code
        assert status in (200, 401, 403, 405), (name, url, status)


def test_openapi_tags_name_resources(web_server):
    schema = requests.get(web_server.url + "/api/schema/?format=json", timeout=30).json()
    tags = {tag for op in schema["paths"].values() for spec in op.values() for tag in spec.get("tags", [])}
    assert {"jobs", "runs", "audit", "tasks"} <= tags
    assert "v1" not in tags


@pytest.mark.parametrize("path", ["/api/docs", "/api/redoc", "/api/schema"])
def test_the_docs_answer_without_the_trailing_slash_too(web_server, path):
    assert requests.get(web_server.url + path, timeout=30).status_code == 200


JSON_FIELDS = {"time", "level", "logger", "pid", "message"}


def json_lines(text: str) -> list[dict]:
    """Every line of a log as JSON objects; fails on a line that is not one."""
    import json

    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "no log lines"
    out = []
    for line in lines:
        record = json.loads(line)  # a plain line fails here
        assert JSON_FIELDS <= set(record), record
        out.append(record)
    return out


@pytest.mark.django_db(transaction=True)
def test_log_format_json_every_process(tmp_path, child_env):
    """LOG_FORMAT=json: the web process (gunicorn's own lines and access log included),
    a scheduler and an executor each write one JSON object per line, same field names."""
    server = WebServer(
        database_url=database_url(), workdir=tmp_path, env={"LOG_FORMAT": "json", "LOG_LEVEL": "INFO"}
    )
    server.workers = 1
    server.start()
    try:
        assert requests.get(server.url + "/api/v1/", timeout=10).status_code == 200
        assert requests.get(server.url + "/api/v1/nothing", timeout=10).status_code == 404
    finally:
        server.stop()
    web = json_lines(server.log_path.read_text())
    assert {"gunicorn.error", "gunicorn.access"} <= {r["logger"] for r in web}
    env = {**child_env, "LOG_FORMAT": "json", "LOG_LEVEL": "DEBUG"}
    for command in (["run_scheduler", "--once"], ["run_executor", "--once"]):
        done = subprocess.run(
            [sys.executable, "manage.py", *command],
            cwd=serve.ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        records = json_lines(done.stderr + done.stdout)
        assert any(r["logger"].startswith(("jobs.", "runs.")) for r in records), records[:5]
