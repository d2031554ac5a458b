"""How the console shows moments: in the job's zone, and relative to now."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo


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
    return moment.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M %Z")
