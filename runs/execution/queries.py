"""Every SQL statement the executor process runs, each a named constant, in the order of
an executor's day: its connections, its node row, the claim (the fair-share read that
plans it, then the claim transaction), the outcome write, run leases (heartbeats and
reaping), circuit breakers, the planner's statistics. The scheduler's statements are
jobs/dispatch/queries.py.

Nothing here runs a statement: the module named beside each one does (its cursor calls,
batching and the choice of form per engine). A statement in two forms is a
`per_partition.Forms` (runs/per_partition.py): `.one` names one partition (Citus), `.many`
none (plain PostgreSQL). Fragments shared by several statements are composed here once,
with f-strings: `NOT_AHEAD`, `OPEN_FROM` and `NOT_BLOCKED` (the claim and its fair-share
read), attempts used (`runs/attempts.sql_used`, its one home), the history entry
(`runs/attempts.sql_entry`) and when an outcome appends it (`runs/attempts.sql_append`),
the outcome name `HANDED_BACK` (runs/attempts.py).
Transaction control (BEGIN, COMMIT, ROLLBACK) stays with the code that holds the
transaction (runs/execution/claims.py).

Rules every statement here follows on Citus: every statement that writes or locks a run
names its one `partition_id` (docs/CONTRACT.md, "Beyond one server": `FOR UPDATE` and
cheap writes exist only inside one shard); on plain PostgreSQL the heartbeat names all
of a batch's partitions at once (runs/per_partition.py: one template, two forms), and the
batch claim, one statement over every partition, names none (CLAIM says why). Keyed joins
also name each row's own partition. Reads that only count or choose (tenants' running
runs, which partitions to claim from, expired leases) may span partitions. Times derived
from a column (lease ends, retry times) are computed from a timestamp passed in, not from
now() inside the UPDATE, and attempt entries are built outside UPDATE ... SET: Citus
refuses volatile functions, and stable ones applied to columns, in a distributed UPDATE.
docs/decisions/0040-per-partition-statements.md.
"""

from __future__ import annotations

from datetime import timedelta

from runs import attempts, day_partitions, history, per_partition
from runs.attempts import HANDED_BACK

# --- connections (runs/execution/connections.py) -------------------------------------------

# The channel the dispatcher NOTIFYs (runs/enqueue.notify_executors) and executors LISTEN on.
NOTIFY_CHANNEL = "cronyard_runs"

# The session's planner settings and idle-in-transaction limit; connect_async runs it
# (why each: its comments). Parameters: plan_cache_mode, the limit in ms.
SESSION_SETTINGS = (
    "SELECT set_config('plan_cache_mode', %s, false),"
    " set_config('enable_seqscan', 'off', false), set_config('enable_bitmapscan', 'off', false),"
    " set_config('jit', 'off', false), set_config('idle_in_transaction_session_timeout', %s, false)"
)

# Drop the connection's prepared statements so they are planned afresh; replan runs it.
DEALLOCATE_ALL = "DEALLOCATE ALL"

# Wake on new runs; listen_connection runs it.
LISTEN = f"LISTEN {NOTIFY_CHANNEL}"

# --- the node row (runs/execution/nodes.py) ------------------------------------------------

# Register or refresh this executor's row; nodes.beat runs it. The refresh copies
# EXCLUDED's now(): Citus refuses a function in DO UPDATE SET on a reference table
# (where executor_nodes lives on a Citus cluster).
NODE_UPSERT = """
INSERT INTO executor_nodes
    (node_id, hostname, pid, started_at, heartbeat_at, concurrency, in_flight, last_claim_at)
VALUES (%(node_id)s, %(hostname)s, %(pid)s, now(), now(), %(concurrency)s, %(in_flight)s, %(last_claim_at)s)
ON CONFLICT (node_id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at, in_flight = EXCLUDED.in_flight,
    last_claim_at = EXCLUDED.last_claim_at
"""

# Drop long-gone rows only (like scheduler_nodes): a stalled executor's row lingers a
# little; nodes.beat runs it.
NODE_EXPIRE = "DELETE FROM executor_nodes WHERE heartbeat_at < now() - make_interval(secs => %s)"

# This executor's row, at shutdown; nodes.leave runs it.
NODE_LEAVE = "DELETE FROM executor_nodes WHERE node_id = %s"

# --- fragments of the claim and of its fair-share read ---------------------------------------

# The probes skip runs scheduled over a day ahead: none is created ahead of its slot
# (dispatch, triggers, backfills and replays all use past or present slots; jitter only
# delays not_before), and a bound on the partition key lets even a generic plan leave
# out the future day partitions. A probe is a Merge Append over every day partition it
# cannot rule out, two buffers for each empty one; on a fresh cluster 6 of its 9 are
# future days. (The days before today are still probed: retries, replays and backfills
# put due runs there.)
# Written as an OR with a clause that is never true (scheduled_at is NOT NULL), which
# changes neither the rows nor the pruning, so that the planner does not read it with
# OPEN_FROM as a range "scheduled_at between two values". It estimates such a range at
# 0.5% of the rows whenever one end is a parameter, as OPEN_FROM is in a generic plan,
# and then the tenant's (tenant_id, scheduled_at) index looked cheaper than the probe's
# ordered index: the generic plan read a tenant's whole day and sorted it (20,000 rows
# for 32 picks, 3 ms of database time per run; docs/decisions/0035-claim-day-bounds.md).
AHEAD = timedelta(days=1)  # the bound; the Citus forms' day windows end there too
NOT_AHEAD = f"(r.scheduled_at < now() + interval '{AHEAD.days} day' OR r.scheduled_at IS NULL)"

# ... and queued or retrying runs scheduled before the oldest day that holds an open run
# (fair_share.OpenFrom; running runs are all counted, see CLAIM's `busy`): the
# days before it hold only finished runs, and with the default 30 days of retention a
# probe that could not rule them out visited 30 empty index ranges per tenant
# (docs/decisions/0035-claim-day-bounds.md). A parameter, so that even a generic
# plan leaves those partitions out when it starts. '-infinity' where there is no bound.
OPEN_FROM = "r.scheduled_at >= %(open_from)s::timestamptz"


def held(alias: str) -> str:
    """The fence of a write that names its runs by key: the run is still running.

    `(status = 'running') IS TRUE` keeps the same rows as `status = 'running'`, but the
    planner cannot prove job_runs_running_idx's predicate from it, so that index is no
    candidate and each run is found by its run key. From the bare equality it could,
    and did: a generic plan made on statistics that counted no running run (an ANALYZE
    taken while a burst was still queued: runs/execution/table_statistics.py takes one
    before the burst's first claim, autovacuum soon after its dispatch) walked the whole
    running index once per run of the batch, so an outcome's cost grew with every run in
    flight on any executor: 11 ms against 2.4 ms for 32 outcomes with 2,000 in flight
    (docs/decisions/0090-keyed-writes-find-runs-by-key.md).
    """
    return f"({alias}.status = 'running') IS TRUE"


# Runs of busy skip/buffer_one jobs are passed over, in the claim and in its plan (a
# tenant whose only due runs are blocked would take a place for nothing). Needs `busy`.
NOT_BLOCKED = """(r.overlap_policy NOT IN ('skip', 'buffer_one')
               OR r.job_id NOT IN (SELECT job_id FROM busy))"""

# --- the fair-share read (runs/execution/fair_share.py) ---------------------------------------

