"""The shapes of run rows passed between the dispatcher, the queue and the executor.

Plain frozen dataclasses with no SQL and no Django: the scheduler builds `NewRun`s,
`runs/enqueue.py` inserts them, `runs/execution/claims.py` hands out `ClaimedRun`s,
`runs/execution/outcomes.py` takes `Completion`s back and `runs/execution/run_leases.py`
reports `ReapedRun`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from runs import attempts

# An attempt of a run: (job_id, scheduled_at, attempt), what every fenced write names.
RunKey = tuple[UUID, datetime, int]


@dataclass(frozen=True)
class NewRun:
    """One occurrence to insert, with what of the job executing needs."""

    job_id: UUID
    scheduled_at: datetime
    tenant_id: int
    partition_id: int
    target_version: int  # the jobs.models.JobTarget version the run executes
    trigger: str = "schedule"
    priority: int = 0
    job_name: str = ""
    overlap_policy: str = "skip"
    max_attempts: int = 5
    retry_backoff_seconds: int = 10
    retry_backoff_cap_seconds: int = 3600
    lease_seconds: int = 30
    # When False the run is queued whatever else the job has active (catch-up
    # backlogs, manual triggers, backfills: an operator asked for each of them).
    overlap_check: bool = True
    not_before: datetime | None = field(default=None)


@dataclass(frozen=True)
class InsertedRun:
    job_id: UUID
    scheduled_at: datetime
    status: str


@dataclass(frozen=True)
class ClaimedRun:
    job_id: UUID
    scheduled_at: datetime
    tenant_id: int
    # Every later write of this attempt (heartbeat, outcome, deferral) addresses it.
    partition_id: int
    attempt: int
    target: dict
    job_name: str
    overlap_policy: str
    priority: int
    max_attempts: int
    retry_backoff_seconds: int
    retry_backoff_cap_seconds: int
    lease_seconds: int
    started_at: datetime
    # The tenant's signing secrets (runs/execution/signing.py): the current one, and the
    # previous one while a rotation's overlap lasts. Out of the repr: a logged run must
    # not carry them.
    signing_secrets: Sequence[str] = field(repr=False)
    # Claims that put the run back unsent (runs/execution/breakers.py): they used no attempt.
    deferrals: int = 0
    deferred_since: datetime | None = None
    # How the previous attempt ended (its history entry's outcome); None on a first attempt.
    previous_outcome: str | None = None

    @property
    def attempts_used(self) -> int:
        """Attempts this run has used, this one included (`attempt` is the fence, not this)."""
        return attempts.used(attempt=self.attempt, deferrals=self.deferrals)


@dataclass(frozen=True)
class ReapedRun:
    """A run whose lease ran out: handed back to the queue, or dead when out of attempts."""

    job_id: UUID
    scheduled_at: datetime
    tenant_id: int
    job_name: str
    attempt: int
    owner: str
    status: str
    last_error: str


@dataclass(frozen=True)
class Completion:
    """The write that ends one attempt; applied only while that attempt still holds the run."""

    job_id: UUID
    scheduled_at: datetime
    partition_id: int
    attempt: int
    status: str  # succeeded | retrying | dead
    retry_in_s: float | None
    result_code: int | None
    error: str
    entry: attempts.AttemptRecord  # the attempts-history entry
