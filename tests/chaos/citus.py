"""The Citus faults of the chaos driver (`make chaos-citus`): a worker crashed for a
while, a shard moved under load, a worker added and the cluster rebalanced. The
coordinator's restart is the driver's "restart database" on the coordinator.

Each fault returns what it did (nodes, shard, seconds) for the report. The shard
placement of every job is read here too: which jobs a worker outage should stop and
which it should leave alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.support.private_pg import PrivateCitus

# Whatever the table's replica identity, the moves stay online: writes go on during the
# copy and are blocked only for the final switch.
TRANSFER_MODE = "force_logical"


def _rows(sql: str, params: list | None = None) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchall() if cursor.description else []


def placements(partition_ids: set[int]) -> dict[int, str]:
    """partition_id -> 'host:port' of the worker holding its shard of `jobs` now."""
    rows = _rows(
        """
        SELECT p.partition_id, s.nodename || ':' || s.nodeport
          FROM unnest(%s::int[]) AS p(partition_id)
          JOIN citus_shards s
            ON s.table_name = 'jobs'::regclass
           AND s.shardid = get_shard_id_for_distribution_column('jobs', p.partition_id)
        """,
        [sorted(partition_ids)],
    )
    return dict(rows)


def stop_worker(pg: PrivateCitus, *, name: str, seconds: float, wait: Callable[[float], None]) -> dict:
    """`pg_ctl stop -m immediate` one worker, keep it down `seconds`, start it again."""
    started = time.time()
    pg.stop_node(name, immediate=True)
    wait(seconds)
    down_until = time.time()
    pg.start_node(name)
    return {
        "node": name,
        "down from": started,
        "down until": down_until,
        "seconds": round(down_until - started, 1),
    }


def move_shard(partition_ids: set[int], *, source: str, destination: str) -> dict:
    """Move the shard (with its co-located shards) holding most of `partition_ids` from
    `source` to `destination`, online (force_logical), while the load goes on."""
    by_shard: dict[int, int] = {}
    for shard, node in _rows(
        """
        SELECT get_shard_id_for_distribution_column('jobs', p), s.nodename || ':' || s.nodeport
          FROM unnest(%s::int[]) AS p
          JOIN citus_shards s
            ON s.table_name = 'jobs'::regclass
           AND s.shardid = get_shard_id_for_distribution_column('jobs', p)
        """,
        [sorted(partition_ids)],
    ):
        if node == source:
            by_shard[shard] = by_shard.get(shard, 0) + 1
    shard = max(by_shard, key=by_shard.get)
    src_host, src_port = source.rsplit(":", 1)
    dst_host, dst_port = destination.rsplit(":", 1)
    t0 = time.monotonic()
    _rows(
        "SELECT citus_move_shard_placement(%s, %s, %s, %s, %s,"
        " shard_transfer_mode := %s::citus.shard_transfer_mode)",
        [shard, src_host, int(src_port), dst_host, int(dst_port), TRANSFER_MODE],
    )
    return {"shard": shard, "from": source, "to": destination, "seconds": round(time.monotonic() - t0, 1)}


def add_worker_and_rebalance(
    pg: PrivateCitus, *, wait: Callable[[float], None], timeout: float = 900
) -> dict:
    """citus_add_node a new worker, citus_rebalance_start, and wait (the load going on)
    until the background rebalance is finished."""
    t0 = time.monotonic()
    worker = pg.add_worker()
    added = time.monotonic() - t0
    _rows(
        "SELECT citus_rebalance_start(shard_transfer_mode := %s::citus.shard_transfer_mode)", [TRANSFER_MODE]
    )
    state = "?"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = _rows("SELECT state FROM citus_rebalance_status()")
        state = rows[0][0] if rows else "finished"
        if state in ("finished", "failed", "cancelled"):
            break
        wait(2)
    moved = _rows(
        "SELECT count(*) FROM citus_shards"
        " WHERE table_name = 'jobs'::regclass AND nodename || ':' || nodeport = %s",
        [worker],
    )[0][0]
    return {
        "node": worker,
        "add seconds": round(added, 1),
        "rebalance state": state,
        "rebalance seconds": round(time.monotonic() - t0 - added, 1),
        "jobs shards on the new worker": moved,
    }
