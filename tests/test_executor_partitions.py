"""The executor's statements address one partition each (docs/CONTRACT.md, "Beyond one server").

On Citus, `FOR UPDATE` works only inside one shard and a write that names no
partition_id goes to every shard; volatile functions, and stable ones applied to
columns, are refused in a distributed UPDATE. Plain PostgreSQL accepts all of that, so
these tests run the executor's real statements (claim, heartbeat, complete with job
health, deferral by a breaker, reap) against the real database on a connection that
records what it sends, and check every statement that writes or locks a row. The
behaviour around it (fair share across partitions, caps across partitions) is checked
on the rows.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from jobs.models import Job
from jobs.services import create_job, partition_for
from jobs.tenant_services import create_tenant
from runs import per_partition, rows
from runs.attempts import AttemptRecord
from runs.execution import breaker_rules, breakers, claims, connections, outcomes, run_leases
from runs.models import JobRun, JobRunRow
from scheduler_project.citus import Placements, citus_installed_async
from tests.conftest import database_url
from tests.support.executor import http_spec, queue_runs, set_running, task_target

pytestmark = pytest.mark.django_db(transaction=True)


class RecordingConnection(psycopg.AsyncConnection):
    """A real connection that also keeps every (statement, parameters) it executes."""

    statements: list[tuple[str, object]]

    async def execute(self, query, params=None, **kwargs):
        self.statements.append((str(query), params))
        return await super().execute(query, params, **kwargs)


async def recording_connection() -> RecordingConnection:
    conn = await RecordingConnection.connect(database_url(), autocommit=True, prepare_threshold=0)
    conn.statements = []
    return conn


_TABLE_REF = re.compile(r"\b(?:FROM|JOIN|UPDATE)\s+(job_runs|jobs)\s+(?:AS\s+)?(\w+)", re.I)
_WRITES_OR_LOCKS = re.compile(r"\bUPDATE\s+(job_runs|jobs)\b|\bFOR\s+(NO\s+KEY\s+)?UPDATE\b", re.I)
_SET_CLAUSE = re.compile(
    r"\bUPDATE\s+(?:job_runs|jobs)\s+\w+\s+SET\b(.*?)(?=\bFROM\b|\bWHERE\b)", re.I | re.S
)
# `col = now()` alone is evaluated once on the coordinator; anything else that calls a
# function inside SET may be refused by Citus or differ per shard.
_PLAIN_NOW = re.compile(r"=\s*now\(\)\s*(,|$)", re.M)
_FORBIDDEN_IN_SET = re.compile(r"now\(|random\(|clock_timestamp\(|interval|jsonb_build_|\|\|\s*'", re.I)


def partition_problems(statements: list[tuple[str, object]]) -> list[str]:
    """What is wrong, per statement that writes or locks runs or jobs."""
    problems = []
    for sql, params in statements:
        if not _WRITES_OR_LOCKS.search(sql):
            continue
        head = " ".join(sql.split())[:80]
        # One partition (`= %(partition)s`), or the partitions of one shard (`=
        # ANY(%(partitions)s)`, grouped by scheduler_project.citus.Placements: on this
        # plain server every partition is in the one "shard", and on Citus the shards
        # are Citus's own).
        params = params if isinstance(params, dict) else {}
        if isinstance(params.get("partition"), int):
            named = r"= %\(partition\)s"
        elif params.get("partitions") and all(isinstance(p, int) for p in params["partitions"]):
            named = r"= ANY\(%\(partitions\)s::int\[\]\)"
        else:
            problems.append(f"no partition parameter: {head}")
            continue
        for table, alias in _TABLE_REF.findall(sql):
            if not re.search(rf"\b{alias}\.partition_id {named}", sql) and not (
                alias.upper() in ("WHERE", "GROUP") and re.search(rf"partition_id {named}", sql)
            ):
                problems.append(f"{table} {alias} not limited to the partition: {head}")
        for assignments in _SET_CLAUSE.findall(sql):
            rest = _PLAIN_NOW.sub(r"\1", assignments)
            if _FORBIDDEN_IN_SET.search(rest):
                problems.append(
                    f"a function of columns in SET: {_FORBIDDEN_IN_SET.search(rest).group(0)} in {head}"
                )
    return problems


def spread_jobs(tenant, count: int) -> list[Job]:
    """Jobs in at least three different partitions."""
    jobs: list[Job] = []
    while len({j.partition_id for j in jobs}) < 3 or len(jobs) < count:
        fields = {"name": f"job {len(jobs)}", "interval_seconds": 86400, "target": task_target("noop")}
        jobs.append(create_job(tenant=tenant, fields=fields))
    return jobs


def queue_for(job: Job, *, minutes_ago: int = 5, target: dict | None = None) -> tuple[uuid.UUID, datetime]:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=minutes_ago)
    (key,) = queue_runs(job.tenant, target or task_target("noop"), job_id=job.id, start=start)
    return key


def completion(run: rows.ClaimedRun, status: str) -> rows.Completion:
    """An outcome of `run`'s attempt (a retry comes back in 30 s)."""
    return rows.Completion(
        job_id=run.job_id,
        scheduled_at=run.scheduled_at,
        partition_id=run.partition_id,
        attempt=run.attempt,
        status=status,
        retry_in_s=30.0,
        result_code=200,
        error="",
        entry=AttemptRecord(run.attempt, "x:1", None, None, None, status, 200, "", 30.0),
    )


