"""What the executor holds for each claimed run, what its steps report, and the
outcome writes it builds.

No I/O here: the executor's steps (runs/execution/executor.py) keep these in memory and
hand the `rows.Completion`s built here to runs/execution/outcomes.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from runs import counters, rows
from runs.attempts import HANDED_BACK, RETRIED, AttemptRecord, used_up
from runs.execution import breaker_rules, retry
from runs.keys import run_key
from runs.rows import RunKey


@dataclass
class InFlight:
    run: rows.ClaimedRun
    started_monotonic: float
    started_wall: datetime
    task: asyncio.Task | None = None
    writing: bool = False  # its outcome is in a write batch; the write decides
    lost: bool = False  # fenced, cancelled or handed back: its outcome is discarded
    host: str | None = None  # HTTP targets: scheme://host:port (with the tenant, the breaker's key)
    host_outcome: str | None = None  # breaker_rules.UP / DOWN once the call answered

    @classmethod
    def start(cls, run: rows.ClaimedRun) -> InFlight:
        return cls(
            run=run, started_monotonic=time.monotonic(), started_wall=datetime.now(UTC), host=host_of(run)
        )

    @property
    def key(self) -> RunKey:
        return (self.run.job_id, self.run.scheduled_at, self.run.attempt)

    @property
    def run_key(self) -> str:
        return run_key(self.run.job_id, self.run.scheduled_at)

    @property
    def breaker(self) -> breaker_rules.BreakerKey | None:
        """(tenant_id, host) of an HTTP run: its circuit breaker and retry budget."""
        return (self.run.tenant_id, self.host) if self.host is not None else None


@dataclass(frozen=True)
class Claimed:
    """What one claim did: runs claimed, and those admitted past the breakers (called now,
    or queued for the next free slot when claimed ahead: runs/execution/call_slots.py)."""

    limit: int
    claimed: list[rows.ClaimedRun]
    started: list[rows.ClaimedRun]

    @property
    def full(self) -> bool:
        """The batch was full: the queue may hold more right now."""
        return self.limit > 0 and len(self.claimed) == self.limit


@dataclass(frozen=True)
class Written:
    written: int = 0
    fenced: int = 0  # no longer ours (lease lost or run cancelled): nothing was written


@dataclass(frozen=True)
class Beat:
    held: int = 0  # leases extended
    lost: tuple[RunKey, ...] = ()  # dropped: their calls are cancelled, nothing is written


def _count(spec: counters.Spec | None = None, label: str = "") -> int:
    """A Counters field, with the Prometheus counter (runs/counters.py) and label it feeds;
    no spec for a count /metrics does not show."""
    return dataclasses.field(default=0, metadata={"exported": (spec, label) if spec else None})


@dataclass
class Counters:
    """The executor's counts since it started. Each field names the counter it feeds, so
    what the executor exports follows the fields (`gained_since`)."""

    claimed: int = _count(counters.ATTEMPTS)
    succeeded: int = _count(counters.FINISHED, "succeeded")
    retried: int = _count(counters.RETRIES)
    dead: int = _count(counters.FINISHED, "dead")
    fenced: int = _count(counters.FENCED)
    # A hand-back that leaves its run to retry is not a failed call (cronyard_run_retries
    # counts those) and one that ends it dead is counted as dead: no series of its own.
    handed_back: int = _count()
    lease_expiries: int = _count(counters.LEASE_EXPIRIES)
    deferred: int = _count(counters.DEFERRALS)

    def gained_since(self, before: Counters) -> list[tuple[counters.Spec, int, str]]:
        """(counter, how much it gained since `before`, label) of every exported field."""
        gained = []
        for count in dataclasses.fields(self):
            if count.metadata["exported"] is not None:
                spec, label = count.metadata["exported"]
                gained.append((spec, getattr(self, count.name) - getattr(before, count.name), label))
        return gained


def completion(
    entry: InFlight,
    *,
    owner: str,
    status: str,
    outcome: str,
    result: retry.CallResult,
    retry_in_s: float | None,
) -> rows.Completion:
    """The write that ends `entry`'s attempt, with its history entry."""
    return rows.Completion(
        job_id=entry.run.job_id,
        scheduled_at=entry.run.scheduled_at,
        partition_id=entry.run.partition_id,
        attempt=entry.run.attempt,
        status=status,
        retry_in_s=retry_in_s,
        result_code=result.result_code,
        error=result.error,
        entry=AttemptRecord(
            attempt=entry.run.attempt,
            owner=owner,
            started_at=entry.started_wall,
            finished_at=datetime.now(UTC),
            duration_ms=(time.monotonic() - entry.started_monotonic) * 1000,
            outcome=outcome,
            result_code=result.result_code,
            error=result.error,
            retry_in_s=retry_in_s,
        ),
    )


def hand_back_completion(entry: InFlight, *, owner: str) -> rows.Completion:
    """An unfinished attempt consumed its number (it is the fence): with none left
    the run is dead like any other that ran out of attempts, not queued again."""
    run = entry.run
    if used_up(used=run.attempts_used, max_attempts=run.max_attempts):
        result = retry.CallResult(
            retry.RETRY,
            error=(
                f"handed back with no attempts left: attempt {run.attempts_used} of {run.max_attempts}"
                " did not finish before the executor shut down"
            ),
        )
        return completion(
            entry, owner=owner, status="dead", outcome=HANDED_BACK, result=result, retry_in_s=None
        )
    result = retry.CallResult(
        retry.RETRY, error="handed back: the executor shut down before the call finished"
    )
    return completion(
        entry, owner=owner, status="retrying", outcome=HANDED_BACK, result=result, retry_in_s=0.0
    )


def scrubbed(completion: rows.Completion, error: Exception) -> rows.Completion:
    """The same write without the error text and response details the database refused."""
    note = f"outcome details could not be stored ({type(error).__name__})"
    entry = dataclasses.replace(completion.entry, error=note)
    return dataclasses.replace(completion, error=note, entry=entry)


def host_of(run: rows.ClaimedRun) -> str | None:
    target = run.target if isinstance(run.target, dict) else {}
    return breaker_rules.host_key(str(target.get("url") or "")) if target.get("type") == "http" else None


def host_outcome(result: retry.CallResult) -> str | None:
    """DOWN for what says the host is sick (no answer, 5xx, 429, 408, 425); UP for any
    other answer; None when nothing was sent (a refused address, an invalid URL)."""
    if result.kind == retry.RETRY:
        return breaker_rules.DOWN
    if result.kind == retry.SUCCESS or result.result_code is not None:
        return breaker_rules.UP
    return None


def is_retry(run: rows.ClaimedRun) -> bool:
    """Whether the run retries because its target failed the last call: what a host's
    retry budget counts. A re-send after our executor died or shut down mid-call is not
    one (counted, an executor crash with a few dozen calls in flight spent a quiet host's
    budget of 10 a minute and its runs waited minutes), nor an operator's replay."""
    return run.previous_outcome == RETRIED


def breaker_candidates(claimed: list[rows.ClaimedRun]) -> list[breaker_rules.Candidate]:
    """The claimed HTTP runs the circuit breakers must admit (tasks have no host)."""
    candidates = []
    for run in claimed:
        host = host_of(run)
        if host is not None:
            key = (run.job_id, run.scheduled_at, run.attempt)
            left = run.max_attempts - run.attempts_used
            candidates.append(
                breaker_rules.Candidate(
                    key,
                    run.tenant_id,
                    host,
                    is_retry(run),
                    run.deferred_since,
                    left,
                    partition_id=run.partition_id,
                )
            )
    return candidates
