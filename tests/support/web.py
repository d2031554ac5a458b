"""The real web process for browser tests: gunicorn started as `make run` starts it.

pytest-django's live_server serves /static/ by itself, which once hid that gunicorn
served none of it. This starts the production path instead: collectstatic into a
private STATIC_ROOT, then gunicorn (command line from scheduler_project.serve) with
DEBUG off and WhiteNoise, on a free 127.0.0.1 port, against the test database.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from scheduler_project import serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebServer:
    def __init__(self, *, database_url: str, workdir: Path, env: dict[str, str] | None = None):
        self.log_path = workdir / "gunicorn.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "DEBUG": "false",
            "STATIC_ROOT": str(workdir / "static"),
            "PYTHONUNBUFFERED": "1",
            # The registry the test executors load (tests/conftest.py child_env): the admin's
            # kwargs form is driven with the test tasks too.
            "EXECUTOR_TASK_MODULES": "runs.builtin_tasks,tests.support.tasks",
            **(env or {}),
        }
        self.proc: subprocess.Popen | None = None
        self.workers = 2

    def start(self, *, timeout: float = 90) -> None:
        serve.collectstatic(env=self.env, python=sys.executable)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            serve.gunicorn_command(port=self.port, workers=self.workers, python=sys.executable),
            cwd=serve.ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited {self.proc.returncode}:\n{self.log()}")
            if self._answers():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn not answering after {timeout:.0f}s:\n{self.log()}")
            time.sleep(0.2)

    def fresh_workers(self, *, timeout: float = 90) -> None:
        """Replace every worker (SIGHUP) and wait until only new ones answer.

        A transactional test's flush recreates django_content_type with new ids, and a
        worker that cached the old ones (ContentTypeManager) writes admin log entries
        that violate their foreign key: per-process caches must be as fresh as the data.
        """
        assert self.proc is not None
        old = self._workers()
        os.kill(self.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while True:
            current = self._workers()
            if current and not current & old and len(current) >= self.workers and self._answers():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn workers not replaced after {timeout:.0f}s:\n{self.log()}")
            time.sleep(0.1)

    def _answers(self) -> bool:
        """Whether a worker answers the health endpoint (anything but a 5xx)."""
        try:
            return requests.get(f"{self.url}/api/v1/health", timeout=5).status_code < 500
        except (requests.ConnectionError, requests.Timeout):
            # Not listening yet, or a worker still booting on a loaded machine: ask again.
            return False

    def _workers(self) -> set[int]:
        """Pids of the gunicorn master's live children (from /proc)."""
        assert self.proc is not None
        children = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.proc.pid and fields[0] != "Z":
                children.add(int(stat.parent.name))
        return children

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
