"""Which partitions an executor claims from next, in fair-share order: one read, no lock.

Claims lock and write in one partition per statement (runs/claims.py), so a batch is
gathered partition by partition. Which partitions, and in which order, is what keeps
fair share across tenants (DESIGN section 5): this read ranks the runs every tenant
with a free slot would hand out next, exactly as a claim ranks them ((runs it has
running + its k-th pick) / weight, then effective priority, then age), keeps the first
`limit` of them, and returns their partitions best rank first, each with the tenants
whose runs put it there. A tenant with nothing running therefore puts its partition
at the head of the list while a busy tenant's backlog waits: the partition of the
run fair share would pick next is claimed next, wherever it lives.

Reads may span partitions (DESIGN section 10: a row lock must not). Two forms of the
same read, chosen per connection (runs/connections.is_citus):
- plain PostgreSQL: per open tenant, two index-ordered probes (best priority, longest
  waiting), as cheap as the claim's own;
- Citus: a LIMIT inside a LATERAL subquery that correlates on a non-distribution
  column cannot be pushed down to the shards, so the shards each aggregate their
  runnable runs per (partition, tenant) (a pushed-down GROUP BY on the distribution
  column) and the coordinator ranks those groups. It reads every runnable row once,
  spread over the workers; see docs/DECISIONS.md for what that costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from runs import connections

_OPEN_TENANTS = """
running AS (
    SELECT tenant_id, count(*) AS n FROM busy GROUP BY tenant_id
),
open_tenants AS (
    SELECT t.id, t.weight, coalesce(ru.n, 0) AS n, t.max_concurrency - coalesce(ru.n, 0) AS free
    FROM tenants t LEFT JOIN running ru ON ru.tenant_id = t.id
    WHERE t.max_concurrency > coalesce(ru.n, 0)
)"""

# Runs of busy skip/buffer_one jobs are passed over, as in the claim (a tenant whose
# only due runs are blocked would take a place for nothing).
_NOT_BLOCKED = """(r.overlap_policy NOT IN ('skip', 'buffer_one')
               OR r.job_id NOT IN (SELECT job_id FROM busy))"""

# Both forms end alike: the first `limit` picks by fair-share rank, by partition.
_BY_PARTITION = """best AS (
    SELECT *, (n + k)::float8 / weight AS rank FROM picks
    ORDER BY rank, effective_priority DESC, scheduled_at
    LIMIT %(limit)s
)
SELECT partition_id, array_agg(DISTINCT tenant_id), (SELECT max(rank) FROM best) FROM best
GROUP BY partition_id
ORDER BY min(rank), max(effective_priority) DESC, min(scheduled_at)
"""

_PLAIN_SQL = f"""
WITH busy AS MATERIALIZED (
    SELECT tenant_id, job_id FROM job_runs WHERE status = 'running'
),
{_OPEN_TENANTS},
picks AS (
    SELECT o.id AS tenant_id, o.n, o.weight, p.partition_id, p.effective_priority, p.scheduled_at,
           row_number() OVER (PARTITION BY o.id
                              ORDER BY p.effective_priority DESC, p.scheduled_at) AS k
    FROM open_tenants o CROSS JOIN LATERAL (
        SELECT u.partition_id, u.scheduled_at,
               CASE WHEN u.not_before <= now() - %(aging)s * interval '1 second' THEN 9
                    ELSE u.priority END AS effective_priority
        FROM ((SELECT r.id, r.scheduled_at, r.partition_id, r.priority, r.not_before FROM job_runs r
               WHERE r.tenant_id = o.id
                 AND r.status IN ('queued', 'retrying') AND r.not_before <= now()
                 AND {_NOT_BLOCKED}
               ORDER BY r.priority DESC, r.scheduled_at
               LIMIT least(o.free, %(limit)s))
              UNION
              (SELECT r.id, r.scheduled_at, r.partition_id, r.priority, r.not_before FROM job_runs r
               WHERE r.tenant_id = o.id
                 AND r.status IN ('queued', 'retrying')
                 AND r.not_before <= now() - %(aging)s * interval '1 second'
                 AND {_NOT_BLOCKED}
               ORDER BY r.not_before
               LIMIT least(o.free, %(limit)s))) u
    ) p
),
{_BY_PARTITION}"""

# Per (partition, tenant): its runnable runs, the best effective priority among them
# and the oldest slot; the tenant's k-th group ranks like its k-th pick would (runs in
# one partition are claimed together, so a group stands for them). Runs of busy jobs
# are not passed over here (that would ship the running set to every shard); the
# claim passes over them, at the cost of a claim that may find nothing.
_CITUS_SQL = f"""
WITH groups AS MATERIALIZED (
    SELECT r.partition_id, r.tenant_id, min(r.scheduled_at) AS scheduled_at,
           max(CASE WHEN r.not_before <= now() - %(aging)s * interval '1 second' THEN 9
                    ELSE r.priority END) AS effective_priority
    FROM job_runs r
    WHERE r.status IN ('queued', 'retrying') AND r.not_before <= now()
    GROUP BY r.partition_id, r.tenant_id
),
busy AS MATERIALIZED (
    SELECT tenant_id FROM job_runs WHERE status = 'running'
),
{_OPEN_TENANTS},
picks AS (
    SELECT g.*, o.n, o.weight,
           row_number() OVER (PARTITION BY g.tenant_id
                              ORDER BY g.effective_priority DESC, g.scheduled_at) AS k
    FROM groups g JOIN open_tenants o ON o.id = g.tenant_id
),
{_BY_PARTITION}"""


@dataclass(frozen=True)
class Plan:
    """Where to claim, in order: (partition_id, tenant ids to claim for there); and the
    worst fair-share rank among the picks, which bounds every partition's claim so
    that a busy tenant's runs in an early partition cannot take the places that
    better-ranked runs in later partitions were given."""

    partitions: list[tuple[int, list[int]]]
    max_rank: float


async def plan(conn, *, limit: int, aging_seconds: float) -> Plan:
    sql = _CITUS_SQL if await connections.is_citus(conn) else _PLAIN_SQL
    cursor = await conn.execute(sql, {"limit": limit, "aging": aging_seconds})
    found = await cursor.fetchall()
    return Plan([(row[0], list(row[1])) for row in found], max(row[2] for row in found) if found else 0.0)
