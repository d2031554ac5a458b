"""Partition leases of the scheduler: PostgreSQL advisory locks on a dedicated session.

Its statements (advisory locks and pg_locks / pg_stat_activity reads, which have no ORM
form, and the node row) are named in jobs/dispatch/queries.py; they run here, on the
lease session. A lease says which partitions a node *should* dispatch; what keeps a slot
from firing twice is the dispatch transaction (jobs/dispatch/fencing.py explains why).

How a lease works
-----------------
* Every scheduler opens ONE psycopg connection of its own (not Django's), sets
  ``idle_session_timeout = SCHEDULER_LEASE_SECONDS`` and ``application_name =
  node_id`` on it, and takes ``pg_try_advisory_lock(NAMESPACE, partition)`` for its
  share of the partitions there. A thread heartbeats every lease/3. When the
  process stalls (SIGSTOP, GC pause, network partition) the heartbeat stops, the
  server ends the idle session after one lease and the locks vanish with it: the
  lease expires without any clock on the stalled node having to agree.
* Liveness of a node (scheduler_project/liveness.py, one rule for every reader) =
  its heartbeat row is fresh (< 2 leases) AND its lease session still exists
  (``pg_stat_activity.application_name``). The second half makes a SIGKILLed
  node drop out at once (the kernel closes its socket) instead of after two
  leases, so its orphaned partitions are picked up within a tick.
* Fair share: live node ids sorted, node i gets ``N // n + (1 if i < N % n else 0)``;
  the shares sum to N. Each tick a node releases what it holds above its share and
  tries to lock free partitions up to its share. A node prefers its "home"
  partitions (``p % n == i``) so that steady state is deterministic and newcomers
  find free partitions quickly; any free partition will do to cover orphans.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg

from jobs.dispatch import queries
from scheduler_project import liveness
from scheduler_project.outage import OutageLog

log = logging.getLogger(__name__)

# Key 1 of every two-int advisory lock the scheduler takes ("CRON" in ASCII).
NAMESPACE = 0x43524F4E

_APPNAME_MAX = 63  # NAMEDATALEN - 1


def fair_share(node_ids: Sequence[str], me: str, partitions: int) -> int:
    """How many partitions `me` should hold; over all live nodes the shares sum to `partitions`."""
    ids = sorted(set(node_ids) | {me})
    n = len(ids)
    i = ids.index(me)
    return partitions // n + (1 if i < partitions % n else 0)


def home_partitions(node_ids: Sequence[str], me: str, partitions: int) -> list[int]:
    ids = sorted(set(node_ids) | {me})
    n, i = len(ids), ids.index(me)
    return [p for p in range(partitions) if p % n == i]


def plan_rebalance(
    *, held: set[int], share: int, home: list[int], partitions: int
) -> tuple[list[int], list[int]]:
    """(to_release, candidates_to_try): release the surplus, non-home and highest first."""
    if len(held) > share:
        home_set = set(home)
        order = sorted(held, key=lambda p: (p in home_set, -p))
        return order[: len(held) - share], []
    if len(held) < share:
        home_free = [p for p in home if p not in held]
        others = [p for p in range(partitions) if p not in held and p not in set(home_free)]
        return [], home_free + others
    return [], []


@dataclass(frozen=True)
class LeaseSnapshot:
    """What the dispatch loop may rely on, swapped atomically by the heartbeat thread."""

    session_pid: int | None
    owned: frozenset[int]
    ok_at: float  # time.monotonic() of the last successful heartbeat
    generation: int  # bumped on every new lease session

    def usable(self, *, now: float, lease_seconds: float) -> bool:
        # 2/3 of a lease: the server ends a silent session after one lease, so a
        # snapshot older than this may describe locks that are already gone.
        return bool(self.owned) and self.session_pid is not None and now - self.ok_at < lease_seconds * 2 / 3


@dataclass
class LeaseManager:
    """Owns the dedicated lease connection, the heartbeat thread and the node row."""

    conninfo: str
    node_id: str
    hostname: str
    pid: int
    partitions: int
    lease_seconds: float
    namespace: int = NAMESPACE
    _conn: psycopg.Connection | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    snapshot: LeaseSnapshot = field(
        default_factory=lambda: LeaseSnapshot(None, frozenset(), 0.0, 0), init=False
    )
    live_nodes: tuple[str, ...] = field(default=(), init=False)
    # Shared with the dispatch loop: one "away" and one "back" line per outage.
    outage: OutageLog = field(default_factory=lambda: OutageLog(name="scheduler"))

    @property
    def tick_seconds(self) -> float:
        return self.lease_seconds / 3

    # -- lifecycle -------------------------------------------------------------

    def start(self, *, thread: bool = True) -> None:
        """Connect, register and take a first share now if the database answers; then heartbeat."""
        with self._lock:
            # Errors are reported, not raised: a scheduler (re)started while the
            # database is down keeps retrying at every tick, like a running one.
            self._beat()
        if thread:
            self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Unlock everything and remove the node row so others take over at their next tick."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lease_seconds)
        with self._lock:
            conn, self._conn = self._conn, None
            self.snapshot = LeaseSnapshot(None, frozenset(), 0.0, self.snapshot.generation)
            if conn is None:
                return
            try:
                conn.execute(queries.UNLOCK_ALL)
                conn.execute(queries.NODE_LEAVE, [self.node_id])
            except psycopg.Error as exc:  # the server ends the session anyway; nothing to undo
                log.warning("lease release failed (%s); the session end releases the locks", exc)
            finally:
                conn.close()
        log.info("lease released node=%s", self.node_id)

    def tick_now(self) -> None:
        """One heartbeat + rebalance now, as the thread would do it (tests)."""
        with self._lock:
            self._beat()

    def _beat(self) -> None:
        try:
            if self._conn is None:
                self._connect()
            self._tick()
        except psycopg.Error as exc:
            self.outage.failed(exc)
            self._lost(exc)
            return
        except Exception as exc:
            # A bug here must not kill the thread silently: the lease would look
            # stale forever and the node would never dispatch again.
            log.exception("lease heartbeat failed")
            self._lost(exc)
            return
        self.outage.ok()

    # -- internals ---------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.tick_seconds):
            with self._lock:
                if self._stop.is_set():
                    return
                self._beat()

    def _lost(self, exc: Exception) -> None:
        old = self.snapshot
        self.snapshot = LeaseSnapshot(None, frozenset(), 0.0, old.generation)
        # Without a session there was nothing to lose: a reconnect attempt failed,
        # and the OutageLog reports that once per outage, not once per tick.
        if old.session_pid is not None:
            log.warning(
                "lease lost node=%s session_pid=%s partitions=%d: %s; reconnecting",
                self.node_id,
                old.session_pid,
                len(old.owned),
                str(exc).strip().splitlines()[0] if str(exc) else exc,
            )
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None

    def _connect(self) -> None:
        lease_ms = int(self.lease_seconds * 1000)
        conn = psycopg.connect(
            self.conninfo,
            autocommit=True,
            application_name=self.node_id[:_APPNAME_MAX],
            connect_timeout=max(2, int(self.lease_seconds)),
            # A peer that vanished from the network is noticed client-side within
            # about a lease instead of the kernel's default two hours.
            keepalives=1,
            keepalives_idle=max(1, int(self.lease_seconds / 3)),
            keepalives_interval=1,
            keepalives_count=3,
            tcp_user_timeout=lease_ms,
        )
        conn.execute(queries.LEASE_IDLE_TIMEOUT.format(ms=lease_ms))
        conn.execute(queries.LEASE_STATEMENT_TIMEOUT.format(ms=lease_ms))
        pid = conn.execute(queries.SESSION_PID).fetchone()[0]
        self._conn = conn
        generation = self.snapshot.generation + 1
        self.snapshot = LeaseSnapshot(pid, frozenset(), 0.0, generation)
        log.info("lease session started node=%s session_pid=%s generation=%d", self.node_id, pid, generation)

    def _tick(self) -> None:
        """Heartbeat, expire dead nodes, rebalance. Runs with self._lock held."""
        conn = self._conn
        assert conn is not None
        session_pid = self.snapshot.session_pid
        held = {row[0] for row in conn.execute(queries.HELD_HERE, {"ns": self.namespace})}
        # Long-dead rows only; a stalled node's row lingers a little so its return is cheap.
        conn.execute(queries.NODE_EXPIRE, [self.lease_seconds * 5])
        conn.execute(
            queries.NODE_UPSERT,
            {
                "node_id": self.node_id,
                "hostname": self.hostname,
                "pid": self.pid,
                "partitions": json.dumps(sorted(held)),
            },
        )
        live = [
            row[0] for row in conn.execute(queries.LIVE_NODES, [liveness.window_seconds(self.lease_seconds)])
        ]
        share = fair_share(live, self.node_id, self.partitions)
        home = home_partitions(live, self.node_id, self.partitions)
        release, candidates = plan_rebalance(held=held, share=share, home=home, partitions=self.partitions)
        if release:
            # Drop them from the snapshot first: the dispatch loop must stop using a
            # partition before another node can lock it.
            self.snapshot = LeaseSnapshot(
                session_pid, frozenset(held - set(release)), self.snapshot.ok_at, self.snapshot.generation
            )
            conn.execute(queries.UNLOCK, [self.namespace, release])
            held -= set(release)
        if candidates:
            got = [
                row[0]
                for row in conn.execute(
                    queries.ACQUIRE,
                    {"ns": self.namespace, "candidates": candidates, "need": share - len(held)},
                )
            ]
            held |= set(got)
        if release or candidates:
            conn.execute(queries.NODE_PARTITIONS, [json.dumps(sorted(held)), self.node_id])
        old = self.snapshot
        self.live_nodes = tuple(live)
        self.snapshot = LeaseSnapshot(session_pid, frozenset(held), time.monotonic(), old.generation)
        if set(old.owned) != held:
            log.info(
                "partitions node=%s session_pid=%s owned=%d share=%d live_nodes=%d",
                self.node_id,
                session_pid,
                len(held),
                share,
                len(live),
            )
