"""Every SQL statement the scheduler's own package runs, each a named constant, in the
order of a scheduler's day: its lease session (partition leases and its node row), the
dispatch transaction and the reads around it, the tenants' dispatch-rate windows. The
executor's statements are runs/execution/queries.py.

Nothing here runs a statement: the module named beside each one does (its cursor calls
and parameters). A statement in two forms is a `per_partition.Forms`
(runs/per_partition.py): `.one` names one partition (Citus), `.many` none (plain
PostgreSQL). Fragments shared by several statements are composed here once, with
f-strings: the partitions a session holds (`_HELD`, in the lease tick and in the fence),
the columns of a due job (`_READ_COLUMNS`), the planned rows (`_ROWS`), the tenants' lock
row (`LOCK_WINDOW`) and liveness (scheduler_project/liveness.py, its one home).

The scheduler process also runs statements of modules it shares with others, and they
stay there: the run insert and NOTIFY (runs/enqueue.py), counters (runs/counters.py),
alerts (runs/alerts.py), day partitions (runs/day_partitions.py) and the alert sweep
(jobs/health.py).

Rules every statement here follows on Citus: a statement that locks or writes job rows
names each row's `partition_id` (docs/CONTRACT.md, "Beyond one server": `FOR UPDATE` and
cheap writes exist only inside one shard), the rate-limit statements touch rows keyed by
tenant or by the run's own key with its partition, and the times the job and run writes
set (next_run_at, not_before) are computed in Python and passed in (no now() or column
arithmetic on time in a distributed UPDATE). docs/decisions/0053-citus-dispatch.md.
"""

from __future__ import annotations

from jobs.dispatch.planning import DUE_JOB_COLUMNS
from runs import per_partition
from scheduler_project import liveness

# --- the lease session (jobs/dispatch/partition_leases.py) -----------------------------------
# Advisory locks and pg_locks / pg_stat_activity reads have no ORM form. All of these run
# on the lease session, a psycopg connection of the scheduler's own (LeaseManager).

# The session ends itself after a silent lease, and no statement outlives one;
# LeaseManager._connect runs them. Parameter (formatted in: SET takes no bound
# parameter): the lease in ms.
LEASE_IDLE_TIMEOUT = "SET idle_session_timeout = {ms}"
LEASE_STATEMENT_TIMEOUT = "SET statement_timeout = {ms}"

# The lease session's pid (what the fence asks pg_locks about); LeaseManager._connect runs it.
SESSION_PID = "SELECT pg_backend_pid()"

# Partitions a session holds; {pid} is pg_backend_pid() for the lease session itself
# (HELD_HERE), or the lease session's pid when the dispatch transaction, on another
# connection, asks (FENCE). One definition of "held" for both.
_HELD = """
SELECT objid::int FROM pg_locks
WHERE locktype = 'advisory' AND classid = %(ns)s AND objsubid = 2 AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND pid = {pid}
"""

# The partitions the lease session holds; LeaseManager._tick runs it. Parameter: ns.
HELD_HERE = _HELD.format(pid="pg_backend_pid()")

# Drop long-gone node rows only: a stalled node's row lingers a little so its return is
# cheap; LeaseManager._tick runs it. Parameter: seconds.
NODE_EXPIRE = "DELETE FROM scheduler_nodes WHERE heartbeat_at < now() - make_interval(secs => %s)"

# Register or refresh this scheduler's row with the partitions it holds; LeaseManager._tick runs it.
NODE_UPSERT = """
INSERT INTO scheduler_nodes (node_id, hostname, pid, started_at, heartbeat_at, partitions)
VALUES (%(node_id)s, %(hostname)s, %(pid)s, now(), now(), %(partitions)s::jsonb)
ON CONFLICT (node_id) DO UPDATE SET heartbeat_at = now(), partitions = EXCLUDED.partitions
"""

# The live schedulers' ids, in order (fair share is computed from them); liveness is
# scheduler_project.liveness's rule, the same the dashboard, admin and /metrics use.
# LeaseManager._tick runs it. Parameter: the liveness window in seconds.
LIVE_NODES = f"SELECT n.node_id FROM scheduler_nodes n WHERE {liveness.alive_sql('n')} ORDER BY n.node_id"

# Release partitions above this node's share; LeaseManager._tick runs it. Parameters:
# namespace, partitions.
UNLOCK = "SELECT pg_advisory_unlock(%s, p) FROM unnest(%s::int[]) AS p"

