"""How a run looks in the admin pages of both apps: its status as a coloured badge (the
colours also key the dashboard's charts), the cells of a run's attempts table, and a
target as every read-only page shows it (secrets redacted)."""

from __future__ import annotations

import json
from datetime import datetime

from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobs.admin.display import duration_text, moment_html
from runs.keys import parse_utc
from runs.models import RunStatus
from runs.target_secrets import redact_target

STATUS_COLORS = {
    RunStatus.QUEUED: "#5b7083",
    RunStatus.RUNNING: "#1f6feb",
    RunStatus.RETRYING: "#d29922",
    RunStatus.SUCCEEDED: "#2da44e",
    RunStatus.DEAD: "#cf222e",
    RunStatus.SKIPPED: "#57606a",  # white text on it stays readable at 11px
    RunStatus.CANCELLED: "#6e7781",
}


def status_pill(status: str) -> str:
    """A run status as a coloured badge (runs list, jobs list)."""
    return format_html(
        '<span class="cronyard-status" style="background:{};color:#fff;padding:1px 7px;'
        'border-radius:8px;font-size:11px">{}</span>',
        STATUS_COLORS.get(status, "#444"),
        status,
    )


def cell(value: object) -> str:
    """A table cell's text: empty for a missing value, not "None"."""
    return "" if value is None else str(value)


# The attempts table's column headings (runs.attempts.FIELDS are the keys history() shows).
ATTEMPT_LABELS = {
    "attempt": "attempt",
    "owner": "executor",
    "started_at": "started",
    "finished_at": "finished",
    "duration_ms": "duration",
    "outcome": "outcome",
    "result_code": "result code",
    "error": "error",
    "retry_in_s": "retry in",
}


def attempt_cell(key: str, value: object, *, zone: str | None, now: datetime) -> SafeString | str:
    """One cell of a run's attempts table: moments and durations by the console's rule."""
    if value is None:
        return ""
    if key in ("started_at", "finished_at") and isinstance(value, str):
        try:
            return moment_html(parse_utc(value), now=now, zone=zone)
        except (ValueError, OverflowError):
            return value  # an entry written in another form: shown as stored
    if key == "duration_ms" and isinstance(value, int | float):
        return duration_text(value / 1000)
    if key == "retry_in_s" and isinstance(value, int | float):
        return duration_text(value)
    return cell(value)


def target_html(target: dict | None) -> str:
    """A job's or run's target for a read-only page: redacted JSON, never the stored
    secrets (a view-only user's page shows the field through this, not the raw value)."""
    shown = json.dumps(redact_target(target), indent=2)
    return format_html('<pre style="white-space:pre-wrap">{}</pre>', shown)
