"""The executor's node row (executor_nodes): register, heartbeat, leave.

Written on a connection of its own whose application_name is the node id, so the
liveness rule (scheduler_project/liveness.py) sees this executor's session vanish
the moment the process dies. Nothing here touches runs: a failed node heartbeat
only makes the dashboard show the executor as stale, it never affects a claim.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime

import psycopg

from runs.execution import queries

APPNAME_MAX = 63  # NAMEDATALEN - 1: what pg_stat_activity keeps of application_name


async def connect(conninfo: str, *, node_id: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(
        conninfo, autocommit=True, application_name=node_id[:APPNAME_MAX]
    )


async def beat(
    conn: psycopg.AsyncConnection,
    *,
    node_id: str,
    concurrency: int,
    in_flight: int,
    last_claim_at: datetime | None,
    expire_after_seconds: float,
) -> None:
    """Register or refresh this executor's row, and drop rows silent for far longer than a lease."""
    await conn.execute(queries.NODE_EXPIRE, [expire_after_seconds])
    await conn.execute(queries.HOLDS_EXPIRE, [expire_after_seconds])
    await conn.execute(
        queries.NODE_UPSERT,
        {
            "node_id": node_id,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "concurrency": concurrency,
            "in_flight": in_flight,
            "last_claim_at": last_claim_at,
        },
    )


async def leave(conn: psycopg.AsyncConnection, *, node_id: str) -> None:
    await conn.execute(queries.NODE_LEAVE, [node_id])