# Try the candidate partitions in order until `need` are locked; LeaseManager._tick runs it.
ACQUIRE = """
SELECT p FROM unnest(%(candidates)s::int[]) AS p
WHERE pg_try_advisory_lock(%(ns)s, p)
LIMIT %(need)s
"""

# Record the partitions held after a rebalance; LeaseManager._tick runs it.
# Parameters: the partitions as JSON, node_id.
NODE_PARTITIONS = "UPDATE scheduler_nodes SET partitions = %s::jsonb WHERE node_id = %s"

# At shutdown: every lease, then the node row, so others take over at their next tick;
# LeaseManager.close runs them.
UNLOCK_ALL = "SELECT pg_advisory_unlock_all()"
NODE_LEAVE = "DELETE FROM scheduler_nodes WHERE node_id = %s"

# --- the dispatch transaction and the reads around it (jobs/dispatch/fencing.py) ---------------
# Why these statements, and not the lease, keep firing exactly-once: jobs/dispatch/fencing.py.

# The first statement of a dispatch transaction: its time, idle_in_transaction_session_timeout
# armed for this transaction only, and the partitions the lease session holds now;
# fencing.fence runs it. Parameters: ms, ns, pid (the lease session's).
FENCE = f"""
SELECT now(), set_config('idle_in_transaction_session_timeout', %(ms)s, true),
       ARRAY({_HELD.format(pid="%(pid)s")})
"""

# The tenant's rate limit rides along (a primary-key probe of the small tenants table
# per row), so an unlimited batch needs no query more.
_READ_COLUMNS = ", ".join(
    [
        *DUE_JOB_COLUMNS,
        "(SELECT t.max_runs_per_minute FROM tenants t WHERE t.id = jobs.tenant_id)",
    ]
)

# Due jobs of the owned partitions, on-time ones (due after the cutoff) first, then the
# oldest misfired ones, in one round trip; fencing.read_due runs it (why: its docstring).
READ_DUE = f"""
(SELECT {_READ_COLUMNS} FROM jobs
 WHERE partition_id = ANY(%(owned)s) AND NOT paused AND next_run_at > %(cutoff)s AND next_run_at <= %(now)s
 ORDER BY next_run_at LIMIT %(limit)s)
UNION ALL
(SELECT {_READ_COLUMNS} FROM jobs
 WHERE partition_id = ANY(%(owned)s) AND NOT paused AND next_run_at <= %(cutoff)s
 ORDER BY next_run_at LIMIT %(limit)s)
"""

# Row-locking and writing statements name the partition as the executor's do
# (runs/per_partition.py: one template, one policy per engine). Each planned row names
# its own partition in the keyed join (`j.partition_id = v.partition_id AND j.id =
# v.id`, the (partition_id, id) primary key). On plain PostgreSQL one statement covers
# the batch; on Citus, which runs FOR UPDATE and cheap writes only inside one shard
# (docs/CONTRACT.md, "Beyond one server"), the same statement runs once per partition of
# the batch with `partition_id = %(partition)s`, pipelined. A sparse batch then costs a
# statement per partition: that is the price of Citus, and single-server users do not
# pay it (docs/decisions/0053-citus-dispatch.md).
# The planned rows, bound in binary: (partition_id, id, a, b) per job.
_ROWS = "unnest(%(partitions)b::smallint[], %(ids)b::uuid[], %(a)b::timestamptz[], %(b)b::timestamptz[])"

# Lock the planned jobs nobody changed since the read; fencing.lock_unchanged runs it.
LOCK_UNCHANGED = per_partition.Forms.of(f"""
SELECT j.id FROM jobs AS j
JOIN {_ROWS} AS v(partition_id, id, next_run_at, updated_at)
  ON j.partition_id = v.partition_id AND j.id = v.id
WHERE j.partition_id {{partition_filter}}
  AND j.next_run_at = v.next_run_at AND j.updated_at = v.updated_at AND NOT j.paused
FOR UPDATE OF j SKIP LOCKED
""")

# The next_run_at compare-and-set; fencing.advance_next_run runs it.
ADVANCE_NEXT_RUN = per_partition.Forms.of(f"""
UPDATE jobs AS j SET next_run_at = v.new
FROM {_ROWS} AS v(partition_id, id, new, old)
WHERE j.partition_id {{partition_filter}} AND j.partition_id = v.partition_id AND j.id = v.id
  AND j.next_run_at = v.old AND (v.new IS NULL OR v.new > v.old)
RETURNING j.id
""")

