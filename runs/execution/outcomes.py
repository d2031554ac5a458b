"""The write that ends attempts: outcomes, fenced by attempt, with each job's health in
the same statement (only where it changes). One statement for the batch, or one per
partition on Citus (runs/per_partition.py): a job's runs and its jobs row share the partition, so each
job's health is judged from all its outcomes of the batch at once. Times are computed
here and passed in (runs/execution/claims.py says why).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from runs import per_partition
from runs.attempts import HANDED_BACK
from runs.rows import Completion, RunKey

# How stale a healthy job's stored last_success_at may grow before a success rewrites
# it (readers prefer its newest succeeded run; the copy serves once retention dropped it).
LAST_SUCCESS_REFRESH = timedelta(days=1)

_COMPLETE_SQL = per_partition.Forms.of(
    """
WITH done AS (
    UPDATE job_runs r SET
        status = x.status,
        not_before = CASE WHEN x.status = 'retrying' THEN x.not_before ELSE r.not_before END,
        lease_until = NULL,
        finished_at = CASE WHEN x.status IN ('succeeded', 'dead') THEN %(now)s END,
        result_code = x.result_code,
        last_error = x.error,
        attempts = r.attempts || x.entry
    FROM jsonb_to_recordset(%(rows)s::jsonb) AS x(
        partition_id smallint, job_id uuid, scheduled_at timestamptz, attempt integer, status text,
        not_before timestamptz, result_code integer, error text, entry jsonb)
    WHERE r.partition_id {partition_filter} AND r.partition_id = x.partition_id
      AND r.job_id = x.job_id AND r.scheduled_at = x.scheduled_at
      AND r.attempt = x.attempt AND r.status = 'running' AND r.job_id = ANY(%(job_ids)s::uuid[])
    RETURNING r.partition_id, r.job_id, r.scheduled_at, r.attempt, r.status,
              x.entry -> 0 ->> 'outcome' AS outcome
),
-- Job health, in the same statement (no extra round trip per batch). An attempt the
-- executor handed back on shutdown says nothing about the target: it does not count.
judged AS (
    SELECT partition_id, job_id, scheduled_at, status,
           row_number() OVER (PARTITION BY job_id ORDER BY scheduled_at DESC, attempt DESC) AS rn
    FROM done WHERE outcome IS DISTINCT FROM '{handed_back}'
),
-- The rank of each job's newest success, as a window over the batch: a join of the batch
-- with its own successes compared every pair of rows (quadratic in the batch size).
ranked AS (
    SELECT j.*, min(j.rn) FILTER (WHERE j.status = 'succeeded') OVER (PARTITION BY j.job_id) AS ok_rn
    FROM judged j
),
per_job AS (
    SELECT partition_id, job_id,
           (array_agg(status ORDER BY rn))[1] AS last_status,
           ok_rn IS NOT NULL AS any_ok,
           count(*) FILTER (WHERE status <> 'succeeded') AS fails,
           count(*) FILTER (WHERE status <> 'succeeded' AND rn < ok_rn) AS fails_since_ok,
           max(scheduled_at) FILTER (WHERE status = 'succeeded') AS ok_slot
    FROM ranked
    GROUP BY partition_id, job_id, ok_rn
),
-- The job rows whose health changes, locked in id order: two executors completing runs
-- of the same jobs in different orders must not deadlock (a deadlock would lose a batch
-- of outcomes). A success of a job that is healthy already (last outcome succeeded, no
-- streak) changes nothing but the time of its last success, which readers take from the
-- job's newest succeeded slot (jobs/health.py, last_success_at). The row's copy is
-- written when that read would miss a success: one of an older slot than a success
-- already recorded (a replay, a backfill, a late retry); and refreshed at most once a
-- day, for when retention has dropped the runs. So the common case writes no job
-- row: writing it cost a third of the executor's database time per run
-- (docs/decisions/0027-job-health-and-alerts.md). Under READ COMMITTED the condition
-- is checked again on the row as locked.
locked AS MATERIALIZED (
    SELECT jb.id FROM jobs jb JOIN per_job p ON p.partition_id = jb.partition_id AND p.job_id = jb.id
    WHERE jb.partition_id {partition_filter} AND jb.id = ANY(%(job_ids)s::uuid[])
      AND (p.fails > 0 OR jb.last_outcome <> 'succeeded' OR jb.consecutive_failures > 0 OR jb.failure_alerted
           OR jb.last_success_at IS NULL OR jb.last_success_at < %(stale_before)s
           OR EXISTS (SELECT 1 FROM job_runs n
                      WHERE n.partition_id {partition_filter} AND n.partition_id = p.partition_id
                        AND n.job_id = p.job_id AND n.scheduled_at > p.ok_slot AND n.scheduled_at <= %(now)s
                        AND n.status = 'succeeded'))
    ORDER BY jb.id FOR NO KEY UPDATE OF jb
),
health AS (
    UPDATE jobs jb SET
        -- (A searched CASE: Citus deparses `CASE p.last_status WHEN ...` wrongly for workers.)
        last_outcome = CASE WHEN p.last_status = 'succeeded' THEN 'succeeded'
                            WHEN p.last_status = 'dead' THEN 'dead' ELSE 'failed' END,
        last_success_at = CASE WHEN p.any_ok THEN %(now)s ELSE jb.last_success_at END,
        last_failure_at = CASE WHEN p.fails > 0 THEN %(now)s ELSE jb.last_failure_at END,
        consecutive_failures = CASE WHEN p.any_ok THEN p.fails_since_ok
                                    ELSE jb.consecutive_failures + p.fails END,
        -- A success ends the streak; the next streak alerts again.
        failure_alerted = jb.failure_alerted AND NOT p.any_ok
    FROM per_job p, locked l
    WHERE jb.partition_id {partition_filter} AND jb.partition_id = p.partition_id
      AND jb.id = p.job_id AND l.id = jb.id AND jb.id = ANY(%(job_ids)s::uuid[])
    RETURNING jb.id
)
-- Each part also names the batch's job ids (`= ANY(%(job_ids)s)`): an index condition
-- bounded by the batch, whatever the statistics say. A generic plan made while jobs
-- looked empty (stale statistics after a bulk load or delete) read every jobs row per
-- batch instead, 21,000 buffers for 100 runs (docs/decisions/0040-per-partition-statements.md).
-- (A data-modifying WITH runs to completion whether or not the result reads it.)
SELECT job_id, scheduled_at, attempt FROM done
""".replace("{handed_back}", HANDED_BACK)
)


async def complete_runs(
    conn, completions: Sequence[Completion], *, now: datetime | None = None
) -> set[RunKey]:
    """Write the outcomes of attempts, each only if that attempt still holds its run.

    Returns the keys written; the others were fenced off and wrote nothing. One
    statement, or one per partition on Citus (a job's runs and its jobs row share it, so each job's
    health is judged from all its outcomes of the batch at once). `now` (default: the
    clock) is the finished_at the ended runs get.
    """
    now = now or datetime.now(UTC)
    written = await per_partition.run(
        conn,
        _COMPLETE_SQL,
        per_partition.group((c.partition_id, c) for c in completions),
        lambda batch: {
            "now": now,
            "stale_before": now - LAST_SUCCESS_REFRESH,
            "rows": _encode_completions(batch, now=now),
            "job_ids": sorted({c.job_id for c in batch}),
        },
    )
    return {(row[0], row[1], row[2]) for row in written}


def _encode_completions(completions: Sequence[Completion], *, now: datetime) -> str:
    return json.dumps(
        [
            {
                "partition_id": c.partition_id,
                "job_id": str(c.job_id),
                "scheduled_at": c.scheduled_at.isoformat(),
                "attempt": c.attempt,
                "status": c.status,
                # The retry time is computed here, not in SQL (see the module docstring).
                "not_before": (now + timedelta(seconds=c.retry_in_s or 0)).isoformat(),
                "result_code": c.result_code,
                "error": c.error,
                "entry": [c.entry],
            }
            for c in completions
        ]
    )
