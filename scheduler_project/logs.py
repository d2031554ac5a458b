"""How every process logs: one configuration for the web process (Django and gunicorn),
the schedulers and the executors.

`LOG_FORMAT=plain` (the default) writes `time level logger message` lines;
`LOG_FORMAT=json` writes one JSON object per line (python-json-logger) with the same
field names in every process: `time`, `level`, `logger`, `pid`, `message`, plus any
structured fields a call passes with `extra=`. Stdlib only apart from the formatter
class named by path, so settings and gunicorn's config can both import it.
"""

from __future__ import annotations

FORMATS = ("plain", "json")

_PLAIN = {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}
_JSON = {
    "()": "pythonjsonlogger.json.JsonFormatter",
    "fmt": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
    "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger", "process": "pid"},
    "datefmt": "%Y-%m-%dT%H:%M:%S%z",
}


def config(*, fmt: str, level: str, gunicorn: bool = False) -> dict:
    """A `logging.config.dictConfig` dict: the root logger on stderr in `fmt`; with
    `gunicorn`, its error log on stderr and its access log on stdout in the same format."""
    if fmt not in FORMATS:
        raise ValueError(f"LOG_FORMAT must be one of {', '.join(FORMATS)}, not {fmt!r}")
    out: dict = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"cronyard": _JSON if fmt == "json" else _PLAIN},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "cronyard"}},
        "root": {"handlers": ["console"], "level": level},
    }
    if gunicorn:
        out["handlers"]["access"] = {
            "class": "logging.StreamHandler",
            "formatter": "cronyard",
            "stream": "ext://sys.stdout",
        }
        out["loggers"] = {
            "gunicorn.error": {"handlers": ["console"], "level": level, "propagate": False},
            "gunicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
        }
    return out