# The earliest upcoming slot of the owned partitions. An idle scheduler sleeps until
# then instead of a whole poll interval (docs/decisions/0030-idle-scheduler-sleeps.md). Walks
# jobs_due_order_idx (next_run_at, not paused) from `now`: with k schedulers about k
# entries until one of ours. On Citus each shard answers from its own copy of that
# index and the coordinator takes the smallest (a per-partition LATERAL probe cannot
# be pushed down there). fencing.next_due runs it.
NEXT_DUE = """
SELECT next_run_at FROM jobs
WHERE partition_id = ANY(%(owned)s::smallint[]) AND NOT paused AND next_run_at > %(now)s
ORDER BY next_run_at LIMIT 1
"""

# --- the tenants' dispatch-rate windows (jobs/dispatch/rate_limits.py) ---------------------
# All three run inside the dispatch transaction, and only when the batch inserted queued
# runs of a tenant that has a limit. Every row touched is keyed by tenant
# (tenant_dispatch_windows) or by the run's own key with its partition_id (job_runs), so
# on Citus each write is routed to the shard that holds it and nothing locks a row of the
# tenants reference table.

# The row that serialises a tenant's allocations: one per tenant, never a real minute.
LOCK_WINDOW = "-infinity"

# Take each tenant's lock row (created on first use), in tenant order; rate_limits.lock_tenants
# runs it. Parameter: the sorted tenant ids.
TENANT_LOCK = f"""
INSERT INTO tenant_dispatch_windows (tenant_id, window_start, runs)
SELECT t, '{LOCK_WINDOW}'::timestamptz, 0 FROM unnest(%s::bigint[]) AS t ORDER BY t
ON CONFLICT (tenant_id, window_start) DO UPDATE SET runs = 0
"""

# The tenants' minutes from the current one on; rate_limits.used_windows runs it.
# Parameters: tenant ids, the current minute.
TENANT_WINDOWS = f"""
SELECT tenant_id, window_start, runs FROM tenant_dispatch_windows
WHERE tenant_id = ANY(%s) AND window_start >= %s AND window_start > '{LOCK_WINDOW}'
"""

# Add the counts, drop the tenants' past minutes, move the deferred runs' not_before (and
# record that they moved): one statement; rate_limits.record runs it, in the form of its
# engine. On Citus the deferred runs' UPDATE names their partitions: the keyed join alone
# sends it to every shard of job_runs, on every worker, and one worker down then fails
# the batches of the healthy ones (docs/decisions/0073-one-worker-down.md). Plain
# PostgreSQL keeps the keyed join alone (runs/per_partition.py: why no partition list).
_TENANT_RECORD = f"""
WITH counted AS (
    INSERT INTO tenant_dispatch_windows (tenant_id, window_start, runs)
    SELECT * FROM unnest(%(tenant)s::bigint[], %(window)s::timestamptz[], %(runs)s::integer[])
    ON CONFLICT (tenant_id, window_start)
    DO UPDATE SET runs = tenant_dispatch_windows.runs + excluded.runs
    RETURNING 1
),
pruned AS (
    DELETE FROM tenant_dispatch_windows
    WHERE tenant_id = ANY(%(tenants)s::bigint[]) AND window_start < %(before)s
      AND window_start > '{LOCK_WINDOW}'
    RETURNING 1
),
deferred AS (
    UPDATE job_runs AS r SET not_before = d.not_before, rate_limited_to = d.not_before
    FROM unnest(%(job_id)s::uuid[], %(scheduled_at)s::timestamptz[], %(partition_id)s::smallint[],
                %(not_before)s::timestamptz[]) AS d(job_id, scheduled_at, partition_id, not_before)
    WHERE r.job_id = d.job_id AND r.scheduled_at = d.scheduled_at AND r.partition_id = d.partition_id
      AND r.status = 'queued' {{deferred_partitions}}
    RETURNING 1
)
SELECT (SELECT count(*) FROM counted), (SELECT count(*) FROM deferred)
"""
TENANT_RECORD = _TENANT_RECORD.replace("{deferred_partitions}", "")
TENANT_RECORD_CITUS = _TENANT_RECORD.replace(
    "{deferred_partitions}", "AND r.partition_id = ANY(%(partitions)s::smallint[])"
)