def test_every_write_and_row_lock_of_the_executor_addresses_one_partition(per_partition_forms):
    """The per-partition (Citus) form, on this plain PostgreSQL."""
    tenant, _ = create_tenant(slug="parts", max_concurrency=100)
    jobs = spread_jobs(tenant, 6)
    for job in jobs:
        queue_for(job)
    # cancel_previous with an older run still running: the claim cancels it.
    newer_job = jobs[0]
    older_key = queue_for(newer_job, minutes_ago=9)
    JobRunRow.objects.filter(job_id=newer_job.id).update(overlap_policy="cancel_previous")
    set_running(older_key, owner="old:1")
    # An orphan to reap, in another partition.
    orphan_key = queue_for(jobs[1], minutes_ago=20)
    set_running(orphan_key, owner="gone:1", lease=timedelta(seconds=-5))
    # A host whose breaker is open, so admission defers its run.
    host_job = jobs[2]
    host_key = queue_for(host_job, minutes_ago=30, target=http_spec("http://127.0.0.1:9/x"))

    sent: list[tuple[str, object]] = []

    async def scenario() -> None:
        conn = await recording_connection()
        conn.statements = sent
        try:
            await conn.execute(
                "INSERT INTO target_hosts (tenant_id, host, state, failures, cooldown_seconds, requests,"
                " retries, updated_at, opened_at, open_until)"
                " VALUES (%s, %s, 'open', 5, 5, 0, 0, now(), now(), %s)",
                [tenant.id, "http://127.0.0.1:9", datetime.now(UTC) + timedelta(minutes=5)],
            )
            reaped = await run_leases.reap_expired_leases(conn)
            assert [r.job_id for r in reaped] == [orphan_key[0]]
            claimed = await claims.claim_runs(conn, owner="me:1", limit=50)
            assert len({r.partition_id for r in claimed}) >= 3
            http = [r for r in claimed if r.job_id == host_job.id and r.scheduled_at == host_key[1]]
            admission = await breakers.admit(
                conn,
                [
                    breaker_rules.Candidate(
                        (r.job_id, r.scheduled_at, r.attempt),
                        r.tenant_id,
                        "http://127.0.0.1:9",
                        False,
                        None,
                        4,
                        partition_id=r.partition_id,
                    )
                    for r in http
                ],
                policy=breaker_rules.Policy(),
            )
            assert len(admission.defer) == 1
            rest = [r for r in claimed if r not in http]
            held = await run_leases.heartbeat_runs(
                conn, [(r.partition_id, (r.job_id, r.scheduled_at, r.attempt)) for r in rest]
            )
            assert len(held) == len(rest)
            written = await outcomes.complete_runs(
                conn, [completion(r, "succeeded" if i % 2 else "retrying") for i, r in enumerate(rest)]
            )
            assert len(written) == len(rest)
        finally:
            await conn.close()

    try:
        asyncio.run(scenario())
    finally:
        # Checked first, whatever failed later: every statement sent so far.
        assert partition_problems(sent[1:]) == []
    # The statements did their work: the older run was cancelled by the newer one, the
    # deferral and the outcomes landed, job health was written in each job's partition.
    assert JobRun.objects.get(job_id=older_key[0], scheduled_at=older_key[1]).status == "cancelled"
    assert JobRun.objects.get(job_id=host_key[0], scheduled_at=host_key[1]).deferrals == 1
    assert JobRun.objects.filter(status="succeeded").count() >= 2
    assert Job.objects.filter(last_outcome__in=["succeeded", "failed"]).count() >= 3
    retried = JobRun.objects.filter(status="retrying", tenant_id=tenant.id, attempt=1).exclude(
        job_id=orphan_key[0]
    )
    assert retried and all(r.not_before > datetime.now(UTC) + timedelta(seconds=20) for r in retried)


