"""What the chaos driver measures besides exactly-once, from when each (job, slot)
first reached the HTTP target (HttpTarget.first_seen) and from the processes' logs:

* how long each fault took to heal, two ways, from the end of the fault: until the
  request rate is back to 90 % of its rate in the 30 s before the fault (over 5 s),
  and until slots are served as late as before it (the 90th percentile of lateness of
  the slots of 5 s back within 1.5x, or 1 s, of that of the requests in the 30 s
  before the fault: the backlog is gone); with the rate before the fault and its
  lowest 5 s during it;
* during a worker outage, the request rate of the jobs whose shards are on the other
  workers against the same jobs' rate before the outage ("one shard down is not
  everything down");
* the outage lines of every process: one when the database goes away, one when it is
  back, and whatever else it logged at WARNING or above.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from dataclasses import dataclass

from runs.keys import parse_utc
from scheduler_project.outage import AWAY, BACK

BEFORE = 30.0  # seconds of slots before a fault: the level to get back to
WINDOW = 5.0  # seconds of slots judged together after it


@dataclass(frozen=True)
class Arrival:
    scheduled: float  # the slot, epoch seconds
    arrived: float  # its first request at the target
    job_id: str


def arrivals(first_seen: dict[str, float]) -> list[Arrival]:
    """Sorted by slot; the run key is `<job_id>/<slot>` (runs/keys.py)."""
    out = []
    for key, at in first_seen.items():
        job_id, _, slot = key.partition("/")
        out.append(Arrival(parse_utc(slot).timestamp(), at, job_id))
    out.sort(key=lambda a: a.scheduled)
    return out


def _p90(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * 0.9))]


class Timeline:
    def __init__(self, events: list[Arrival]) -> None:
        self.events = events
        self.slots = [a.scheduled for a in events]
        by_arrival = sorted(events, key=lambda a: a.arrived)
        self.times = [a.arrived for a in by_arrival]
        self.late_by_arrival = [a.arrived - a.scheduled for a in by_arrival]

    def lateness(self, start: float, end: float) -> list[float]:
        """Lateness of the slots scheduled in [start, end)."""
        lo, hi = bisect.bisect_left(self.slots, start), bisect.bisect_left(self.slots, end)
        return [a.arrived - a.scheduled for a in self.events[lo:hi]]

    def arrived_lateness(self, start: float, end: float) -> list[float]:
        """Lateness of the requests that arrived in [start, end)."""
        lo, hi = bisect.bisect_left(self.times, start), bisect.bisect_left(self.times, end)
        return self.late_by_arrival[lo:hi]

    def series(self, start: float, end: float, step: float = WINDOW) -> list[list[float]]:
        """[seconds from start, requests/s, p90 lateness of those requests] every `step`."""
        out = []
        for t in _steps(start, end, step):
            late = self.arrived_lateness(t, t + step)
            out.append([round(t - start), round(len(late) / step, 1), round(_p90(late), 1) if late else None])
        return out

    def rate(self, start: float, end: float, jobs: set[str] | None = None) -> float:
        """Requests (first of each slot) per second arriving in [start, end)."""
        if end <= start:
            return 0.0
        if jobs is None:
            n = bisect.bisect_left(self.times, end) - bisect.bisect_left(self.times, start)
        else:
            n = sum(1 for a in self.events if start <= a.arrived < end and a.job_id in jobs)
        return n / (end - start)

    def heal(self, *, start: float, end: float, horizon: float) -> dict:
        """How long after `end` the slots were served on time again (see the module doc)."""
        # What arrived before the fault, not the slots due before it: those may have
        # been held up by the fault itself.
        before = self.arrived_lateness(start - BEFORE, start)
        if len(before) < 10:
            return {"on time after s": None, "why": "too few requests before the fault"}
        level = _p90(before)
        limit = max(level * 1.5, level + 1.0)
        lowest = min(
            (self.rate(t, t + WINDOW) for t in _steps(start, max(end, start + WINDOW), WINDOW)),
            default=0.0,
        )
        rate = self.rate(start - BEFORE, start)
        out = {
            "p90 lateness before s": round(level, 2),
            "requests/s before": round(rate, 1),
            "lowest requests/s over 5 s during": round(lowest, 1),
            "rate back after s": next(
                (
                    round(t - end, 1)
                    for t in _steps(end, horizon, 1.0)
                    if self.rate(t, t + WINDOW) >= 0.9 * rate
                ),
                None,
            ),
        }
        for t in _steps(end, horizon - WINDOW, 1.0):
            window = self.lateness(t, t + WINDOW)
            if window and _p90(window) <= limit:
                out["on time after s"] = round(t - end, 1)
                out["lowest requests/s over 5 s during"] = round(
                    min(lowest, *(self.rate(u, u + WINDOW) for u in _steps(start, t + WINDOW, WINDOW))), 1
                )
                return out
        out["on time after s"] = None
        out["why"] = "not back to its lateness before the window of slots closed"
        return out


def _steps(start: float, end: float, step: float):
    t = start
    while t < end:
        yield t
        t += step


def shard_outage_ratio(timeline: Timeline, *, outage: dict, placement: dict[str, str], down: str) -> dict:
    """Request rate of the jobs on the healthy workers during the outage / before it."""
    start, end = outage["down from"], outage["down until"]
    healthy = {job for job, node in placement.items() if node != down}
    stopped = set(placement) - healthy
    before = timeline.rate(start - 20, start, healthy)
    during = timeline.rate(start, end, healthy)
    return {
        "jobs on the stopped worker": len(stopped),
        "jobs on the healthy workers": len(healthy),
        "healthy jobs' requests/s before": round(before, 1),
        "healthy jobs' requests/s during": round(during, 1),
        "healthy during / before": round(during / before, 2) if before else None,
        "stopped jobs' requests/s during": round(timeline.rate(start, end, stopped), 1),
    }


_NOISE = re.compile(r"^\S+ \S+ |\d+(\.\d+)?|0x[0-9a-f]+|[0-9a-f]{8}-[0-9a-f-]{27}")


def log_lines(logs: dict[str, str]) -> dict[str, dict]:
    """Per process log: its outage lines and the kinds of WARNING/ERROR lines it wrote."""
    out = {}
    for name, text in logs.items():
        lines = text.splitlines()
        loud = Counter(
            _NOISE.sub("#", line)[:160] for line in lines if " WARNING " in line or " ERROR " in line
        )
        out[name] = {
            "away lines": sum(AWAY in line for line in lines),
            "back lines": sum(BACK in line for line in lines),
            "warning/error lines": sum(loud.values()),
            "most frequent": [f"{n}x {text}" for text, n in loud.most_common(3)],
        }
    return out
