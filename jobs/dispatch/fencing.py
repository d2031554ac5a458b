"""The fence of the dispatch transaction: why a slot fires exactly once, and the calls that
run its statements (fence, lock_unchanged, advance_next_run) and the plain reads before
and after it (read_due, next_due).

The statements are named in jobs/dispatch/queries.py; they run on Django's connection,
the fence, lock and compare-and-set inside the one short transaction of
``Scheduler.dispatch`` (jobs/dispatch/scheduler.py). Partition leases themselves are
jobs/dispatch/partition_leases.py.

Why advisory locks are not the fence, and what is
-------------------------------------------------
A lease is checked at one instant and used at a later one: a node can check its
lease, be SIGSTOPped, lose the lease, and resume to commit a dispatch transaction
while another node owns the partition. No lease scheme closes that window on its
own. Exactly-once therefore rests on the dispatch transaction itself:

1. A batch is planned from a plain read, then the job rows are locked
   (``SELECT ... FOR UPDATE SKIP LOCKED``) only where ``next_run_at`` and
   ``updated_at`` still hold the values the plan was made from (``lock_unchanged``).
   In READ COMMITTED a row locked FOR UPDATE is re-checked against the newest
   committed version, so the slot we lock is the current one and nobody can advance
   it until we commit: two transactions can never both act on the same (job, slot).
   The other node simply skips the rows a stalled transaction holds. Planning
   happens before the lock because it can be slow (a long backlog); a lock held
   through it once outlived idle_in_transaction_session_timeout on every batch.
2. ``next_run_at`` is advanced with a compare-and-set (``WHERE next_run_at = old
   AND new > old``) BEFORE the runs are inserted, and runs are inserted only for
   the jobs whose CAS succeeded: a stale write can neither insert a run for a slot
   another node already advanced past nor move next_run_at backwards. Under (1) the
   CAS always succeeds; it exists so that no future change of the read path can
   silently break the guarantee.
3. The run insert is ``ON CONFLICT DO NOTHING`` on (job_id, scheduled_at): the
   unique key is the last line, also against manual triggers/backfills/resumes.

On top of that, each dispatch transaction starts with one statement (``fence``)
that (a) sets ``idle_in_transaction_session_timeout`` to the lease, so a
transaction stalled longer than a lease is killed by the server and never commits
(its row locks are freed for the new owner), and (b) reads from pg_locks which
partitions the lease session holds *right now*; only those are dispatched. So a
node whose lease session is gone dispatches nothing, even if its own bookkeeping
has not noticed yet. That check is not a fence by itself (the lease can be lost
right after it), which is why (1)-(3) carry the correctness; the check makes
"a node that lost its lease stops dispatching" true and observable.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from jobs.dispatch import queries
from jobs.dispatch.partition_leases import NAMESPACE
from jobs.dispatch.planning import DueJob
from runs import per_partition


def fence(
    cursor, *, session_pid: int, lease_seconds: float, namespace: int = NAMESPACE
) -> tuple[datetime, set[int]]:
    """First statement of a dispatch transaction: (transaction time, partitions the lease session holds now).

    Also arms idle_in_transaction_session_timeout for this transaction only, so a
    dispatch stalled longer than a lease is killed by the server and never commits.
    """
    cursor.execute(
        queries.FENCE,
        {"ms": str(int(lease_seconds * 1000)), "ns": namespace, "pid": session_pid},
    )
    now, _, held = cursor.fetchone()
    return now, set(held or ())


def read_due(cursor, *, owned: Sequence[int], now: datetime, cutoff: datetime, limit: int) -> list[DueJob]:
    """Due jobs of `owned`, on-time ones (due after `cutoff`) first, then the oldest misfired ones.

    A plain read, no lock and no open transaction: what it returns is only a proposal
    that lock_unchanged re-checks row by row. On-time jobs go first so that a backlog
    of misfired jobs (cheap to defer: their slots are already late) never makes
    on-time jobs late too. One round trip (the two branches of a UNION ALL come back
    in order); rows are plain DueJobs, not ORM instances.

    `cutoff` is the scheduler's threshold, not each job's: it only orders the batch, and
    a per-job bound (starting_deadline_seconds) could not be walked on
    jobs_due_order_idx. Whether a slot is a misfire is plan_job's decision from the
    job's own deadline, which comes back in the row: a job with a shorter deadline is
    read with the on-time ones and planned as a misfire, one with a longer deadline is
    read with the late ones (oldest first) and fires as scheduled.
    """
    # Rows come back in binary: Django's text loader of timestamptz is psycopg's Python
    # one, about 9 µs a value, two or more per job, where the binary loader is C.
    cursor.execute(
        queries.READ_DUE, {"owned": list(owned), "now": now, "cutoff": cutoff, "limit": limit}, binary=True
    )
    return [DueJob(*row) for row in cursor.fetchmany(limit)]


def next_due(cursor, *, owned: Sequence[int], now: datetime) -> datetime | None:
    """When the next job of `owned` falls due after `now` (None: none scheduled)."""
    cursor.execute(queries.NEXT_DUE, {"owned": list(owned), "now": now})
    row = cursor.fetchone()
    return row[0] if row else None


# Row-locking and writing statements name each row's partition, in one statement for
# the batch or one per partition by the engine's policy (runs/per_partition.py; why:
# the comment above queries.LOCK_UNCHANGED).

# (partition_id, id, a, b) per job: the partition, the job and the two values compared.
Row = tuple[int, UUID, "datetime | None", "datetime | None"]


def _params(rows: list[Row]) -> dict:
    return {
        "partitions": [r[0] for r in rows],
        "ids": [r[1] for r in rows],
        "a": [r[2] for r in rows],
        "b": [r[3] for r in rows],
    }


def _by_partition(cursor, forms: per_partition.Forms, rows: Sequence[Row]) -> set[UUID]:
    grouped = per_partition.group((r[0], r) for r in rows)
    return {row[0] for row in per_partition.run_sync(cursor, forms, grouped, _params)}


def lock_unchanged(cursor, rows: Sequence[Row]) -> set[UUID]:
    """Lock the planned jobs that nobody changed since they were read:
    (partition_id, id, next_run_at, updated_at) -> ids locked.

    The plan was made outside any transaction; this is where it is re-checked. In
    READ COMMITTED a row locked FOR UPDATE is re-evaluated against its newest committed
    version, so a job another node dispatched meanwhile (next_run_at moved), or that
    was edited or paused (updated_at moved), is left out: its plan is stale and the
    next batch plans it again. SKIP LOCKED leaves rows a stalled transaction holds.
    """
    return _by_partition(cursor, queries.LOCK_UNCHANGED, rows)


def advance_next_run(cursor, rows: Sequence[Row]) -> set[UUID]:
    """Compare-and-set next_run_at for many jobs: (partition_id, id, new, old) -> ids advanced.

    A row is written only if next_run_at still equals the value the plan was made
    from and the new value is later (or NULL: finished), so a stale plan is a no-op.
    The new values come from Python (no now() + column in an UPDATE).

    lock_unchanged and this bind their arrays in binary (`%b`): text dumping of 500
    UUIDs and timestamps took 5.5 ms a statement in Python, binary 0.5 ms. They need
    a server-side-binding cursor (scheduler_project.db.raw_cursor), not Django's.
    """
    return _by_partition(cursor, queries.ADVANCE_NEXT_RUN, rows)
