"""gunicorn's configuration for the web process.

`serve.gunicorn_command` passes it (`--config python:scheduler_project.gunicorn_conf`),
so `make run`, the browser tests' server and a production start share it.
"""

from __future__ import annotations

import os
from pathlib import Path

from scheduler_project import logs

# gunicorn's control socket defaults to one path under the user's home, shared by every
# gunicorn that user starts: two checkouts, the tests' server and `make run` would take
# it from each other. Cronyard's web process is controlled by signals (HUP reloads the
# workers, TERM stops), so the socket is off.
control_socket_disable = True

# Its error and access logs in the format and with the field names of every other process
# (LOG_FORMAT, scheduler_project/logs.py). Plain keeps gunicorn's own access line.
if os.environ.get("LOG_FORMAT", "plain") == "json":
    logconfig_dict = logs.config(fmt="json", level=os.environ.get("LOG_LEVEL", "INFO"), gunicorn=True)


def missing_static_files() -> str | None:
    """One line saying what to run when the static files were never collected, else None.

    With DEBUG off every admin page renders through the manifest of collected files;
    without it each page answers 500 ("Missing staticfiles manifest entry")."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
    from django.conf import settings

    if settings.DEBUG or "Manifest" not in settings.STORAGES["staticfiles"]["BACKEND"]:
        return None
    if (Path(settings.STATIC_ROOT) / "staticfiles.json").is_file():
        return None
    return (
        f"cronyard: no collected static files in {settings.STATIC_ROOT}: "
        "run `python manage.py collectstatic --noinput` first (make run does)"
    )


def on_starting(server) -> None:
    # In the master, before any worker: one clear line and a non-zero exit instead of a
    # server that answers 500 on every console page.
    problem = missing_static_files()
    if problem:
        server.log.error(problem)
        raise SystemExit(1)