# Tenants with a free slot, with their running runs; needs `running`.
_OPEN_TENANTS = """
open_tenants AS (
    SELECT t.id, t.weight, coalesce(ru.n, 0) AS n, t.max_concurrency - coalesce(ru.n, 0) AS free
    FROM tenants t LEFT JOIN running ru ON ru.tenant_id = t.id
    WHERE t.max_concurrency > coalesce(ru.n, 0)
)"""

# The fair-share read on plain PostgreSQL: per open tenant, its next picks from two
# index-ordered probes; fair_share.plan runs it.
PLAN_PLAIN = f"""
WITH busy AS MATERIALIZED (
    SELECT tenant_id, job_id FROM job_runs WHERE status = 'running'
),
running AS (
    SELECT tenant_id, count(*) AS n FROM busy GROUP BY tenant_id
),
{_OPEN_TENANTS},
picks AS (
    SELECT o.id AS tenant_id, o.n, o.weight, least(o.free, %(limit)s) AS cap, p.partition_id,
           p.effective_priority, p.scheduled_at,
           row_number() OVER (PARTITION BY o.id
                              ORDER BY p.effective_priority DESC, p.scheduled_at) AS k
    FROM open_tenants o CROSS JOIN LATERAL (
        SELECT u.partition_id, u.scheduled_at,
               CASE WHEN u.not_before <= now() - %(aging)s * interval '1 second' THEN 9
                    ELSE u.priority END AS effective_priority
        FROM ((SELECT r.id, r.scheduled_at, r.partition_id, r.priority, r.not_before FROM job_runs r
               WHERE r.tenant_id = o.id
                 AND r.status IN ('queued', 'retrying') AND r.not_before <= now() AND {NOT_AHEAD}
                 AND {OPEN_FROM} AND {NOT_BLOCKED}
               ORDER BY r.priority DESC, r.scheduled_at
               LIMIT least(o.free, %(limit)s, %(probe)s))
              UNION
              (SELECT r.id, r.scheduled_at, r.partition_id, r.priority, r.not_before FROM job_runs r
               WHERE r.tenant_id = o.id
                 AND r.status IN ('queued', 'retrying')
                 AND r.not_before <= now() - %(aging)s * interval '1 second' AND {NOT_AHEAD}
                 AND {OPEN_FROM} AND {NOT_BLOCKED}
               ORDER BY r.not_before
               LIMIT least(o.free, %(limit)s, %(probe)s))) u
    ) p
)
-- A tenant whose probes came back full may have more runs than they show: count it
-- as having its whole cap (the claims find out).
SELECT tenant_id, n, weight, partition_id, effective_priority, scheduled_at, k,
       CASE WHEN count(*) OVER w >= least(cap, %(probe)s) THEN cap ELSE count(*) OVER w END
FROM picks
WINDOW w AS (PARTITION BY tenant_id)
"""

_RUNNABLE = f"r.status IN ('queued', 'retrying') AND r.not_before <= now() AND {NOT_AHEAD}"

# The work map on Citus (fair_share.Planner.work runs it), per worker: for the named
# partitions, all on one worker (scheduler_project/citus.Placements), per (partition,
# tenant): its runnable runs, the best effective priority among them, the oldest slot
# and its running runs. A pushed-down GROUP BY on the distribution column over that
# worker's shards only: a worker out of reach fails its own read, not the others'
# (docs/decisions/0073-one-worker-down.md). It is not on every claim: a claimer keeps the
# map and claims from it until it is used up, stale, or a NOTIFY says runs were queued.
# Within a day window (runs/per_partition.py, BOUNDS): from the oldest open slot the last
# full read saw (fair_share.Planner's floor; a full read starts at the lowest of the
# tenants' open floors, runs/open_floors.py) to a day ahead, so that Citus plans only
# those days' partitions on each shard; `oldest_open` is what the next floor is made of.
_EFFECTIVE_PRIORITY = (
    "CASE WHEN r.not_before <= now() - %(aging)s * interval '1 second' THEN 9 ELSE r.priority END"
)
WORK_MAP = f"""
SELECT r.partition_id, r.tenant_id,
       count(*) FILTER (WHERE {_RUNNABLE}) AS runs,
       count(*) FILTER (WHERE r.status = 'running') AS running,
       min(r.scheduled_at) FILTER (WHERE {_RUNNABLE}) AS scheduled_at,
       coalesce(max({_EFFECTIVE_PRIORITY}) FILTER (WHERE {_RUNNABLE}), 0) AS effective_priority,
       -- The group's first runs in the order a claim takes them (fair_share.allocate
       -- orders a tenant's places run by run across its groups with these).
       (array_agg({_EFFECTIVE_PRIORITY} ORDER BY {_EFFECTIVE_PRIORITY} DESC, r.scheduled_at)
            FILTER (WHERE {_RUNNABLE}))[1:%(first)s] AS priorities,
       (array_agg(r.scheduled_at ORDER BY {_EFFECTIVE_PRIORITY} DESC, r.scheduled_at)
            FILTER (WHERE {_RUNNABLE}))[1:%(first)s] AS times,
       min(r.scheduled_at) AS oldest_open,
       -- Whether the group has a cancel_previous run the claim may take: its claims
       -- need the form with cancel_previous's steps (queries.CLAIM_IN_SHARD).
       coalesce(bool_or(r.overlap_policy = 'cancel_previous') FILTER (WHERE {_RUNNABLE}), false)
            AS cancel_previous
FROM job_runs r
WHERE r.partition_id = ANY(%(partitions)s::int[]) AND r.status IN ('queued', 'retrying', 'running')
  AND {per_partition.WINDOW_BOUND.format(alias="r")}
GROUP BY r.partition_id, r.tenant_id
"""

# The weights, caps and open floors (runs/open_floors.py; NULL for none) of the map's
# tenants; read with the map (fair_share.Planner.limits).
TENANT_LIMITS = """
SELECT id, weight, max_concurrency, nullif(open_floor, '-infinity') FROM tenants WHERE id = ANY(%s::bigint[])
"""

# OPEN_FROM's bound, plain PostgreSQL; fair_share.OpenFrom.get runs it.
# The oldest day partition holding an open (queued, retrying or running) run, one day
# earlier at the latest (a run of yesterday's last second dispatched after midnight),
# or no bound when the default partition holds one (its rows may be of any day). Each
# day is one EXISTS per partial index, pruned to its partition: two index descents per
# day, about 200 buffers with 38 day partitions. Days are UTC days of 24 hours: the
# session's time zone may be any, and '1 day' in a zone with daylight saving can be 23.
OLDEST_OPEN_DAY = f"""
SELECT CASE
    WHEN EXISTS (SELECT 1 FROM {day_partitions.DEFAULT} WHERE status IN ('queued', 'retrying'))
      OR EXISTS (SELECT 1 FROM {day_partitions.DEFAULT} WHERE status = 'running') THEN NULL
    ELSE least(
        (SELECT d.day_start FROM ({day_partitions.DAY_STARTS_SQL}) d
         WHERE EXISTS (SELECT 1 FROM job_runs r WHERE r.status IN ('queued', 'retrying')
                         AND r.scheduled_at >= d.day_start
                         AND r.scheduled_at < d.day_start + interval '24 hours')
            OR EXISTS (SELECT 1 FROM job_runs r WHERE r.status = 'running'
                         AND r.scheduled_at >= d.day_start
                         AND r.scheduled_at < d.day_start + interval '24 hours')
         ORDER BY d.day_start LIMIT 1),
        date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - interval '24 hours')
    END
"""

