"""The change form's "Preview changes" panel: what saving the form would do
(jobs/edit_preview.py, the PATCH dry run's), shaped for two lists side by side."""

from __future__ import annotations

from typing import Any

from jobs.admin.display import in_zone, relative
from jobs.edit_preview import EditPreview, preview_json
from runs.keys import format_utc

SHOWN = 50


def panel_json(preview: EditPreview) -> dict[str, Any]:
    """The API's answer (without the job) plus both lists with each time in its job's zone
    and marked kept, added or removed."""
    stored, after, slots = preview.stored, preview.effects.job, preview.slots
    added, removed = set(slots.added), set(slots.removed)

    def side(times, zone: str, changed: set, mark: str) -> list[dict]:
        return [
            {"utc": format_utc(t), "local": in_zone(t, zone), "mark": mark if t in changed else "kept"}
            for t in times[:SHOWN]
        ]

    def next_run(job) -> str:
        if job.next_run_at is None:
            return "none"
        return f"{in_zone(job.next_run_at, job.time_zone)} ({relative(job.next_run_at, now=preview.now)})"

    return {
        **preview_json(preview, shown=SHOWN),
        "before_list": side(slots.before, stored.time_zone, removed, "removed"),
        "after_list": side(slots.after, after.time_zone, added, "added"),
        "next_run_text": {"before": next_run(stored), "after": next_run(after)},
    }
