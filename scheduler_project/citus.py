"""Citus plumbing: the one "is this database Citus?" test (`citus_installed`, in a sync
and an async form), and the set-up shared by the test database backend and
scripts/citus_cluster.py.

Citus does not propagate CREATE DATABASE: a database exists on the coordinator and on
every worker separately, each with the `citus` extension, and only the coordinator's
copy knows the workers (pg_dist_node lives in the database). `prepare_database` does
all of that for one database name; it is the only place that does.

`Placements` says which worker holds each partition's shards, from the coordinator's
catalog alone: both processes group their batches by worker with it, so that one
worker out of reach fails only its own partitions' statements
(docs/decisions/0073-one-worker-down.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import psycopg
from psycopg import sql

SUPERUSER = "cronyard"


# Run once per connection by the scheduler, outside a transaction
# (docs/decisions/0083-dispatch-keeps-worker-connections.md). The run insert (an INSERT ...
# SELECT, which Citus runs through the coordinator) copies its rows to each shard it
# writes on a connection of that shard's own, and by default a session keeps one
# connection per worker when the transaction ends: every batch opened the others again,
# a backend started on the worker each time, about 6 ms per shard. 32 is Citus's default
# shard count: one connection per shard of a worker, at most.
KEEP_WORKER_CONNECTIONS = "SET citus.max_cached_conns_per_worker = 32"


def keep_worker_connections(cursor) -> None:
    """Let this session keep the worker connections its transactions open (Citus only)."""
    cursor.execute(KEEP_WORKER_CONNECTIONS)


def split_node(node: str) -> tuple[str, int]:
    """'host:port' -> (host, port)."""
    host, _, port = node.rpartition(":")
    return host or "127.0.0.1", int(port)


def parse_workers(value: str) -> list[str]:
    """CRONYARD_CITUS_WORKERS ('host:port,host:port') -> ['host:port', ...]."""
    return [item.strip() for item in value.split(",") if item.strip()]


def _connect(node: str, db: str, user: str) -> psycopg.Connection:
    host, port = split_node(node)
    return psycopg.connect(host=host, port=port, dbname=db, user=user, autocommit=True, connect_timeout=10)


def _create(node: str, db: str, user: str, *, fresh: bool) -> None:
    with _connect(node, "postgres", user) as conn:
        if fresh:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    with _connect(node, db, user) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS citus")


def prepare_database(
    *,
    coordinator: str,
    workers: list[str],
    db: str,
    user: str = SUPERUSER,
    create_on_coordinator: bool = True,
) -> None:
    """Make `db` a Citus database: created with the extension on every node (workers first:
    citus_add_node connects to them), the workers registered in the coordinator's copy.

    Idempotent. `create_on_coordinator=False` when the caller (Django's test database
    creation) has just created the coordinator's copy itself.
    """
    # One preparation at a time per cluster: citus_add_node propagates the roles to the
    # worker, and two at once (pytest-xdist's workers each preparing a test database)
    # fail there with "tuple concurrently updated". An advisory lock in the
    # coordinator's maintenance database serialises them across processes.
    with _connect(coordinator, "postgres", user) as guard:
        guard.execute("SELECT pg_advisory_lock(%s)", [PREPARE_LOCK])
        _prepare(
            coordinator=coordinator,
            workers=workers,
            db=db,
            user=user,
            create_on_coordinator=create_on_coordinator,
        )


# pg_advisory_lock key of prepare_database ("CITU").
PREPARE_LOCK = 0x43495455


def _prepare(
    *, coordinator: str, workers: list[str], db: str, user: str, create_on_coordinator: bool
) -> None:
    for worker in workers:
        _create(worker, db, user, fresh=not create_on_coordinator)
    if create_on_coordinator:
        _create(coordinator, db, user, fresh=False)
    host, port = split_node(coordinator)
    with _connect(coordinator, db, user) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
        conn.execute("SELECT citus_set_coordinator_host(%s, %s)", [host, port])
        for worker in workers:
            w_host, w_port = split_node(worker)
            known = conn.execute(
                "SELECT 1 FROM pg_dist_node WHERE nodename = %s AND nodeport = %s", [w_host, w_port]
            ).fetchone()
            if not known:
                conn.execute("SELECT citus_add_node(%s, %s)", [w_host, w_port])


def drop_database(*, nodes: list[str], db: str, user: str = SUPERUSER) -> None:
    """Drop `db` on every node. WITH (FORCE): Citus's maintenance daemon keeps a session
    open in every database that has the extension, so a plain DROP DATABASE fails."""
    for node in nodes:
        with _connect(node, "postgres", user) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))


# Whether the current database has the citus extension: the one test, asked by both
# processes (the scheduler on Django's connection, the executor on its async ones) and
# by the tests. The migrations carry their own copy: they are history.
INSTALLED_SQL = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"

# The answer per database (host, port, name), asked once per process: it is the
# database's, not a session's (the extension is created when the database is made,
# prepare_database, before any process connects). Not per connection: the scheduler
# may reconnect at every step (CONN_MAX_AGE), and a question per dispatch batch is a
# round trip more for a sparse steady load on Citus, where round trips are its cost.
_ANSWERS: dict[tuple[str, int, str], bool] = {}


def _database(conn) -> tuple[str, int, str]:
    info = conn.info
    return (info.host, info.port, info.dbname)


def citus_installed(cursor) -> bool:
    """True when the database of `cursor` (psycopg's or Django's) has the citus extension."""
    database = _database(cursor.connection)
    if database not in _ANSWERS:
        cursor.execute(INSTALLED_SQL)
        _ANSWERS[database] = bool(cursor.fetchone()[0])
    return _ANSWERS[database]


# The primary workers the coordinator's copy of the database knows.
WORKERS_SQL = "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid > 0 AND noderole = 'primary'"


def workers(cursor) -> list[tuple[str, int]]:
    """(host, port) of each primary worker of the database of `cursor` (a Citus one)."""
    cursor.execute(WORKERS_SQL)
    return [(host, port) for host, port in cursor.fetchall()]


async def citus_installed_async(conn) -> bool:
    """citus_installed for a psycopg AsyncConnection (the executor's)."""
    database = _database(conn)
    if database not in _ANSWERS:
        cursor = await conn.execute(INSTALLED_SQL)
        _ANSWERS[database] = bool((await cursor.fetchone())[0])
    return _ANSWERS[database]


# partition_id -> 'host:port' of the worker holding the partition's shard of `jobs` (its
# co-located tables' shards are on the same worker). Catalog tables only: citus_shards
# asks every worker for shard sizes, and so fails while one is down.
PLACEMENTS_SQL = """
SELECT p.partition_id, n.nodename || ':' || n.nodeport, pl.shardid
FROM unnest(%s::int[]) AS p(partition_id)
JOIN pg_dist_placement pl ON pl.shardid = get_shard_id_for_distribution_column('jobs', p.partition_id)
JOIN pg_dist_node n ON n.groupid = pl.groupid
"""
# How long a read of the placements serves. A shard move changes them; a statement sent
# by a stale map still reaches the right worker (Citus routes it by the catalog), only
# its grouping is off until the next read.
PLACEMENTS_SECONDS = 10.0


class Placements:
    """Which worker holds each partition, read again every PLACEMENTS_SECONDS or when
    forgotten (after a failure, the shard may have moved). Not Citus: every partition is
    on the one server, named ''."""

    def __init__(self) -> None:
        self._nodes: dict[int, str] = {}
        self._shards: dict[int, int] = {}
        self._read_at: float | None = None

    def _stale(self, partitions: Iterable[int]) -> bool:
        return (
            self._read_at is None
            or time.monotonic() - self._read_at >= PLACEMENTS_SECONDS
            or any(p not in self._nodes for p in partitions)
        )

    def _keep(self, rows: list[tuple[int, str, int]]) -> None:
        self._nodes.update((partition, node) for partition, node, _ in rows)
        self._shards.update((partition, shard) for partition, _, shard in rows)
        self._read_at = time.monotonic()

    def shard(self, partition: int) -> int:
        """The shard (of `jobs`, and of its co-located tables) holding `partition`, as of
        the last read; 0 for every partition where there are no shards. Partitions of one
        shard can be named by one statement that Citus still sends to that shard alone."""
        return self._shards.get(partition, 0)

    def forget(self) -> None:
        self._read_at = None

    def read(self, cursor, partitions: list[int]) -> dict[int, str]:
        """{partition_id: 'host:port'} for `partitions`, on a sync cursor (the scheduler's)."""
        if not citus_installed(cursor):
            return dict.fromkeys(partitions, "")
        if self._stale(partitions):
            cursor.execute(PLACEMENTS_SQL, [sorted(set(partitions))])
            self._keep(cursor.fetchall())
        return {p: self._nodes.get(p, "") for p in partitions}

    async def read_async(self, conn, partitions: list[int]) -> dict[int, str]:
        """read() on an AsyncConnection (the executor's)."""
        if not await citus_installed_async(conn):
            return dict.fromkeys(partitions, "")
        if self._stale(partitions):
            cursor = await conn.execute(PLACEMENTS_SQL, [sorted(set(partitions))])
            self._keep(await cursor.fetchall())
        return {p: self._nodes.get(p, "") for p in partitions}


def by_node(nodes: dict[int, str]) -> dict[str, list[int]]:
    """{node: its partitions, ascending} from read()'s answer."""
    out: dict[str, list[int]] = {}
    for partition, node in sorted(nodes.items()):
        out.setdefault(node, []).append(partition)
    return out
