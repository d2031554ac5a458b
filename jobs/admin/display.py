"""How the console shows moments: in the job's zone, and relative to now."""

from __future__ import annotations

from datetime import datetime

from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobs.schedule import load_zone
from runs.keys import format_utc


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


def in_zone(moment: datetime, zone: str) -> str:
    """'2026-12-03 09:00 EST': wall-clock time in the job's zone, with its abbreviation."""
    # load_zone: tzdata's rules, the same the scheduler fires by (not the host's files).
    return moment.astimezone(load_zone(zone)).strftime("%Y-%m-%d %H:%M %Z")


def moment_html(moment: datetime | None, *, now: datetime, zone: str | None = None) -> SafeString | str:
    """The console's one way to show an instant: UTC ISO to the second, how long ago or
    ahead on a small second line, and on hover the exact instant and the wall time in
    the job's zone (lists of runs, the dead-letter queue)."""
    if moment is None:
        return "—"
    exact = format_utc(moment)
    hover = f"{exact} · {in_zone(moment, zone)}" if zone else exact
    return format_html(
        '<span title="{}" style="white-space:nowrap">{}</span><br>'
        '<span class="cronyard-relative" style="font-size:11px;color:var(--body-quiet-color)">{}</span>',
        hover,
        moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment.utcoffset() is not None else exact,
        relative(moment, now=now),
    )