def test_plain_postgresql_claims_and_writes_a_batch_in_one_statement_each():
    """Single-server users pay one claim transaction per batch, whatever its spread over
    partitions, and one statement for its heartbeat and for its outcomes."""
    tenant, _ = create_tenant(slug="plain", max_concurrency=100)
    jobs = spread_jobs(tenant, 8)
    for job in jobs:
        queue_for(job)
    sent: list[tuple[str, object]] = []

    async def scenario() -> tuple[list[rows.ClaimedRun], set, set]:
        conn = await recording_connection()
        conn.statements = sent
        try:
            assert not await per_partition.split(conn)
            claimed = await claims.claim_runs(conn, owner="me:1", limit=32)
            keys = [(r.partition_id, (r.job_id, r.scheduled_at, r.attempt)) for r in claimed]
            held = await run_leases.heartbeat_runs(conn, keys)
            written = await outcomes.complete_runs(conn, [completion(r, "succeeded") for r in claimed])
            return claimed, held, written
        finally:
            await conn.close()

    claimed, held, written = asyncio.run(scenario())
    assert len(claimed) == len(jobs) and len({r.partition_id for r in claimed}) >= 3
    assert len(held) == len(written) == len(claimed)
    writes = [(sql, params) for sql, params in sent if _WRITES_OR_LOCKS.search(sql)]
    # The claim, the heartbeat, the outcomes: one statement each. None names a list of
    # partitions (runs/per_partition.py); the heartbeat and the outcomes name each
    # row's own.
    assert len(writes) == 3, [" ".join(sql.split())[:60] for sql, _ in writes]
    assert not any("partitions" in params or "%(partitions)s" in sql for sql, params in writes)
    partitions = sorted({r.partition_id for r in claimed})
    assert sorted(set(writes[1][1]["run_partitions"])) == partitions
    assert all(job.last_outcome == "succeeded" for job in Job.objects.filter(tenant=tenant))


@pytest.mark.parametrize("one_per_statement", [False, True], ids=["plain", "per-partition"])
def test_fair_share_reaches_across_partitions(one_per_statement, request):
    """A tenant with nothing running is served first even though a busy tenant's backlog
    fills every other partition; the cap counts runs in every partition."""
    if one_per_statement:
        request.getfixturevalue("per_partition_forms")
    busy, _ = create_tenant(slug="busy", max_concurrency=12)
    quiet, _ = create_tenant(slug="quiet", max_concurrency=10)
    backlog = queue_runs(busy, task_target("noop"), count=40)
    for key in backlog[:10]:
        set_running(key, owner="other:1")
    late = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)
    waiting = queue_runs(quiet, task_target("noop"), count=3, start=late)
    assert len({partition_for(k[0]) for k in backlog + waiting}) > 10

    async def claim():
        conn = await connections.connect_async(database_url())
        try:
            return await claims.claim_runs(conn, owner="me:1", limit=4)
        finally:
            await conn.close()

    claimed = asyncio.run(claim())
    by_tenant = [r.tenant_id for r in claimed]
    # The busy tenant has 10 of its 12 slots taken wherever its runs live: 2 more at most.
    assert by_tenant.count(quiet.id) == 3 and by_tenant.count(busy.id) <= 1, by_tenant
    assert JobRun.objects.filter(tenant_id=busy.id, status="running").count() <= 12


def test_plan_cache_mode_follows_the_database():
    async def mode() -> tuple[bool, str]:
        conn = await connections.connect_async(database_url())
        try:
            cursor = await conn.execute("SHOW plan_cache_mode")
            return await citus_installed_async(conn), (await cursor.fetchone())[0]
        finally:
            await conn.close()

    assert asyncio.run(mode()) == (False, "force_generic_plan")
    # Citus cannot route a generic plan of a statement on a distributed table.
    assert connections.plan_cache_mode(citus=True) == "force_custom_plan"