# --- upkeep turns (runs/execution/turns.py) ---------------------------------------------------

# This executor's turn at a periodic task, if no executor took one in the last `seconds`
# (runs/execution/turns.py): a row back if it is. On the coordinator only. A turn set
# more than two intervals ahead (the coordinator's clock went back) is over too; not one:
# an ask that began a moment before the turn's taker but waited for its insert sees a
# turn a moment later than its own would be.
TAKE_TURN = """
INSERT INTO upkeep_turns AS u (task, next_at) VALUES (%(task)s, now() + make_interval(secs => %(seconds)s))
ON CONFLICT (task) DO UPDATE SET next_at = EXCLUDED.next_at
WHERE u.next_at <= now() OR u.next_at > EXCLUDED.next_at + make_interval(secs => %(seconds)s)
RETURNING u.task
"""

# --- the claim (runs/execution/claims.py) ------------------------------------------------------

# Step 1 of a claim: lock the tenants fair_share chose for it, in tenant id order
# (claimers never deadlock); claims._claim_batch and claims.Holds.reserve run it. A
# statement without distributed tables: on Citus it runs on the coordinator, in the
# coordinator's transaction (inside a statement on a shard the lock would be taken on
# that worker).
LOCK_TENANTS = """
SELECT count(*) FROM (
    SELECT pg_advisory_xact_lock(%(ns)s, u.t::integer)
    FROM unnest(%(tenants)s::bigint[]) WITH ORDINALITY AS u(t, n)
    ORDER BY u.n
    OFFSET 0
) locks
"""

# Step 1 of a shard's claim on Citus (claims._claim_in): lock (tenant, partition) for
# every pair of the shard's claim statement, in key order, as one-key advisory locks
# (claims.PARTITION_CLAIM_LOCK says how the key is made). On the coordinator, like
# LOCK_TENANTS: claimers of one job are serialised, those of one tenant in other
# partitions are not (the caps are the grants' below).
LOCK_PARTITION_TENANTS = """
SELECT count(*) FROM (
    SELECT pg_advisory_xact_lock((%(ns)s::bigint << 48) | (p::bigint << 32) | (t & 4294967295))
    FROM unnest(%(partitions)s::int[]) AS p, unnest(%(tenants)s::bigint[]) AS t
    ORDER BY p, t
    OFFSET 0
) locks
"""

# On Citus, under the tenants' locks (claims.Holds.reserve): give back `release` runs per
# tenant and grant up to `want` more, as far as the cap allows beside every executor's
# holds (tenant_holds, a coordinator table). Returns (tenant_id, granted, room left
# under the cap, what the row now holds); `alive` keeps this executor's other rows
# counting. The caps come in (read with the work map): a join of tenants, a reference
# table, would make this a distributed statement.
HOLDS_RESERVE = """
WITH asked AS (
    SELECT * FROM unnest(%(tenants)s::bigint[], %(want)s::int[], %(release)s::int[], %(caps)s::int[])
        AS a(tenant_id, want, release, cap)
),
held AS (
    SELECT h.tenant_id,
           sum(h.running) FILTER (WHERE h.owner <> %(owner)s AND h.held_until > now()) AS others,
           sum(h.running) FILTER (WHERE h.owner = %(owner)s) AS mine
    FROM tenant_holds h WHERE h.tenant_id = ANY(%(tenants)s::bigint[])
    GROUP BY h.tenant_id
),
kept AS (
    SELECT a.tenant_id, a.want, a.cap, coalesce(h.others, 0) AS others,
           greatest(0, coalesce(h.mine, 0) - a.release) AS kept
    FROM asked a LEFT JOIN held h ON h.tenant_id = a.tenant_id
),
granted AS (SELECT k.*, greatest(0, least(k.want, k.cap - k.others - k.kept)) AS n FROM kept k),
written AS (
    INSERT INTO tenant_holds (owner, tenant_id, running, held_until)
    SELECT %(owner)s, g.tenant_id, g.kept + g.n, now() + make_interval(secs => %(hold)s) FROM granted g
    ON CONFLICT (tenant_id, owner) DO UPDATE SET running = excluded.running, held_until = excluded.held_until
),
alive AS (
    UPDATE tenant_holds SET held_until = now() + make_interval(secs => %(hold)s)
    WHERE owner = %(owner)s AND running > 0 AND tenant_id <> ALL(%(tenants)s::bigint[])
)
SELECT tenant_id, n, cap - others - kept - n AS room, kept + n AS held FROM granted
"""

# Give back runs per tenant (claims.Holds.release): grants a claim did not use, and runs
# no longer in flight when there is nothing to claim. Parameters: owner, tenants, counts.
HOLDS_RELEASE = """
UPDATE tenant_holds h SET running = greatest(0, h.running - u.n)
FROM unnest(%(tenants)s::bigint[], %(counts)s::int[]) AS u(tenant_id, n)
WHERE h.owner = %(owner)s AND h.tenant_id = u.tenant_id
"""

# Keep this executor's holds counting (claims.Holds.refresh); parameters: owner, hold.
HOLDS_REFRESH = """
UPDATE tenant_holds SET held_until = now() + make_interval(secs => %(hold)s)
WHERE owner = %(owner)s AND running > 0
"""

# Rows of executors long gone and rows holding nothing; nodes.beat runs it with
# NODE_EXPIRE.
HOLDS_EXPIRE = """
DELETE FROM tenant_holds
WHERE held_until < now() - make_interval(secs => %s) OR (running = 0 AND held_until < now())
"""

# The history entry of a run a newer run of a cancel_previous job cut short.
_CANCELLED_BY_NEWER_ENTRY = attempts.sql_entry(
    attempt="o.attempt",
    owner="o.owner",
    started_at="o.started_at",
    finished_at="now()",
    duration_ms=attempts.sql_duration_ms(started="o.started_at", finished="now()"),
    outcome="'cancelled'",
    result_code="NULL",
    error="'cancelled by a newer run'",
    retry_in_s="NULL",
)

# The tenants' running runs in the claim's `slots`, as (tenant_id, n) rows named `run`:
# - plain PostgreSQL, counted by the claim itself: its snapshot is taken when it starts,
#   after the lock statement before it returned, so it sees every claim of these
#   tenants committed before ours and none can commit meanwhile (the locks);
# Counted from `busy`, which the batch form reads over every partition: one pass over
# the running runs. (A LATERAL count per tenant probed every day partition per tenant,
# 340 buffers a claim with 20 tenants; a scalar subquery in the select list was pulled up
# into `slots` and counted again at each use of n.)
_COUNTED_RUNNING = """(
    SELECT u.t AS tenant_id, count(b.tenant_id) AS n
    FROM unnest(%(tenants)s::bigint[]) AS u(t) LEFT JOIN busy b ON b.tenant_id = u.t
    GROUP BY u.t
) AS run"""
# - Citus (and the per-partition forms), granted: the runs tenant_holds granted each
#   tenant in this partition (claims.Holds.reserve); counted as "max_concurrency minus
#   the grant running", so the claim's free slots are the grant.
_GRANTED = """LATERAL (
    SELECT g.tenant_id, t.max_concurrency - g.n AS n
    FROM unnest(%(tenants)s::bigint[], %(granted)s::bigint[]) AS g(tenant_id, n)
    WHERE g.tenant_id = t.id
) AS run"""


