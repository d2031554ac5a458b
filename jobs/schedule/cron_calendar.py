"""cronsim as a naive wall-clock calendar: which local wall times an expanded expression matches.

Calendar forms: ``L``, ``LW`` and ``nW`` in day-of-month, ``5L`` and ``1#2`` in
day-of-week. cronsim 2.8 knows all but ``nW``; ``Calendar`` adds that one. No zone and
no DST here: jobs/schedule/dst.py maps these wall times to instants.
"""

from __future__ import annotations

import calendar
import functools
import re
from collections.abc import Iterator
from datetime import date, datetime

from cronsim import CronSim
from cronsim.cronsim import Field

_NEAREST_RE = re.compile(r"^(\d+)W$")
_DAY = 2  # index of day-of-month among the five fields


@functools.lru_cache(maxsize=4096)
def _nearest_weekday(year: int, month: int, day: int) -> int | None:
    """The weekday (Mon-Fri) nearest to `day` inside the month; None if the month is shorter.

    Quartz rule: a Saturday moves back to Friday and a Sunday on to Monday, never
    across the month's edge (1W on a Saturday is Monday the 3rd, 31W on a Sunday is
    Friday the 29th).
    """
    first_weekday, last = calendar.monthrange(year, month)
    if day > last:
        return None
    weekday = (first_weekday + day - 1) % 7  # Monday = 0
    if weekday == 5:
        return day - 1 if day > 1 else day + 2
    if weekday == 6:
        return day + 1 if day < last else day - 2
    return day


class Calendar(CronSim):
    """cronsim as a naive wall-clock calendar, plus `nW` in day-of-month.

    The nW terms are taken out of the expression before cronsim parses it (it
    refuses them) and matched here; everything else is cronsim's.
    """

    def __init__(self, expanded: str, start: datetime):
        parts = expanded.split(" ")
        dom_terms = parts[_DAY].split(",")
        nearest = frozenset(int(m.group(1)) for t in dom_terms if (m := _NEAREST_RE.match(t)))
        rest = [t for t in dom_terms if not _NEAREST_RE.match(t)]
        if nearest:
            # cronsim sees a stand-in ("L") and the rest of the field is parsed below:
            # its own "day 31 in February" check must not judge a field whose nW
            # terms can still fire.
            parts[_DAY] = "L"
        super().__init__(" ".join(parts), start)
        self.nearest = nearest
        if nearest:
            self.days = Field.DAY.parse(",".join(rest)) if rest else set()
            # AND/OR is decided on the field as written, not on what is left of it.
            self.day_and = dom_terms[0].startswith("*") or parts[4].startswith("*")

    def match_dom(self, d: date) -> bool:
        if super().match_dom(d):
            return True
        return any(_nearest_weekday(d.year, d.month, n) == d.day for n in self.nearest)


def walls(expanded: str, after_wall: datetime) -> Iterator[datetime]:
    """Naive local wall times matching ``expanded``, strictly after ``after_wall``."""
    # A naive start makes cronsim a pure calendar: no DST logic of its own.
    return Calendar(expanded, after_wall)