def test_the_plan_gives_the_batch_to_the_best_ranks_of_every_tenant():
    from runs.execution.fair_share import Pick, rank

    at = datetime(2026, 1, 1, tzinfo=UTC)
    picks = [
        # busy: 10 running, 2 more allowed, its picks in partitions 7 and 8
        Pick(1, 10, 1, 7, 0, at, 1, 2),
        Pick(1, 10, 1, 8, 0, at, 2, 2),
        # quiet: nothing running; 8 picks read, more may exist (it has 10 free slots)
        *(Pick(2, 0, 1, 100 + k, 0, at, k, 10) for k in range(1, 9)),
        # heavy: weight 4, 4 running: its k-th place ranks (4 + k) / 4
        Pick(3, 4, 4, 50, 0, at, 1, 3),
    ]
    plan = rank(picks, limit=4)
    # quiet's places rank 1, 2, 3 ...; heavy's 1.25, 1.5, 1.75 (its 3 allowed); busy's
    # 11, 12. The four best: 1, 1.25, 1.5, 1.75; heavy's partition holds only its first
    # pick, the others are where the claim in it (and later plans) will find them.
    assert plan.max_rank == 1.75
    assert plan.partitions == [(101, [2]), (50, [3])]
    # A tenant alone gets its whole cap, beyond the picks read.
    alone = rank([Pick(2, 0, 1, 5, 0, at, 1, 10)], limit=6)
    assert alone == type(alone)([(5, [2])], 6.0)


def round_trips(trace: str) -> int:
    """How often a libpq trace shows the client sending and then waiting for the
    server's answer: each run of client messages followed by server messages."""
    sides = [line.split("\t")[1] for line in trace.splitlines() if line.count("\t") >= 2]
    return sum(1 for sent, answered in itertools.pairwise(sides) if (sent, answered) == ("F", "B"))


def test_plain_postgresql_claims_in_two_round_trips(tmp_path):
    """The claim loop is bound by round trips (docs/decisions/0033-claim-transaction.md): on
    plain PostgreSQL a claim is the plan read, then the
    lock, the claim (counting running runs itself, after the lock) and the commit sent
    together: two waits for the server, not four."""
    tenant, _ = create_tenant(slug="trips", max_concurrency=100)
    for job in spread_jobs(tenant, 8):
        queue_for(job)
    trace_file = tmp_path / "libpq.trace"

    async def scenario() -> list[rows.ClaimedRun]:
        conn = await connections.connect_async(database_url())
        try:
            assert not await per_partition.split(conn)
            # The first claim prepares the statements (a Parse and a wait each, once per
            # connection and re-plan): the executor's steady state is the second.
            assert len(await claims.claim_runs(conn, owner="me:1", limit=2)) == 2
            with open(trace_file, "w") as out:
                conn.pgconn.trace(out.fileno())
                try:
                    return await claims.claim_runs(conn, owner="me:1", limit=32)
                finally:
                    conn.pgconn.untrace()
        finally:
            await conn.close()

    claimed = asyncio.run(scenario())
    assert len(claimed) == 6
    assert JobRun.objects.filter(tenant_id=tenant.id, status="running").count() == 8
    trace = trace_file.read_text()
    assert round_trips(trace) == 2, trace


def test_a_failed_plain_claim_leaves_its_connection_usable():
    """The claim's BEGIN ... COMMIT goes in one pipeline: when a statement fails, the
    server skips the rest (COMMIT too) and the transaction is left aborted. The claim
    ends it, so the next claim on the same connection works."""
    tenant, _ = create_tenant(slug="fails", max_concurrency=100)
    for job in spread_jobs(tenant, 3):
        queue_for(job)

    async def scenario() -> tuple[type, object, int]:
        holder = await connections.connect_async(database_url())
        conn = await connections.connect_async(database_url())
        try:
            # Another claimer holds the tenant's claim lock; ours gives up after 200 ms.
            await holder.execute("BEGIN")
            lock = "SELECT pg_advisory_xact_lock(%s, %s)"
            await holder.execute(lock, [claims.TENANT_CLAIM_LOCK, tenant.id])
            await conn.execute("SET statement_timeout = 200")
            with pytest.raises(psycopg.errors.QueryCanceled) as failed:
                await claims.claim_runs(conn, owner="me:1", limit=32)
            status = conn.info.transaction_status
            await holder.execute("ROLLBACK")
            await conn.execute("SET statement_timeout = 0")
            # This tenant's: a run another test left queued in this database may come too.
            again = await claims.claim_runs(conn, owner="me:1", limit=32)
            return failed.type, status, sum(run.tenant_id == tenant.id for run in again)
        finally:
            await conn.close()
            await holder.close()

    error, status, claimed = asyncio.run(scenario())
    assert error is psycopg.errors.QueryCanceled
    assert status == psycopg.pq.TransactionStatus.IDLE
    assert claimed == 3