# The parts of the claim only some forms have (_claim's docstring); f-strings, so that
# `{{partition_filter}}` and the bounds are left for per_partition.Forms as in _claim.
_BY_AGE = f"""by_age AS (
    SELECT c.* FROM slots s CROSS JOIN LATERAL (
        SELECT r.partition_id, r.id, r.scheduled_at, r.job_id, r.tenant_id, r.priority, r.overlap_policy,
               r.not_before
        FROM job_runs r
        WHERE r.partition_id {{partition_filter}} AND r.tenant_id = s.tenant_id
          AND r.status IN ('queued', 'retrying')
          AND r.not_before <= now() - %(aging)s * interval '1 second' AND {NOT_AHEAD} AND {OPEN_FROM}
          AND {{in_window:r}} AND {{above_floor:r}} AND {NOT_BLOCKED}{{probes_leave}}
        ORDER BY r.not_before
        LIMIT s.probe
        FOR UPDATE OF r SKIP LOCKED
    ) c
    -- Only tenants the plan saw a run of effective priority 9 for (runs/execution/fair_share.py,
    -- ClaimPlan.aged): for the others this probe found nothing, at two buffers per day
    -- partition per tenant (a fifth of a claim's buffers with 20 tenants).
    WHERE s.free > 0 AND s.tenant_id = ANY(%(aged)s::bigint[])
),
"""
_SUPERSEDED = """superseded AS (
    -- cancel_previous: the newest occurrence wins. A run must not start while a newer
    -- occurrence of its job waits, runs or has succeeded (an old retry or a replay
    -- would run beside it, or redo stale work after it): it is cancelled instead.
    -- Claims of one job are serialised by the claim locks (the tenant's, or on Citus the
    -- tenant's in the job's partition), so every order ends with at most one running
    -- occurrence (see docs/decisions/0036-cancel-previous.md).
    SELECT p.partition_id, p.id, p.job_id, p.scheduled_at FROM picked p
    WHERE p.overlap_policy = 'cancel_previous'
      AND (EXISTS (SELECT 1 FROM job_runs n
                   WHERE n.partition_id {partition_filter} AND n.partition_id = p.partition_id
                     AND n.job_id = p.job_id AND n.scheduled_at > p.scheduled_at AND {in_window:n}
                     AND n.status IN ('queued', 'retrying', 'running', 'succeeded'))
           OR EXISTS (SELECT 1 FROM run_history n
                      WHERE n.partition_id {partition_filter} AND n.partition_id = p.partition_id
                        AND n.job_id = p.job_id AND n.scheduled_at > p.scheduled_at AND {in_window:n}))
),
"""
_NOT_SUPERSEDED = (
    "WHERE NOT EXISTS (SELECT 1 FROM superseded x WHERE x.id = p.id AND x.scheduled_at = p.scheduled_at)"
)
_DROPPED = """dropped AS (
    UPDATE job_runs d SET
        status = 'cancelled', finished_at = now(), lease_until = NULL,
        last_error = 'cancelled: a newer occurrence of this job supersedes it (cancel_previous)'
    FROM superseded x
    WHERE d.partition_id {partition_filter} AND d.partition_id = x.partition_id
      AND d.job_id = x.job_id AND d.scheduled_at = x.scheduled_at AND {in_window:d}
    RETURNING d.job_id
),
"""
_CANCELLED = f""",
older AS (
    -- cancel_previous: the older running run loses the run; its worker finds out at
    -- its next heartbeat (the row is no longer 'running') and stops its call. Its
    -- history entry is built here, so the UPDATE below only copies it; the UPDATE
    -- re-checks the attempt it was built for. From `busy`: the running runs as this
    -- statement sees them, of any day.
    SELECT o.partition_id, o.job_id, o.scheduled_at, o.attempt,
           jsonb_build_array({_CANCELLED_BY_NEWER_ENTRY}) AS entry
    FROM busy o JOIN chosen c ON o.partition_id = c.partition_id AND o.job_id = c.job_id
    WHERE c.overlap_policy = 'cancel_previous' AND o.scheduled_at < c.scheduled_at
),
cancelled AS (
    UPDATE job_runs o SET
        status = 'cancelled', finished_at = now(), lease_until = NULL,
        last_error = 'cancelled by a newer run',
        attempts = o.attempts || x.entry
    FROM older x
    WHERE o.partition_id {{partition_filter}} AND o.partition_id = x.partition_id
      AND o.job_id = x.job_id AND o.scheduled_at = x.scheduled_at
      AND o.attempt = x.attempt AND {held("o")} AND {{since_floor:o}}
    RETURNING o.job_id
)"""


