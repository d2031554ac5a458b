"""How a run looks in the admin pages of both apps: its status as a coloured badge (the
colours also key the dashboard's charts), the cells of a run's attempts table, and a
target as every read-only page shows it (secrets redacted)."""

from __future__ import annotations

import json

from django.utils.html import format_html

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


def target_html(target: dict | None) -> str:
    """A job's or run's target for a read-only page: redacted JSON, never the stored
    secrets (a view-only user's page shows the field through this, not the raw value)."""
    shown = json.dumps(redact_target(target), indent=2)
    return format_html('<pre style="white-space:pre-wrap">{}</pre>', shown)