@pytest.mark.django_db(transaction=True)
def test_outcomes_and_heartbeats_reach_the_healthy_workers_when_one_is_out_of_reach(
    per_partition_forms, monkeypatch
):
    """Citus with one worker down: the writes for runs on the other workers still land,
    and those for the down worker come back as not written (to try again), not fenced.
    Here the partitions are split over two make-believe workers, and every statement
    naming a partition of the second fails as Citus fails when it cannot reach a worker."""
    tenant, _ = create_tenant(slug="split", max_concurrency=100)
    jobs = spread_jobs(tenant, 6)
    for job in jobs:
        queue_for(job)
    # Every other partition of the jobs' (at least three): odd partition ids alone were
    # none at all when the random job ids all hashed to even ones.
    down = set(sorted({j.partition_id for j in jobs})[1::2])
    assert down and len(down) < len({j.partition_id for j in jobs})

    async def placements(conn, partitions):
        return {p: ("127.0.0.1:2" if p in down else "127.0.0.1:1") for p in partitions}

    monkeypatch.setattr(per_partition.PLACEMENTS, "read_async", placements)
    monkeypatch.setattr(per_partition.PLACEMENTS, "shard", lambda partition: partition)
    real_each = per_partition._each

    async def each(conn, sql, params):
        if any(p in down for ps in params for p in ps["partitions"]):
            raise psycopg.OperationalError(
                "connection to the remote node cronyard@127.0.0.1:2 failed with the following error: refused"
            )
        return await real_each(conn, sql, params)

    monkeypatch.setattr(per_partition, "_each", each)

    async def scenario():
        conn = await connections.connect_async(database_url())
        try:
            claimed = await claims.claim_runs(conn, owner="me:1", limit=50)
            on_down = {(r.job_id, r.scheduled_at, r.attempt) for r in claimed if r.partition_id in down}
            keys = [(r.partition_id, (r.job_id, r.scheduled_at, r.attempt)) for r in claimed]
            held = await run_leases.heartbeat_runs(conn, keys)
            assert held == {k for _, k in keys}  # the down worker's runs are kept, not dropped
            with pytest.raises(outcomes.PartlyWritten) as failed:
                await outcomes.complete_runs(conn, [completion(r, "succeeded") for r in claimed])
            assert failed.value.written == {k for _, k in keys} - on_down
            assert {(c.job_id, c.scheduled_at, c.attempt) for c in failed.value.items} == on_down
            return on_down
        finally:
            await conn.close()

    on_down = asyncio.run(scenario())
    assert on_down
    statuses = {(r.job_id, r.status) for r in JobRun.objects.filter(tenant_id=tenant.id)}
    assert {s for j, s in statuses if j in {k[0] for k in on_down}} == {"running"}
    assert {s for j, s in statuses if j not in {k[0] for k in on_down}} == {"succeeded"}


def test_a_failed_shard_claim_returns_the_other_shards_runs(per_partition_forms, monkeypatch):
    """A claim's shards go side by side (claims.Lanes), each in its own transaction. When
    one shard's statement fails, the runs the others committed are returned, to be
    called: raised, they would sit running, uncalled, until their leases ended. Here the
    partitions are shown as four shards, and the statements of one of them fail."""
    monkeypatch.setattr(Placements, "shard", lambda self, partition: partition % 4)
    tenant, _ = create_tenant(slug="lanes", max_concurrency=100)
    jobs = spread_jobs(tenant, 12)
    for job in jobs:
        queue_for(job)
    failing = min(j.partition_id % 4 for j in jobs)
    assert {j.partition_id % 4 for j in jobs} != {failing}
    claim_in = claims._claim_in

    async def failing_shard(conn, *, in_shard, **kwargs):
        if next(iter(in_shard)) % 4 == failing:
            raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
        return await claim_in(conn, in_shard=in_shard, **kwargs)

    monkeypatch.setattr(claims, "_claim_in", failing_shard)

    async def scenario() -> list[rows.ClaimedRun]:
        conn = await connections.connect_async(database_url())
        lanes = claims.Lanes(connect=lambda: connections.connect_async(database_url()), size=3)
        try:
            return await claims.claim_runs(
                conn, owner="me:1", limit=50, holds=claims.Holds(owner="me:1"), lanes=lanes
            )
        finally:
            await lanes.close()
            await conn.close()

    claimed = asyncio.run(scenario())
    others = {j.id for j in jobs if j.partition_id % 4 != failing}
    assert {run.job_id for run in claimed} == others
    running = JobRun.objects.filter(tenant_id=tenant.id, status="running")
    assert set(running.values_list("job_id", flat=True)) == others