def _claim(running: str, *, by_age: bool = True, cancel_previous: bool = True) -> str:
    """The claim, with the tenants' running runs from `running` (_COUNTED_RUNNING or
    _GRANTED); `{partition_filter}` is left for per_partition.Forms.

    Without `by_age`: no probe for aged runs (for a batch of no `aged` tenant, where it
    finds nothing). Without `cancel_previous`: the probes leave cancel_previous runs out,
    and the steps for them (`superseded`, `dropped`, `older`, `cancelled`) are not there.
    Each costs the planner of a Citus worker, which plans every claim afresh (custom
    plans, runs/execution/connections.py), about a fifth and two fifths of the
    statement's planning."""
    probes_leave = "" if cancel_previous else " AND r.overlap_policy <> 'cancel_previous'"
    by_age_probe = _BY_AGE.replace("{probes_leave}", probes_leave) if by_age else ""
    picked_from = "(SELECT * FROM by_priority UNION SELECT * FROM by_age)" if by_age else "by_priority"
    superseded = _SUPERSEDED if cancel_previous else ""
    not_superseded = _NOT_SUPERSEDED if cancel_previous else ""
    dropped = _DROPPED if cancel_previous else ""
    cancelled = _CANCELLED if cancel_previous else ""
    return f"""
WITH busy AS MATERIALIZED (
    -- Every running run of any day (outside the probes' window): the caps, the skip and
    -- buffer_one checks and cancel_previous count them, and a retry or a replay may be
    -- weeks old. On Citus from the tenants' open floor on (runs/open_floors.py): no open
    -- run is older, as long as `slots` finds every floor where the claimer read it.
    SELECT r.partition_id, r.tenant_id, r.job_id, r.scheduled_at, r.attempt, r.owner, r.started_at
    FROM job_runs r
    WHERE r.partition_id {{partition_filter}} AND r.status = 'running' AND {{since_floor:r}}
),
slots AS (
    -- probe: how many runs of the tenant `chosen` could take, its free slots and its
    -- places within the batch's rank bound ((running + k) / weight <= max_rank). The
    -- probes lock what they read (FOR UPDATE inside the LATERAL): probing each tenant
    -- for the whole batch locked 640 rows to claim 32 among 20 tenants.
    SELECT t.id AS tenant_id, t.weight, run.n AS running, t.max_concurrency - run.n AS free,
           least(t.max_concurrency - run.n, %(limit)s,
                 greatest(0, floor(%(max_rank)s::float8 * t.weight + 1e-9)::bigint - run.n)) AS probe,
           -- The secrets that sign the tenant's calls (runs/execution/signing.py), read
           -- with the row the claim reads anyway: the previous one too while the
           -- overlap of a rotation lasts, on the database clock like the rotation.
           CASE WHEN t.previous_signing_secret_until > now()
                THEN ARRAY[t.signing_secret, t.previous_signing_secret]
                ELSE ARRAY[t.signing_secret] END AS signing_secrets,
           t.open_floor
    FROM tenants t JOIN {running} ON run.tenant_id = t.id
    -- On Citus: a tenant whose floor a writer lowered below the one `busy` read from
    -- gets nothing from this claim (the claimer reads the floors again).
    WHERE {{floor_holds:t}}
),
by_priority AS (
    SELECT c.* FROM slots s CROSS JOIN LATERAL (
        SELECT r.partition_id, r.id, r.scheduled_at, r.job_id, r.tenant_id, r.priority, r.overlap_policy,
               r.not_before
        FROM job_runs r
        WHERE r.partition_id {{partition_filter}} AND r.tenant_id = s.tenant_id
          AND r.status IN ('queued', 'retrying') AND r.not_before <= now() AND {NOT_AHEAD} AND {OPEN_FROM}
          AND {{in_window:r}} AND {{above_floor:r}} AND {NOT_BLOCKED}{probes_leave}
        ORDER BY r.priority DESC, r.scheduled_at
        LIMIT s.probe
        FOR UPDATE OF r SKIP LOCKED
    ) c
    WHERE s.free > 0
),
{by_age_probe}picked AS (
    SELECT u.*,
           CASE WHEN u.not_before <= now() - %(aging)s * interval '1 second' THEN 9
                ELSE u.priority END AS effective_priority
    FROM {picked_from} u
),
{superseded}ranked AS (
    SELECT p.*, row_number() OVER (PARTITION BY p.job_id ORDER BY p.scheduled_at) AS job_rank
    FROM picked p
    {not_superseded}
),
{dropped}eligible AS (
    SELECT e.*, row_number() OVER (PARTITION BY e.tenant_id
                                   ORDER BY e.effective_priority DESC, e.scheduled_at) AS tenant_rank
    FROM ranked e WHERE e.job_rank = 1 OR e.overlap_policy = 'allow'
),
chosen AS (
    -- The k-th pick of a tenant with n running ranks (n + k) / weight: fair share
    -- across tenants first, effective priority and age within it. The running counts
    -- include this batch's claims in earlier partitions, so the bound from the plan
    -- holds across the batch (a small slack for float rounding).
    SELECT e.*, s.signing_secrets FROM eligible e JOIN slots s ON s.tenant_id = e.tenant_id
    WHERE e.tenant_rank <= s.free
      AND (s.running + e.tenant_rank)::float8 / s.weight <= %(max_rank)s::float8 + 1e-9
    ORDER BY (s.running + e.tenant_rank)::float8 / s.weight, e.effective_priority DESC, e.scheduled_at
    LIMIT %(limit)s
),
claimed AS (
    -- started_at is the claim statement's own time, not its transaction's: the claim
    -- runs after the claim locks and running counts of the same transaction, and a
    -- previous run of a skip job can finish between the two (a run would look as if it
    -- started before its predecessor finished).
    UPDATE job_runs r SET
        status = 'running', attempt = r.attempt + 1,
        lease_until = to_timestamp(%(epoch)s + r.lease_seconds),
        owner = %(owner)s, started_at = statement_timestamp(), finished_at = NULL
    FROM chosen c
    WHERE r.partition_id {{partition_filter}} AND r.partition_id = c.partition_id
      AND r.job_id = c.job_id AND r.scheduled_at = c.scheduled_at AND {{in_window:r}}
    RETURNING r.job_id, r.scheduled_at, r.tenant_id, r.partition_id, r.attempt, r.job_name,
              r.overlap_policy, r.priority, r.max_attempts, r.retry_backoff_seconds,
              r.retry_backoff_cap_seconds, r.lease_seconds, r.started_at, c.signing_secrets,
              r.deferrals, r.deferred_since,
              CASE WHEN {attempts.sql_used("r")} > 1 THEN {attempts.sql_outcome("r.attempts -> -1")} END
                AS previous_outcome,
              r.target_version, r.target AS own_target
){cancelled}
-- The target: the version the run names (immutable, co-located with the run), or the
-- copy a run written before target versions carries.
SELECT c.job_id, c.scheduled_at, c.tenant_id, c.partition_id, c.attempt,
       coalesce(v.target, c.own_target), c.job_name, c.overlap_policy, c.priority,
       c.max_attempts, c.retry_backoff_seconds, c.retry_backoff_cap_seconds, c.lease_seconds,
       c.started_at, c.signing_secrets, c.deferrals, c.deferred_since, c.previous_outcome
FROM claimed c
LEFT JOIN job_targets v ON v.partition_id {{partition_filter}} AND v.partition_id = c.partition_id
     AND v.job_id = c.job_id AND v.version = c.target_version
ORDER BY c.priority DESC, c.scheduled_at
"""


# Step 3, the claim itself. Plain PostgreSQL: CLAIM, one statement for the batch over
# every partition, with the counts (claims._claim_batch). Citus: CLAIM_IN_SHARD, one
# statement per shard over the batch's partitions in it, with the grants
# (claims._claim_in).
# Per locked tenant, its best runs by effective priority (a run waiting longer than
# `aging` seconds counts as priority 9, so a flood of 9s cannot hold a 0 back forever):
# the union of two index-ordered probes, the best by priority and the longest waiting,
# each at most the tenant's places in the batch (slots.probe). Per job, at most one run
# unless the job allows overlap (a job's runs are all in its partition). Across tenants,
# the fair-share rank (running + k-th pick) / weight decides, as in fair_share.
# The batch form counts (plain PostgreSQL), the shard form is given the grants.
# The batch form names no partitions (runs/per_partition.py): with the plan's, each
# tenant's probe fetched and skipped its runs elsewhere, 5,324 buffers for 102 runs.
CLAIM = per_partition.every(_claim(_COUNTED_RUNNING))
# CLAIM_IN_SHARD[by_age, cancel_previous]: claims._claim_in takes the leanest form the
# work map allows (Citus plans each statement afresh; plain PostgreSQL plans CLAIM once).
CLAIM_IN_SHARD = {
    (by_age, cancel_previous): per_partition.in_shard(
        _claim(_GRANTED, by_age=by_age, cancel_previous=cancel_previous)
    )
    for by_age in (False, True)
    for cancel_previous in (False, True)
}

# --- outcomes (runs/execution/outcomes.py) ---------------------------------------------------

# Write the outcomes of attempts, fenced by attempt, with each job's health in the same
# statement (only where it changes); outcomes.complete_runs runs it. A success moves its
# row to run_history, written once (`succeeded`, `moved`); any other outcome updates it
# in place (`updated`). docs/decisions/0085-run-history.md.
_OUTCOMES = """jsonb_to_recordset(%(rows)s::jsonb) AS x(
        partition_id smallint, job_id uuid, scheduled_at timestamptz, attempt integer, status text,
        not_before timestamptz, result_code integer, error text, entry jsonb)"""
_FENCED = f"""r.partition_id {{partition_filter}} AND r.partition_id = x.partition_id
      AND r.job_id = x.job_id AND r.scheduled_at = x.scheduled_at AND {{in_window:r}}
      AND r.attempt = x.attempt AND {held("r")} AND r.job_id = ANY(%(job_ids)s::uuid[])"""
