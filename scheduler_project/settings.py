"""Settings come from the environment (docs/CONTRACT.md, "Commands and settings"); every one is optional."""

import sys
from pathlib import Path

import environ

from scheduler_project import logs

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

SECRET_KEY = env("SECRET_KEY", default="dev-insecure-cronyard-key-change-me-in-production")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and ReDoc served from /static/, not a CDN
    "django_filters",
    "jobs",
    "runs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves STATIC_ROOT from the web process itself (gunicorn has no static handler).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "scheduler_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "scheduler_project.wsgi.application"


def embedded_database_url(base_dir: Path) -> str:
    """The embedded cluster of this checkout, as scripts/embedded_pg.py set it up.

    Its port is whichever was free at init (54329 when it could be), recorded in
    var/pg/port (var/pg may link to a cluster placed elsewhere): a `manage.py` command
    run beside `make run` must reach this checkout's cluster, not whatever listens on
    the preferred port.
    """
    try:
        port = int((base_dir / "var" / "pg" / "port").read_text().strip())
    except (OSError, ValueError):
        port = 54329
    return f"postgres://cronyard@127.0.0.1:{port}/cronyard"


DATABASES = {
    "default": env.db("DATABASE_URL", default=embedded_database_url(BASE_DIR)),
}
# Persistent connections: schedulers and executors run tight loops.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# make test-citus: test databases are created on every Citus node (the workers listed
# here); at run time this backend is Django's PostgreSQL one unchanged.
if env("CRONYARD_CITUS_WORKERS", default=""):
    DATABASES["default"]["ENGINE"] = "scheduler_project.citus_db"
# Lets parallel test runs on one cluster use distinct test databases.
if env("TEST_DB_SUFFIX", default=""):
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{env('TEST_DB_SUFFIX')}"}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env.path("STATIC_ROOT", default=BASE_DIR / "var" / "static")
# Production storage: content-hashed names (cache forever) plus gzip copies, from the
# manifest that collectstatic writes. With DEBUG off, that storage raises for any file
# missing from the manifest, and the Django test client renders pages without anyone
# having run collectstatic; so code running under pytest uses the plain storage. The
# browser tests' gunicorn is a child process, not under pytest: it gets the manifest
# storage, after collectstatic, exactly as `make run` does.
_UNDER_PYTEST = "pytest" in sys.modules
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if _UNDER_PYTEST
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}

# A job body is capped so one tenant cannot fill the table with megabyte payloads.
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["jobs.api.auth.TenantTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["jobs.api.auth.IsTenant"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # DRF's three, the JSON one bounded in depth (jobs.rules.nesting): a body nested too deep
    # to decode, or for anything after to walk, is a 400 rather than a RecursionError.
    "DEFAULT_PARSER_CLASSES": [
        "jobs.api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "EXCEPTION_HANDLER": "jobs.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Cronyard API",
    "DESCRIPTION": "Distributed cron: recurring jobs fired exactly once, executed with retries.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Tags from the path segment after the version: jobs, runs, dead-letter, audit, ...
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # Self-hosted from drf-spectacular-sidecar's static files: the docs work offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Scheduler and executor knobs (docs/CONTRACT.md, "Commands and settings").
SCHEDULER_PARTITIONS = env.int("SCHEDULER_PARTITIONS", default=256)
SCHEDULER_POLL_SECONDS = env.float("SCHEDULER_POLL_SECONDS", default=1.0)
# 0: the engine's default, 500 jobs on PostgreSQL and 2000 on Citus (jobs/dispatch/scheduler.py).
SCHEDULER_BATCH_SIZE = env.int("SCHEDULER_BATCH_SIZE", default=0)
SCHEDULER_LEASE_SECONDS = env.int("SCHEDULER_LEASE_SECONDS", default=30)
SCHEDULER_MISFIRE_THRESHOLD_SECONDS = env.int("SCHEDULER_MISFIRE_THRESHOLD_SECONDS", default=60)
EXECUTOR_POLL_SECONDS = env.float("EXECUTOR_POLL_SECONDS", default=1.0)
# A run waiting longer than this is claimed as if it had the highest priority (9).
EXECUTOR_PRIORITY_AGING_SECONDS = env.float("EXECUTOR_PRIORITY_AGING_SECONDS", default=60.0)
# Circuit breaker per tenant and target host (runs/execution/breakers.py): this many failures within the
# window open it; probes after a cool-down doubling up to the max; runs deferred longer
# than EXECUTOR_CIRCUIT_MAX_DEFER_SECONDS go back to normal retries.
EXECUTOR_CIRCUIT_FAILURES = env.int("EXECUTOR_CIRCUIT_FAILURES", default=5)
EXECUTOR_CIRCUIT_WINDOW_SECONDS = env.float("EXECUTOR_CIRCUIT_WINDOW_SECONDS", default=30.0)
EXECUTOR_CIRCUIT_COOLDOWN_SECONDS = env.float("EXECUTOR_CIRCUIT_COOLDOWN_SECONDS", default=5.0)
EXECUTOR_CIRCUIT_MAX_COOLDOWN_SECONDS = env.float("EXECUTOR_CIRCUIT_MAX_COOLDOWN_SECONDS", default=60.0)
EXECUTOR_CIRCUIT_MAX_DEFER_SECONDS = env.float("EXECUTOR_CIRCUIT_MAX_DEFER_SECONDS", default=3600.0)
# Retry budget per tenant and host: retries at most this share of its requests a minute, floor
# included (after a probe closes an open breaker, each answer allows two more).
EXECUTOR_RETRY_BUDGET_RATIO = env.float("EXECUTOR_RETRY_BUDGET_RATIO", default=0.2)
EXECUTOR_RETRY_BUDGET_FLOOR = env.int("EXECUTOR_RETRY_BUDGET_FLOOR", default=10)
RUN_RETENTION_DAYS = env.int("RUN_RETENTION_DAYS", default=30)
SCHEDULER_ALLOW_PRIVATE_TARGETS = env.bool("SCHEDULER_ALLOW_PRIVATE_TARGETS", default=False)
SCHEDULER_ALERT_WEBHOOK_URL = env("SCHEDULER_ALERT_WEBHOOK_URL", default="")
# Where operators reach the console: alerts link to the run or the job page under it.
CRONYARD_PUBLIC_URL = env("CRONYARD_PUBLIC_URL", default="http://127.0.0.1:8000")
# A job whose next slot is this late is "overdue": flagged in the API, /metrics, the
# occurrence ledger, and alerted once per overdue slot.
SCHEDULER_OVERDUE_ALERT_SECONDS = env.int("SCHEDULER_OVERDUE_ALERT_SECONDS", default=300)
# After a rotation of a tenant's signing secret the previous one keeps signing (beside
# the new one) this long, so its targets can switch over.
SIGNING_SECRET_OVERLAP_SECONDS = env.int("SIGNING_SECRET_OVERLAP_SECONDS", default=86_400)
# When set, /metrics requires `Authorization: Bearer <METRICS_TOKEN>`.
METRICS_TOKEN = env("METRICS_TOKEN", default="")
# Dotted paths of modules whose @register'ed tasks the executor loads at start.
EXECUTOR_TASK_MODULES = env.list("EXECUTOR_TASK_MODULES", default=["runs.builtin_tasks"])

# LOG_FORMAT=plain|json, the same for every process (scheduler_project/logs.py).
LOGGING = logs.config(fmt=env("LOG_FORMAT", default="plain"), level=env("LOG_LEVEL", default="INFO"))
