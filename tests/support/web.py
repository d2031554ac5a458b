"""The real web process for browser tests: gunicorn started as `make run` starts it.

pytest-django's live_server serves /static/ by itself, which once hid that gunicorn
served none of it. This starts the production path instead: collectstatic into a
private STATIC_ROOT, then gunicorn (command line from scheduler_project.serve) with
DEBUG off and WhiteNoise, on a free 127.0.0.1 port, against the test database.
"""

from __future__ import annotations

import os
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
    def __init__(self, *, database_url: str, workdir: Path):
        self.log_path = workdir / "gunicorn.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "DEBUG": "false",
            "STATIC_ROOT": str(workdir / "static"),
            # Tests truncate tables between cases: no idle connection should linger.
            "CONN_MAX_AGE": "0",
            "PYTHONUNBUFFERED": "1",
        }
        self.proc: subprocess.Popen | None = None

    def start(self, *, timeout: float = 90) -> None:
        serve.collectstatic(env=self.env, python=sys.executable)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            serve.gunicorn_command(port=self.port, workers=2, python=sys.executable),
            cwd=serve.ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(f"{self.url}/api/v1/health", timeout=5).status_code < 500:
                    return
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn not answering after {timeout:.0f}s:\n{self.log()}")
            time.sleep(0.2)

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