_UPDATED = f"""updated AS (
    UPDATE job_runs r SET
        status = x.status,
        not_before = CASE WHEN x.status = 'retrying' THEN x.not_before ELSE r.not_before END,
        lease_until = NULL,
        finished_at = CASE WHEN x.status IN ('succeeded', 'dead') THEN %(now)s END,
        result_code = x.result_code,
        last_error = x.error,
        -- A first success stores no entry: its columns say it (runs/attempts.py).
        attempts = {attempts.sql_append(history="r.attempts", entry="x.entry", status="x.status")}
    FROM {_OUTCOMES}
    WHERE {_FENCED}{{moved_out}}
    RETURNING r.partition_id, r.job_id, r.scheduled_at, r.attempt, r.status,
              {attempts.sql_outcome("x.entry -> 0")} AS outcome
)"""
_MOVED_ROW = history.insert_sql(
    "succeeded",
    finished_at="%(now)s",
    result_code="new_result_code",
    last_error="new_error",
    attempts="new_attempts",
)
_MOVED = f""",
succeeded AS (
    DELETE FROM job_runs r
    USING {_OUTCOMES}
    WHERE {_FENCED} AND x.status = 'succeeded'
    RETURNING r.*, x.result_code AS new_result_code, x.error AS new_error,
              {attempts.sql_append(history="r.attempts", entry="x.entry", status="x.status")} AS new_attempts,
              {attempts.sql_outcome("x.entry -> 0")} AS outcome
),
moved AS (  -- the sparse row of runs/history.py
    {_MOVED_ROW}
    ON CONFLICT DO NOTHING  -- a success recorded twice keeps the first (decision 0085)
)"""
_HEALTH = f"""-- Job health, in the same statement (no extra round trip per batch). An attempt the
-- executor handed back on shutdown says nothing about the target: it does not count.
judged AS (
    SELECT partition_id, job_id, scheduled_at, status,
           row_number() OVER (PARTITION BY job_id ORDER BY scheduled_at DESC, attempt DESC) AS rn
    FROM done WHERE outcome IS DISTINCT FROM '{HANDED_BACK}'
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
    WHERE jb.partition_id {{partition_filter}} AND jb.id = ANY(%(job_ids)s::uuid[])
      AND (p.fails > 0 OR jb.last_outcome <> 'succeeded' OR jb.consecutive_failures > 0 OR jb.failure_alerted
           OR jb.last_success_at IS NULL OR jb.last_success_at < %(stale_before)s
           OR EXISTS (SELECT 1 FROM run_history n
                      WHERE n.partition_id {{partition_filter}} AND n.partition_id = p.partition_id
                        AND n.job_id = p.job_id AND n.scheduled_at > p.ok_slot AND n.scheduled_at <= %(now)s
                        AND {{in_window:n}})
           -- (successes recorded before run_history existed)
           OR EXISTS (SELECT 1 FROM job_runs n
                      WHERE n.partition_id {{partition_filter}} AND n.partition_id = p.partition_id
                        AND n.job_id = p.job_id AND n.scheduled_at > p.ok_slot AND n.scheduled_at <= %(now)s
                        AND {{in_window:n}} AND n.status = 'succeeded'))
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
    WHERE jb.partition_id {{partition_filter}} AND jb.partition_id = p.partition_id
      AND jb.id = p.job_id AND l.id = jb.id AND jb.id = ANY(%(job_ids)s::uuid[])
    RETURNING jb.id
)
-- Each part also names the batch's job ids (`= ANY(%(job_ids)s)`): an index condition
-- bounded by the batch, whatever the statistics say. A generic plan made while jobs
-- looked empty (stale statistics after a bulk load or delete) read every jobs row per
-- batch instead, 21,000 buffers for 100 runs (docs/decisions/0040-per-partition-statements.md).
-- (A data-modifying WITH runs to completion whether or not the result reads it.)
SELECT job_id, scheduled_at, attempt FROM done
"""


def _complete(*, move: bool) -> str:
    """COMPLETE, moving successes to run_history or (`move` False) updating them in place."""
    done = "SELECT partition_id, job_id, scheduled_at, attempt, status, outcome FROM updated"
    if move:
        done += (
            "\n    UNION ALL\n"
            "    SELECT partition_id, job_id, scheduled_at, attempt, 'succeeded', outcome FROM succeeded"
        )
    updated = _UPDATED.replace("{moved_out}", " AND x.status <> 'succeeded'" if move else "")
    return f"WITH {updated}{_MOVED if move else ''},\ndone AS (\n    {done}\n),\n{_HEALTH}"


# Citus writes a success in place and moves it later, with MOVE_SUCCEEDED: an INSERT
# ... SELECT in a data-modifying WITH takes the statement out of its shard (Citus then
# plans each part on its own, through the coordinator, and with uuid columns fails to read
# back one of its parts: "invalid input syntax for type uuid: PGCOPY").
# docs/decisions/0087-citus-history-moves.md.
COMPLETE = per_partition.Forms.per_engine(
    plain=per_partition.bounded(_complete(move=True), "in_window"), citus=_complete(move=False)
)

# Citus: move the successes of one shard named by their keys to run_history, as COMPLETE
# does on plain PostgreSQL; runs/execution/history_moves.py runs it. One statement per
# shard for many outcome batches: Citus runs the DELETE inside the shard and the INSERT from
# what it returned, in the same transaction, so a reader sees the run in one table or the
# other. The keys come from the executor that wrote the successes; `status` fences
# everything else (a run is written `succeeded` once and nobody changes it after).
MOVE_SUCCEEDED = per_partition.Forms.of(f"""
WITH succeeded AS (
    DELETE FROM job_runs r
    USING unnest(%(run_partitions)s::smallint[], %(job_ids)s::uuid[], %(scheduled)s::timestamptz[])
        AS k(partition_id, job_id, scheduled_at)
    WHERE r.partition_id {{partition_filter}} AND r.partition_id = k.partition_id
      AND r.job_id = k.job_id AND r.scheduled_at = k.scheduled_at AND {{in_window:r}}
      AND r.status = 'succeeded' AND r.job_id = ANY(%(job_ids)s::uuid[])
    RETURNING r.*
)
{history.insert_sql("succeeded")}
ON CONFLICT DO NOTHING  -- a success recorded twice keeps the first (decision 0085)
RETURNING job_id
""")

# Citus: the keys of successes written in place that no executor will move (the one that
# wrote them was killed first, or gave up their keys), of runs of the days from `since`
# on, that finished between `within` and `after` seconds ago; history_moves.sweep moves
# them. One statement per shard, once a minute across all executors
# (turns.HISTORY_SWEEP). `since`, a value the worker plans with, leaves the older days'
# partitions out; in the others it reads job_runs' heap, which holds the queue and the
# runs that stay (dead, skipped, cancelled), not the history.
UNMOVED_SUCCEEDED = per_partition.Forms.of("""
SELECT r.partition_id, r.job_id, r.scheduled_at FROM job_runs r
WHERE r.partition_id {partition_filter} AND r.scheduled_at >= %(since)s::timestamptz
  AND r.status = 'succeeded' AND r.finished_at < now() - make_interval(secs => %(after)s)
  AND r.finished_at >= now() - make_interval(secs => %(within)s)
LIMIT %(limit)s
""")

# --- run leases (runs/execution/run_leases.py) ---------------------------------------------

# Extend the leases of the attempts still held; run_leases.heartbeat_runs runs it.
HEARTBEAT = per_partition.Forms.of(
    f"""
UPDATE job_runs r SET lease_until = to_timestamp(%(epoch)s + r.lease_seconds)
FROM unnest(%(run_partitions)s::smallint[], %(job_ids)s::uuid[], %(scheduled)s::timestamptz[],
            %(attempts)s::integer[])
    AS h(partition_id, job_id, scheduled_at, attempt)
WHERE r.partition_id {{partition_filter}} AND r.partition_id = h.partition_id
  AND r.job_id = h.job_id AND r.scheduled_at = h.scheduled_at AND {{in_window:r}}
  AND r.attempt = h.attempt AND {held("r")} AND r.job_id = ANY(%(job_ids)s::uuid[])
RETURNING r.job_id, r.scheduled_at, r.attempt
"""
)

