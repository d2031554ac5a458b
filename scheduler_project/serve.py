"""How the web process is started: the one place that builds the gunicorn command line.

`make run` (scripts/dev.py) and the browser tests' server fixture both call these, so
the tests exercise the process an operator runs: gunicorn, DEBUG off, static files
collected and served by WhiteNoise from the same process. Stdlib only, no Django
import: dev.py calls it before any settings are loaded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def collectstatic_command(*, python: str = sys.executable) -> list[str]:
    """Fills STATIC_ROOT with the hashed, compressed files the manifest storage serves."""
    return [python, str(ROOT / "manage.py"), "collectstatic", "--noinput"]


def gunicorn_command(*, port: int, workers: int = 2, python: str = sys.executable) -> list[str]:
    """The web server on 127.0.0.1:`port`; run with cwd=ROOT."""
    return [
        str(Path(python).parent / "gunicorn"),
        "--config",
        "python:scheduler_project.gunicorn_conf",
        "scheduler_project.wsgi",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--access-logfile",
        "-",
    ]


def collectstatic(*, env: dict | None = None, python: str = sys.executable) -> None:
    subprocess.run(
        collectstatic_command(python=python), cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL
    )
