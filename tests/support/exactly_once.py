"""The exactly-once audit shared by tests/test_exactly_once.py and the chaos driver:
given the run rows, the expected (job, slot) set and what the HTTP target saw, find
duplicates, gaps, extras, unfinished runs and results written by fenced attempts."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from types import SimpleNamespace

from runs.attempts import history as attempts_history
from runs.keys import run_key

# Outcomes only the worker holding an attempt writes; "lease expired" is written by
# whoever reclaimed the run, "cancelled" by a canceller.
WORKER_OUTCOMES = {"succeeded", "retry", "dead", "handed back"}

Slot = tuple[uuid.UUID, datetime]
# The columns after "attempts" are what runs/attempts.history reads of a first-attempt
# success, which stores no entry.
RUN_FIELDS = (
    "job_id",
    "scheduled_at",
    "status",
    "attempt",
    "trigger",
    "attempts",
    "owner",
    "started_at",
    "finished_at",
    "result_code",
    "last_error",
)


@dataclass
class Audit:
    runs: int = 0
    expected: int = 0
    duplicates: list[Slot] = field(default_factory=list)
    missing: list[Slot] = field(default_factory=list)
    extra: list[Slot] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    triggers: Counter = field(default_factory=Counter)
    reclaimed_attempts: int = 0
    retried_runs: int = 0
    fenced_writes: list[tuple[Slot, list]] = field(default_factory=list)
    bad_histories: list[tuple[Slot, list]] = field(default_factory=list)
    not_at_target: list[Slot] = field(default_factory=list)
    final_attempt_not_at_target: list[Slot] = field(default_factory=list)

    @property
    def problems(self) -> dict[str, int]:
        """Every check that failed, with how many cases; empty when all hold."""
        checks = {
            "duplicate (job, slot)": len(self.duplicates),
            "missing (job, slot)": len(self.missing),
            "(job, slot) off the expected grid": len(self.extra),
            "runs not succeeded": self.runs - self.statuses.get("succeeded", 0),
            "results written by a fenced attempt": len(self.fenced_writes),
            "attempt histories out of order": len(self.bad_histories),
            "run keys never seen by the target": len(self.not_at_target),
        }
        return {name: n for name, n in checks.items() if n}

    def counts(self) -> dict[str, object]:
        return {
            "expected (job, slot)": self.expected,
            "runs": self.runs,
            "duplicates": len(self.duplicates),
            "missing": len(self.missing),
            "extra": len(self.extra),
            "statuses": dict(self.statuses),
            "triggers": dict(self.triggers),
            "runs needing more than one attempt": self.retried_runs,
            "attempts reclaimed after their lease expired": self.reclaimed_attempts,
            "results written by a fenced attempt": len(self.fenced_writes),
            "run keys never seen by the target": len(self.not_at_target),
            "runs whose final attempt the target never saw": len(self.final_attempt_not_at_target),
        }


def audit(runs: list[tuple], *, expected: set[Slot], seen: set[tuple[str, str]]) -> Audit:
    """`runs`: tuples of RUN_FIELDS; `seen`: (Idempotency-Key, X-Run-Attempt) the target got."""
    out = Audit(runs=len(runs), expected=len(expected))
    keys = Counter((job_id, at) for job_id, at, *_ in runs)
    out.duplicates = [k for k, n in keys.items() if n > 1]
    out.missing = sorted(expected - set(keys))
    out.extra = sorted(set(keys) - expected)
    seen_keys = {key for key, _ in seen}
    for row in runs:
        run = SimpleNamespace(**dict(zip(RUN_FIELDS, row, strict=True)))
        job_id, at, status, attempt, trigger = (
            run.job_id,
            run.scheduled_at,
            run.status,
            run.attempt,
            run.trigger,
        )
        history = attempts_history(run)
        slot = (job_id, at)
        out.statuses[status] += 1
        out.triggers[trigger] += 1
        numbers = [e["attempt"] for e in history]
        if numbers != sorted(set(numbers)):
            out.bad_histories.append((slot, history))
        expired = {e["attempt"] for e in history if e["outcome"] == "lease expired"}
        out.reclaimed_attempts += len(expired)
        out.retried_runs += attempt > 1
        written_by_worker = {e["attempt"] for e in history if e["outcome"] in WORKER_OUTCOMES}
        successes = [e["attempt"] for e in history if e["outcome"] == "succeeded"]
        if expired & written_by_worker or (status == "succeeded" and successes != [attempt]):
            out.fenced_writes.append((slot, history))
        key = run_key(job_id, at)
        if key not in seen_keys:
            out.not_at_target.append(slot)
        if (key, str(attempt)) not in seen:
            out.final_attempt_not_at_target.append(slot)
    return out