# Partitions holding an expired lease, with the database's time; run_leases.
# reap_expired_leases runs it. A read across partitions, no lock. The running rows are
# few (at most the executors' slots), all in job_runs_running_idx. On Citus
# (EXPIRED_PARTITIONS_IN_DAYS) from the lowest open floor on (runs/open_floors.py) to
# AHEAD, constants its workers plan with: no running run is older or later, and each
# shard's plan covers those days, not every day of the retention and ahead. None on
# plain PostgreSQL, whose generic plan would prune nothing and misjudge the range.
_EXPIRED = """
SELECT DISTINCT partition_id, now() FROM job_runs
WHERE status = 'running' AND lease_until < now(){days}
"""
EXPIRED_PARTITIONS = _EXPIRED.format(days="")
EXPIRED_PARTITIONS_IN_DAYS = _EXPIRED.format(
    days="\n  AND scheduled_at >= %(open_floor)s::timestamptz AND scheduled_at < %(ahead)s::timestamptz"
)

# The history entry of an attempt whose lease ran out: when it finished is unknown.
_REAPED_ENTRY = attempts.sql_entry(
    attempt="r.attempt",
    owner="r.owner",
    started_at="r.started_at",
    finished_at="NULL",
    duration_ms="NULL",
    outcome=f"'{attempts.LEASE_EXPIRED}'",
    result_code="NULL",
    error="'lease expired (no heartbeat)'",
    retry_in_s="0",
)

# Hand back the expired leases of the partitions named (one on Citus): retrying, or dead
# with no attempts left; run_leases.reap_expired_leases runs it. The history entry and
# the message are built in the locking SELECT, so the UPDATE only copies values (see
# this module's docstring: Citus refuses functions of columns in UPDATE ... SET).
REAP = per_partition.Forms.of(f"""
WITH expired AS (
    SELECT r.partition_id, r.job_id, r.scheduled_at, {attempts.sql_used_up("r")} AS dead,
           jsonb_build_array({_REAPED_ENTRY}) AS entry,
           'lease expired: attempt ' || r.attempt || ' by ' || r.owner || ' stopped heartbeating' AS error
    FROM job_runs r
    WHERE r.partition_id {{partition_filter}} AND r.status = 'running' AND r.lease_until < %(now)s
    ORDER BY r.lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE job_runs r SET
    status = CASE WHEN e.dead THEN 'dead' ELSE 'retrying' END,
    not_before = %(now)s,
    lease_until = NULL,
    finished_at = CASE WHEN e.dead THEN %(now)s END,
    last_error = e.error,
    attempts = r.attempts || e.entry
FROM expired e
WHERE r.partition_id {{partition_filter}} AND r.partition_id = e.partition_id
  AND r.job_id = e.job_id AND r.scheduled_at = e.scheduled_at
  AND {held("r")} AND r.lease_until < %(now)s
RETURNING r.job_id, r.scheduled_at, r.tenant_id, r.job_name, r.attempt, r.owner, r.status, r.last_error
""")

# --- circuit breakers and retry budgets (runs/execution/breakers.py) --------------------------

# A target_hosts row as breakers.HostState takes it, in its fields' order.
BREAKER_COLUMNS = (
    "tenant_id, host, state, failures, failure_window_start, opened_at, open_until, cooldown_seconds,"
    " window_start, requests, retries, recovered_at"
)

# Create-or-lock the breakers of these keys, with the database's time; breakers.
# _locked_states runs it. One statement: DO UPDATE locks an existing row as FOR UPDATE
# would, and RETURNING gives the row either way. Keys come sorted: locks in key order.
BREAKERS_LOCK = f"""
INSERT INTO target_hosts AS t
    (tenant_id, host, state, failures, cooldown_seconds, requests, retries, updated_at)
SELECT k, h, 'closed', 0, 0, 0, 0, now()
FROM unnest(%s::bigint[], %s::text[]) WITH ORDINALITY AS u(k, h, n) ORDER BY n
ON CONFLICT (tenant_id, host) DO UPDATE SET host = t.host
RETURNING {BREAKER_COLUMNS}, now()
"""

# The batch's breakers that are not closed, read without a lock or a transaction;
# breakers.admit runs it.
BREAKERS_UNHEALTHY = """
SELECT t.tenant_id, t.host FROM target_hosts t
JOIN unnest(%s::bigint[], %s::text[]) AS u(k, h) ON t.tenant_id = u.k AND t.host = u.h
WHERE t.state <> 'closed'
"""

# Which of these jobs are paused (their runs never probe); breakers._paused_jobs runs it.
# By partition too, so on Citus it reads only the shards holding them.
PAUSED_JOBS = """
SELECT id FROM jobs WHERE partition_id = ANY(%s::smallint[]) AND id = ANY(%s::uuid[]) AND paused
"""

# Write back the breakers decided in Python; breakers.admit and breakers.record run it.
BREAKERS_SAVE = """
UPDATE target_hosts t SET
    state = x.state, failures = x.failures, failure_window_start = x.failure_window_start,
    opened_at = x.opened_at, open_until = x.open_until, cooldown_seconds = x.cooldown_seconds,
    window_start = x.window_start, requests = x.requests, retries = x.retries,
    recovered_at = x.recovered_at, updated_at = now()
FROM jsonb_to_recordset(%s::jsonb) AS x(
    tenant_id bigint, host text, state text, failures integer, failure_window_start timestamptz,
    opened_at timestamptz, open_until timestamptz, cooldown_seconds float8, window_start timestamptz,
    requests integer, retries integer, recovered_at timestamptz)
WHERE t.tenant_id = x.tenant_id AND t.host = x.host
"""

# Put a claimed run back untouched by a call; breakers.admit (a deferral) and
# breakers.put_back (unsent at shutdown) run it. The status it was claimed from (a run
# that has used an attempt was retrying), one more deferral so the attempt the claim
# took is not counted as used. Fenced like every write of an attempt. One partition per
# statement on Citus (runs/per_partition.py), and the database's time as a parameter:
# Citus refuses now() inside a COALESCE in a distributed UPDATE (this module's docstring).
DEFER = per_partition.Forms.of(
    f"""
UPDATE job_runs r SET
    status = CASE WHEN {attempts.sql_used("r")} > 1 THEN 'retrying' ELSE 'queued' END,
    deferrals = r.deferrals + 1,
    deferred_since = coalesce(r.deferred_since, %(now)s),
    not_before = x.until,
    lease_until = NULL,
    last_error = x.reason
FROM jsonb_to_recordset(%(rows)s::jsonb) AS x(partition_id smallint, job_id uuid, scheduled_at timestamptz,
                                               attempt integer, until timestamptz, reason text)
WHERE r.partition_id {{partition_filter}} AND r.partition_id = x.partition_id
  AND r.job_id = x.job_id AND r.scheduled_at = x.scheduled_at AND {{in_window:r}}
  AND r.attempt = x.attempt AND {held("r")}
RETURNING r.job_id
"""
)

