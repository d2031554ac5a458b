"""How the console shows moments and durations: one rule each, for every page.

A moment is a wall time to the second with its zone's abbreviation: the job's zone
where there is a job ("2026-12-07 09:00:05 EST"), UTC otherwise ("2026-12-07 14:00:05
UTC": audit entries, nodes, tenants). On hover: the exact instant in UTC as the API
writes it, and how long ago or ahead it is. A duration is "850 ms", "12.4 s", "3 min
5 s", "2 h 10 min". The API keeps ISO 8601 UTC and plain numbers (docs/CONTRACT.md).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobs.schedule import load_zone
from runs.keys import format_utc

EMPTY = "—"


def relative(moment: datetime, *, now: datetime) -> str:
    """'in 4 min', '3 h ago', 'now': coarse on purpose, the exact time is beside it."""
    seconds = (moment - now).total_seconds()
    size = abs(seconds)
    if size < 1:
        return "now"
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if size >= length:
            amount = f"{int(size // length)} {unit}"
            break
    return f"in {amount}" if seconds > 0 else f"{amount} ago"


def in_zone(moment: datetime, zone: str | None = None) -> str:
    """'2026-12-03 09:00:05 EST': the wall time in `zone` (UTC without one), to the
    second, with the zone's abbreviation. The text form of the rule (messages,
    confirmations); pages use moment_html."""
    # load_zone: tzdata's rules, the same the scheduler fires by (not the host's files).
    return moment.astimezone(load_zone(zone or "UTC")).strftime("%Y-%m-%d %H:%M:%S %Z")


def moment_html(
    moment: datetime | None, *, now: datetime, zone: str | None = None, relative_line: bool = False
) -> SafeString | str:
    """The console's one way to show an instant: in_zone's text in a <time> element
    whose hover says the UTC instant (the API's form) and how far it is from now.
    `relative_line` adds that distance visibly under it (the lists of runs)."""
    if moment is None:
        return EMPTY
    exact = format_utc(moment)
    near = relative(moment, now=now)
    shown = format_html(
        '<time class="cy-moment" datetime="{}" title="{} · {}" style="white-space:nowrap">{}</time>',
        exact,
        exact,
        near,
        in_zone(moment, zone),
    )
    if not relative_line:
        return shown
    return format_html(
        '{}<br><span class="cronyard-relative" style="{}">{}</span>',
        shown,
        "font-size:11px;color:var(--body-quiet-color)",
        near,
    )


def moment_column(
    field: str, *, description: str, zone: Callable[[Any], str | None] | None = None
) -> Callable[[Any, Any], SafeString | str]:
    """A list column or read-only field showing the model field `field` by the rule (in
    place of Django's own date format), sortable by it; `zone(obj)` names the job's zone."""

    @admin.display(description=description, ordering=field)
    def show(model_admin, obj) -> SafeString | str:
        return moment_html(getattr(obj, field), now=timezone.now(), zone=zone(obj) if zone else None)

    return show


def duration_text(seconds: float | None) -> str:
    """'850 ms', '12.4 s', '3 min 5 s', '2 h 10 min', '3 d 4 h': two units at most."""
    if seconds is None:
        return EMPTY
    if seconds < 1:
        ms = seconds * 1000
        return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    for big, big_unit, small, small_unit in (
        (86400, "d", 3600, "h"),
        (3600, "h", 60, "min"),
        (60, "min", 1, "s"),
    ):
        if whole >= big:
            rest = (whole % big) // small
            return f"{whole // big} {big_unit}" + (f" {rest} {small_unit}" if rest else "")
    return f"{whole} s"  # unreachable: whole >= 60 here


def duration_between(start: datetime | None, end: datetime | None) -> str:
    """A run's or attempt's length by duration_text; empty while it has no end."""
    if start is None or end is None:
        return ""
    return duration_text((end - start).total_seconds())