# Fold answers only (no DOWN) into their breakers; breakers.record runs it.
# What apply_outcomes makes of answers only, whatever the state: the breaker is
# closed with no failures; on a breaker that was not closed the recovery ramp starts with
# a fresh budget minute holding these answers, otherwise the minute restarts if it is over
# and `requests` grows by the answers. One statement, no transaction around it: the row
# lock lasts the statement, not four round trips, so executors writing outcomes to one
# host do not queue behind each other. The database clock comes in through the rows
# (`excluded`), not as now() beside a column in SET (Citus refuses that, see DEFER).
BREAKERS_ANSWERED = """
INSERT INTO target_hosts AS t
    (tenant_id, host, state, failures, cooldown_seconds, window_start, requests, retries, updated_at)
SELECT k, h, 'closed', 0, 0, now(), n, 0, now()
FROM unnest(%(tenants)s::bigint[], %(hosts)s::text[], %(answers)s::integer[]) AS u(k, h, n) ORDER BY k, h
ON CONFLICT (tenant_id, host) DO UPDATE SET
    state = 'closed', failures = 0, failure_window_start = NULL, opened_at = NULL, open_until = NULL,
    recovered_at = CASE WHEN t.state <> 'closed' THEN excluded.window_start ELSE t.recovered_at END,
    window_start = CASE WHEN t.state <> 'closed' OR t.window_start IS NULL
                             OR excluded.window_start - t.window_start >= %(window)s
                        THEN excluded.window_start ELSE t.window_start END,
    requests = CASE WHEN t.state <> 'closed' OR t.window_start IS NULL
                         OR excluded.window_start - t.window_start >= %(window)s
                    THEN excluded.requests ELSE t.requests + excluded.requests END,
    retries = CASE WHEN t.state <> 'closed' OR t.window_start IS NULL
                        OR excluded.window_start - t.window_start >= %(window)s
                   THEN 0 ELSE t.retries END,
    updated_at = excluded.updated_at
"""

# Delete one batch of breaker rows nobody used for a while; breakers.prune_idle runs it
# until a batch comes back short. Each batch its own statement: a row stays locked only
# while its batch is deleted, and rows an executor holds (SKIP LOCKED) are left for the
# next time.
BREAKERS_PRUNE = """
DELETE FROM target_hosts t USING (
    SELECT tenant_id, host FROM target_hosts
    WHERE updated_at < now() - %(idle)s AND (open_until IS NULL OR open_until < now() - %(idle)s)
    LIMIT %(batch)s FOR UPDATE SKIP LOCKED
) idle
WHERE t.tenant_id = idle.tenant_id AND t.host = idle.host
"""

# --- the planner's statistics (runs/execution/table_statistics.py) ----------------------------

# The watched tables: jobs, job_targets (the claim joins it) and the day partitions of
# job_runs this role may analyze.
_WATCHED = f"""
    (c.oid IN ('jobs'::regclass, 'job_targets'::regclass)
     OR (c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = '{day_partitions.PARENT}'::regclass)
         AND c.relname <> '{day_partitions.DEFAULT}'))
    AND pg_has_role(c.relowner, 'USAGE')
"""

# Day partitions and job_targets (what the claim reads) whose statistics count fewer rows
# than pages: ANALYZE ran when (nearly) every row was dead;
# table_statistics.analyze_if_called_empty runs it. Never-analyzed tables (reltuples -1)
# are estimated from their size.
STATS_UNDERSTATED = f"""
SELECT c.oid::regclass::text, c.relpages FROM pg_class c
WHERE c.reltuples >= 0 AND c.reltuples < c.relpages AND c.oid <> 'jobs'::regclass AND {_WATCHED}
"""

# The watched tables' statistics and live row counts; table_statistics.keep_statistics runs it.
STATS_WATCHED = f"""
SELECT c.oid::regclass::text, c.reltuples, c.relpages, s.n_live_tup
FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE {_WATCHED}
"""

# When a table was last analyzed; table_statistics._analyze runs it before and after.
STATS_ANALYZED_AT = "SELECT pg_stat_get_last_analyze_time(%s::regclass)"

# Analyze one table unless it is locked; table_statistics._analyze runs it, the table
# filled in as a psycopg `sql.Identifier` ({}).
STATS_ANALYZE = "ANALYZE (SKIP_LOCKED) {}"

# Citus: per worker, one JSON text [[schema, shard, reltuples, relpages, n_live_tup, pages now (the
# file's size: the views trail inserts)], ...] of the shards of `jobs`, `job_targets` and the day
# partitions from the lowest open floor's day to AHEAD (%1$L, %2$L: STATS_SHARDS): the days that
# can hold open runs (runs/open_floors.py), which hot statements read; autovacuum keeps the rest.
# table_statistics._keep_shard_statistics runs it. A shard without statistics costs its worker a
# file size in a session new each turn, and pg_stat_user_tables a row of every relation: 43 ms a
# worker with 38 days of 16 shards, 12 ms so. Only run_command_on_workers' sessions see the shards.
STATS_SHARDS_ON_WORKER = rf"""
SELECT coalesce(json_agg(json_build_array(
           w.nspname, w.relname, w.reltuples, w.relpages, pg_stat_get_live_tuples(w.oid),
           CASE WHEN w.reltuples <= 0 THEN pg_relation_size(w.oid) / current_setting('block_size')::int END
       )), '[]')
FROM (
    -- -1: never analyzed, whatever reltuples says (VACUUM and CREATE INDEX set it, no histogram)
    SELECT c.oid, n.nspname, c.relname, c.relpages,
           CASE WHEN coalesce(pg_stat_get_last_analyze_time(c.oid), pg_stat_get_last_autoanalyze_time(c.oid))
                IS NULL THEN -1 ELSE c.reltuples END AS reltuples
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind = 'r' AND pg_has_role(c.relowner, 'USAGE')
      AND (c.relname ~ '^(jobs|job_targets)_[0-9]+$'
           OR (c.relname ~ '^{day_partitions.NAME_PATTERN}_[0-9]+$'
               AND substring(c.relname FROM '^{day_partitions.NAME_PATTERN}_') BETWEEN %1$L AND %2$L))
) w
"""
# The days as YYYYMMDD ('' for no lower bound), on the database's clock.
STATS_SHARDS = f"""
SELECT nodename, nodeport, success, result FROM run_command_on_workers(format(%s,
    (SELECT CASE WHEN min(open_floor) > '-infinity'
                 THEN to_char(min(open_floor) AT TIME ZONE 'UTC', 'YYYYMMDD') ELSE '' END FROM tenants),
    to_char((now() + interval '{AHEAD.days} day') AT TIME ZONE 'UTC', 'YYYYMMDD')))
"""

# Citus: one command per worker (its shards' ANALYZE), all workers at once. A worker
# that refuses the connection answers `success` false and holds up none of the others;
# one that does not answer holds up all of them for citus.node_connection_timeout, which
# table_statistics sets short for these two statements (and resets after).
STATS_ON_WORKERS = (
    "SELECT node_name, node_port, success, result"
    " FROM master_run_on_worker(%(nodes)s::text[], %(ports)s::int[], %(commands)s::text[], true)"
)
STATS_WORKERS_TIMEOUT = "SELECT set_config('citus.node_connection_timeout', %s, false)"
STATS_WORKERS_TIMEOUT_RESET = "RESET citus.node_connection_timeout"

# Count a table's rows, at most %s of them; table_statistics.analyze_if_called_empty runs
# it, the table filled in as a psycopg `sql.Identifier` ({}).
STATS_ROWS_UP_TO = "SELECT count(*) FROM (SELECT FROM {} LIMIT %s) AS r"
