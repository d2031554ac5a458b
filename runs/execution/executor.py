"""The executor process: one class whose steps do the work and whose drivers decide
when each step runs.

One asyncio event loop (uvloop) per process. HTTP calls share one aiohttp session;
sync tasks run on threads of their own (an overrunning one is abandoned). The steps
(claim, reap, write outcomes, heartbeat, node heartbeat) do the work and are tested
in-process; the drivers only decide when each runs, recover from connection failures,
and shut down:

- the claim loop claims; it repeats at once after a full batch and otherwise waits for
  a NOTIFY, a freed slot or `poll_seconds`;
- the writer writes outcomes as calls finish;
- the heartbeat extends leases every lease/3;
- the reaper hands back expired leases, one executor's read per REAP_EVERY_SECONDS
  across all of them (runs/execution/turns.py), and
  analyzes tables whose planner statistics are out of date
  (runs/execution/table_statistics.py), and on Citus moves the successes this executor
  wrote to run_history and, in turn, those no executor will move
  (runs/execution/history_moves.py);
- the node heartbeat refreshes this process's executor_nodes row every node_lease/3.

They are separate tasks, not one sequential loop, because each has its own connection
and none may wait behind another: a heartbeat stuck behind a slow write would let a
lease lapse and the run be executed twice (docs/decisions/0031-executor-process.md),
and a reaper behind a claim that waits for a stalled executor's tenant lock would leave
that executor's runs unreaped for as long as it stalls.

SIGTERM/SIGINT (scheduler_project.loop.on_stop_signal, the scheduler's rule): stop
claiming, let in-flight runs finish within `grace_seconds`, hand back the rest under
their attempt's fence, exit 0; a second signal exits at once.

The steps: `claim_once`, `reap_once`, `write_outcomes_once`, `move_history_once`,
`heartbeat_once` and `node_beat_once` are what `Scheduler.step()` is for the scheduler:
tests await them in-process against the real database (tests/test_executor_steps.py),
and the drivers below run them. A
step raises `psycopg.Error` when its connection fails; the driver logs the outage and
reconnects (`reconnect`), so a test sees the real error.

The database is reached through psycopg AsyncConnections with the raw SQL of
runs/execution (claims.py, outcomes.py, run_leases.py, breakers.py, nodes.py), never
the ORM, each with its own job:
- claim connection: short claim transactions (never open during a call) and
  circuit-breaker admission;
- write connection: outcomes of finished attempts, batched into one UPDATE;
- heartbeat connection: one UPDATE extending every in-flight lease;
- reap connection: handing back other executors' expired leases;
- node connection: the executor_nodes row, named after the owner so a dead process
  drops out at once (runs/execution/nodes.py).

Every outcome write is `WHERE attempt = <mine> AND status = 'running'`: a run this
process no longer holds (reclaimed after a stall, or cancelled) writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TypeVar

import psycopg

from runs import alerts, counters, open_floors, per_partition, rows, tasks
from runs.attempts import HANDED_BACK
from runs.execution import (
    breakers,
    claims,
    connections,
    fair_share,
    history_moves,
    inflight,
    nodes,
    outcomes,
    retry,
    run_leases,
    table_statistics,
    targets,
    turns,
)
from runs.execution.call_slots import Slots
from runs.execution.connections import RECONNECT_DELAY_SECONDS, close_quietly
from runs.execution.inflight import Beat, Claimed, Counters, InFlight, RunKey, Written
from runs.keys import parse_rfc3339, run_key
from scheduler_project import liveness
from scheduler_project.citus import citus_installed_async
from scheduler_project.loop import STOP_SIGNALS, on_stop_signal
from scheduler_project.outage import OutageLog

log = logging.getLogger(__name__)

__all__ = ["Executor"]

T = TypeVar("T")

# The reaper's turn (runs/execution/turns.py): one executor's read of expired leases per
# REAP_EVERY_SECONDS across all of them. Each executor asks every REAP_EVERY_SECONDS,
# one single-row coordinator statement; the read itself visits every shard on Citus, so
# N executors each reading would cost N times the cluster's time for the same runs.
REAP_EVERY_SECONDS = 1.0
# The share of its time one executor's reaper may spend reading: it waits at least
# REAP_EVERY_SECONDS between asks, longer after a slow read. The read looks for expired
# leases in every partition, and in every day a running run may be of (on Citus from the
# lowest open floor on, runs/open_floors.py: with a month's day partitions and no such
# bound, a read cost ~250 ms of the cluster's time).
REAP_SHARE = 0.1
HEARTBEAT_TICK_SECONDS = 0.25
# How often an executor asks whether it is its turn to run the open floor upkeep
# (runs/execution/turns.py: one coordinator statement; the upkeep itself runs once
# per open_floors.UPKEEP_SECONDS across every executor).
FLOOR_TURN_SECONDS = 30.0
WRITE_BATCH = 500
# Runs one claim may take at most (the claimed-ahead queue is bounded in time as well:
# runs/execution/call_slots.py). On plain PostgreSQL the claim and outcome statements
# run from cached generic plans, and a bigger batch only lengthens the claim's rank.
# On Citus each statement is planned twice, on the coordinator and on its shard's
# worker (runs/execution/connections.py, plan_cache_mode): milliseconds of CPU on each
# whatever its size, so there the batch is what spreads that cost over more runs (with
# 300, about two thirds of the commits per run of 100; docs/decisions/0080).
CLAIM_BATCH = 100
CITUS_CLAIM_BATCH = 300
# Outcomes for a Citus worker out of reach wait this long between tries (newer outcomes
# are written meanwhile).
UNREACHABLE_RETRY_SECONDS = 1.0


@dataclass
class Executor:
    concurrency: int = 32
    poll_seconds: float = 1.0
    grace_seconds: float = 10.0
    allow_private: bool = False
    alert_destination: alerts.Destination = field(default_factory=alerts.Destination)
    task_modules: Iterable[str] = ()
    claim_batch: int | None = None  # None: CLAIM_BATCH or CITUS_CLAIM_BATCH, from the database
    # The node heartbeat follows the schedulers' lease so one liveness rule fits both.
    node_lease_seconds: float = 30.0
    aging_seconds: float = claims.DEFAULT_AGING_SECONDS
    breaker_policy: breakers.Policy = field(default_factory=breakers.Policy)
    conninfo: str | None = None
    # The executor node id and every lease it takes: one id builder for all nodes.
    owner: str = field(default_factory=liveness.make_node_id)
    rng: random.Random = field(default_factory=random.Random)
    counters: Counters = field(default_factory=Counters)

    def __post_init__(self) -> None:
        self._inflight: dict[RunKey, InFlight] = {}
        # Calls running, and runs of _inflight claimed ahead of them (runs/execution/call_slots.py).
        self._slots = Slots(concurrency=self.concurrency, claim_batch=self.claim_batch or CLAIM_BATCH)
        self.open_from = fair_share.OpenFrom()  # the claim's lower bound on scheduled_at
        self.planner = fair_share.Planner()  # the claims' fair-share plan, reused while they come back full
        # On Citus, this executor's runs per tenant as the others' claims count them.
        self.holds = claims.Holds(owner=self.owner)
        # On Citus, the connections a claim's shards are claimed on side by side.
        self.lanes = claims.Lanes(
            connect=lambda: connections.connect_async(self.conninfo), size=claims.CLAIM_LANES
        )
        self._results: list[tuple[InFlight, rows.Completion]] = []
        # On Citus, the successes written in place and not yet moved to run_history.
        self.moves = history_moves.Pending()
        self._citus = False
        # Alerts are sent by tasks of this loop (runs/alerts.py): a slow webhook holds no step.
        # The process's Prometheus counters (runs/counters.py), flushed with the node heartbeat.
        self.tally = counters.Tally(self.owner)
        self._counted = Counters()  # self.counters as of the last handover to the tally
        self.alert_sender = alerts.WebhookSender(
            self.alert_destination, tenant_slugs=alerts.TenantSlugs(self._conninfo()), tally=self.tally
        )
        # All connections report here: one "away" and one "back" line per outage.
        self._outage = OutageLog(name="executor")
        self._last_claim_at: datetime | None = None
        # Outcomes for a Citus worker out of reach are written again from this time.
        self._retry_writes_at = 0.0
        self._next_beat = float("inf")  # monotonic time the in-flight leases need extending
        self._floors_turn = turns.Asking(
            turns.OPEN_FLOORS, seconds=open_floors.UPKEEP_SECONDS, every=FLOOR_TURN_SECONDS
        )
        self._sweep_turn = turns.Asking(  # Citus
            turns.HISTORY_SWEEP,
            seconds=history_moves.SWEEP_EVERY_SECONDS,
            every=history_moves.SWEEP_EVERY_SECONDS,
        )
        self._signals = False
        # Whether the last claim found nothing, and whether runs were announced since:
        # the plan about to be made for them must not come from statistics that call
        # their partition empty (runs/execution/table_statistics.py).
        self._came_back_empty = False
        self._statistics_suspect = False

    # --- opening and closing -----------------------------------------------------------

    async def open(self) -> None:
        """Connect (waiting for the database if it is down), register the node, load tasks."""
        self._wake = asyncio.Event()
        self._results_ready = asyncio.Event()
        # When the claim and write connections' statements are planned afresh.
        self._replanning = {"claim": connections.Replanning(), "write": connections.Replanning()}
        tasks.load_modules(self.task_modules)
        # A process (re)started while the database is down waits for it, like one
        # that was already running, instead of exiting.
        self._claim_conn = await self._connect(wait_first=False)
        self._write_conn = await self._connect(wait_first=False)
        self._beat_conn = await self._connect(wait_first=False)
        self._reap_conn = await self._connect(wait_first=False)
        self._node_conn = await nodes.connect(self._conninfo(), node_id=self.owner)
        self._citus = await citus_installed_async(self._claim_conn)
        if self.claim_batch is None:
            self.claim_batch = CITUS_CLAIM_BATCH if self._citus else CLAIM_BATCH
        self._slots.claim_batch = self.claim_batch
        await self.node_beat_once()  # registered before the first claim
        self._session = targets.make_session(concurrency=self.concurrency, allow_private=self.allow_private)

    async def close(self) -> None:
        """Abandon calls still running (their leases expire), leave, disconnect."""
        for entry in self._inflight.values():
            if entry.task is not None:
                entry.task.cancel()
        await asyncio.gather(*(e.task for e in self._inflight.values() if e.task), return_exceptions=True)
        await self.alert_sender.close(timeout=min(self.grace_seconds, 5.0))
        await self._session.close()
        try:
            await self.flush_counters()
        except psycopg.Error:
            pass  # what this process counted since its last beat is lost (runs/counters.py)
        try:
            await nodes.leave(self._node_conn, node_id=self.owner)
        except psycopg.Error:
            pass  # the row expires; the closed session already marks it dead
        for conn in (self._claim_conn, self._write_conn, self._beat_conn, self._reap_conn, self._node_conn):
            await connections.close_quietly(conn)
        await self.lanes.close()

    def in_flight(self) -> list[InFlight]:
        return list(self._inflight.values())

    # --- the steps -----------------------------------------------------------------------

    async def reap_once(self) -> list[rows.ReapedRun]:
        """Hand back runs whose owner (any executor) stopped heartbeating. Does not wait
        for a free slot: an orphan counts against its tenant's cap until it is reaped."""
        reaped = await run_leases.reap_expired_leases(self._reap_conn)
        for run in reaped:
            self.counters.lease_expiries += 1
            log.warning(
                "lease expired: attempt %d of %s (owner %s) -> %s",
                run.attempt,
                run_key(run.job_id, run.scheduled_at),
                run.owner,
                run.status,
            )
            if run.status == "dead":
                self.counters.dead += 1
                self.alert_sender.send(alerts.Alert.run_dead(run, result_code=None, error=run.last_error))
        return reaped

    async def reap_in_turn(self) -> list[rows.ReapedRun]:
        """`reap_once` if this executor takes the reaper's turn (REAP_EVERY_SECONDS), else
        nothing. A read that reaches run_leases.REAP_LIMIT is followed by another at once:
        after a crash of many executors, one turn hands back all of their runs."""
        if not await turns.take(self._reap_conn, task=turns.REAPER, seconds=REAP_EVERY_SECONDS):
            return []
        reaped = batch = await self.reap_once()
        while len(batch) >= run_leases.REAP_LIMIT:
            batch = await self.reap_once()
            reaped += batch
        return reaped

    async def keep_floors_once(self) -> bool:
        """When this executor takes the turn (asked every FLOOR_TURN_SECONDS; one
        executor's turn per open_floors.UPKEEP_SECONDS): set the tenants' open floors to
        their oldest open runs (runs/open_floors.py), which the claims on Citus read
        running runs from and the dispatch insert's overlap read its days from. Whether
        it ran."""
        if not await self._floors_turn.take(self._reap_conn):
            return False
        changed = await open_floors.keep(self._reap_conn)
        log.debug("open floors: %d changed", changed)
        return True

    async def claim_once(self) -> Claimed:
        """Claim what the free slots allow, admit it past the breakers, start its calls."""
        limit = min(self._slots.claimable(in_flight=len(self._inflight)), self._slots.claim_batch)
        if limit <= 0:
            # Citus: give back what finished, keep holding what is in flight.
            await self.holds.release(self._claim_conn, self.holds.excess(self._held()))
            await self.holds.refresh(self._claim_conn)
            return Claimed(limit, [], [])
        await self._replanning["claim"].before(self._claim_conn)
        claimed = await claims.claim_runs(
            self._claim_conn,
            owner=self.owner,
            limit=limit,
            aging_seconds=self.aging_seconds,
            open_from=await self.open_from.get(self._claim_conn),
            planner=self.planner,
            holds=self.holds,
            mine=self._held(),
            outage=self._outage,
            lanes=self.lanes,
        )
        self._replanning["claim"].after(empty=not claimed)
        if not claimed:
            self.open_from.forget()  # the bound may have left out a run queued since
        started = await self._admit(claimed)
        for run in started:
            self._start(run)
        if claimed:
            self._last_claim_at = max(run.started_at for run in claimed)
        return Claimed(limit, claimed, started)

    def _held(self) -> dict[int, int]:
        """Runs in flight per tenant (claimed and not yet finished, called or not)."""
        held: dict[int, int] = {}
        for entry in self._inflight.values():
            held[entry.run.tenant_id] = held.get(entry.run.tenant_id, 0) + 1
        return held

    async def write_outcomes_once(self) -> Written:
        """Write one batch of finished attempts' outcomes, each fenced by its attempt."""
        if not self._results:
            return Written()
        try:
            await self._replanning["write"].before(self._write_conn)
        except psycopg.Error:
            pass  # the write below finds out
        batch = self._results[:WRITE_BATCH]
        del self._results[:WRITE_BATCH]
        for entry, _ in batch:
            entry.writing = True
        now = datetime.now(UTC)
        try:
            written = await outcomes.complete_runs(self._write_conn, [c for _, c in batch], now=now)
        except outcomes.PartlyWritten as exc:
            # Citus, a worker out of reach: what reached the others is done; the rest is
            # written again after a pause, behind newer outcomes (which may be on healthy
            # workers), and the outage log has the worker.
            self._outage.failed(exc.cause)
            waiting = {id(c) for c in exc.items}
            parked = [(e, c) for e, c in batch if id(c) in waiting]
            for entry, _ in parked:
                entry.writing = False
            self._results += parked
            batch = [(e, c) for e, c in batch if id(c) not in waiting]
            written = exc.written
            self._retry_writes_at = time.monotonic() + UNREACHABLE_RETRY_SECONDS
        except psycopg.DataError as exc:
            # The database refuses the data itself: retrying the same batch would
            # fail forever and stop this executor recording anything.
            written = await self._write_one_by_one(batch, exc, now=now)
        except psycopg.Error:
            self._results[:0] = batch  # written after the reconnect
            raise
        self._written(batch, written, finished_at=now)
        await self._record_hosts(batch)
        return Written(written=len(written), fenced=len(batch) - len(written))

    async def move_history_once(self, conn: psycopg.AsyncConnection | None = None) -> int:
        """Citus: move the oldest successes this executor wrote in place to run_history
        (runs/execution/history_moves.py), on `conn` (default: the reaper's); returns how
        many moved. Keys whose move did not happen (a worker out of reach, an error, a
        cancel) are pending again."""
        keys = self.moves.take()
        if not keys:
            return 0
        failed = keys
        try:
            moved = await history_moves.move(conn or self._reap_conn, keys)
            failed = []
            return moved
        except per_partition.WorkerUnreachable as exc:
            self._outage.failed(exc.cause)
            failed = exc.items
            return len(exc.rows)
        finally:
            self.moves.put_back(failed)

    async def sweep_history_once(self) -> int:
        """Citus, when this executor takes the turn (asked every
        history_moves.SWEEP_EVERY_SECONDS; one executor's turn per that interval): move
        successes left in job_runs that no executor will move (history_moves.sweep).
        How many moved."""
        if not self._citus or not await self._sweep_turn.take(self._reap_conn):
            return 0
        swept = await history_moves.sweep(self._reap_conn)
        if swept.unreachable is not None:
            self._outage.failed(swept.unreachable)
        return swept.moved

    async def heartbeat_once(self) -> Beat:
        """Extend every in-flight lease; drop (cancel, write nothing) runs no longer ours."""
        # Runs whose outcome is waiting to be written keep their lease too: a slow
        # write (a failover, a reconnect) must not let the run be reclaimed and
        # executed again after the call already happened. The write decides them.
        keys = list(self._inflight)
        held = await run_leases.heartbeat_runs(
            self._beat_conn, [(self._inflight[key].run.partition_id, key) for key in keys]
        )
        lost = []
        for key in keys:
            entry = self._inflight.get(key)
            if key in held or entry is None or entry.writing or entry.lost:
                continue
            entry.lost = True
            if entry.task is not None:
                entry.task.cancel()
            del self._inflight[key]
            self._fenced(entry)
            lost.append(key)
            self._wake.set()
        return Beat(held=len(held), lost=tuple(lost))

    async def node_beat_once(self) -> int:
        """Refresh this executor's node row; returns the in-flight count it reported."""
        await nodes.beat(
            self._node_conn,
            node_id=self.owner,
            concurrency=self.concurrency,
            in_flight=len(self._inflight),
            last_claim_at=self._last_claim_at,
            expire_after_seconds=5 * self.node_lease_seconds,
        )
        await self.flush_counters()
        return len(self._inflight)

    async def flush_counters(self) -> None:
        """Hand what self.counters gained since the last flush to the tally, and write it."""
        now = self.counters
        for spec, gained, label in now.gained_since(self._counted):
            self.tally.add(spec, gained, label=label)
        self._counted = replace(now)
        await self.tally.flush_async(self._node_conn)

    async def put_back_unsent(self) -> int:
        """Shutting down: put the runs claimed ahead, never called, back as they were
        claimed. Unlike a hand-back they have not used their attempt (a last attempt must
        not die unsent). Returns how many were put back."""
        unsent = self._slots.take_unsent(self._inflight)
        runs = [(e.run.partition_id, e.key) for e in unsent]
        count = await breakers.put_back(self._write_conn, runs, reason="unsent: the executor shut down")
        if count:
            log.info("put back %d claimed run(s) that were never sent", count)
        return count

    # --- claiming and calling ----------------------------------------------------------

    async def _admit(self, claimed: list[rows.ClaimedRun]) -> list[rows.ClaimedRun]:
        """The claimed runs that may be sent now; runs/execution/breakers.py defers the others
        (their host's circuit is open, or their retry is over its host's budget)."""
        candidates = inflight.breaker_candidates(claimed)
        if not candidates:
            return claimed
        try:
            admission = await breakers.admit(self._claim_conn, candidates, policy=self.breaker_policy)
        except psycopg.Error as exc:
            # The runs are claimed: sending them beats letting their leases expire (which
            # would use an attempt each). The next claim finds the connection broken.
            log.warning("circuit breaker check failed (%s); sending %d run(s) unchecked", exc, len(claimed))
            return claimed
        deferred = {d.key for d in admission.defer}
        self.counters.deferred += len(deferred)
        return [run for run in claimed if (run.job_id, run.scheduled_at, run.attempt) not in deferred]

    def _start(self, run: rows.ClaimedRun) -> None:
        """Call an admitted run now, or queue it for the next free slot (claimed ahead)."""
        self.counters.claimed += 1
        entry = InFlight.start(run)
        self._inflight[entry.key] = entry
        self._next_beat = min(self._next_beat, time.monotonic() + run.lease_seconds / 3)
        if self._slots.free():
            self._call(entry)
        else:
            self._slots.ready.append(entry)

    def _call(self, entry: InFlight) -> None:
        # The attempt starts with its call (its history entry's started_at and duration).
        entry.started_monotonic, entry.started_wall = time.monotonic(), datetime.now(UTC)
        self._slots.called()
        entry.task = asyncio.create_task(self._execute(entry))
        entry.task.add_done_callback(lambda _task: self._call_done(entry))

    def _call_done(self, entry: InFlight) -> None:
        self._slots.returned(time.monotonic() - entry.started_monotonic)
        for waiting in self._slots.next_calls(self._inflight):
            self._call(waiting)
        # A slot (or queue room) is free: claim again without waiting for the write.
        if self._slots.wants_claim():
            self._wake.set()

    async def _execute(self, entry: InFlight) -> None:
        run = entry.run
        try:
            result = await targets.call(run, session=self._session, allow_private=self.allow_private)
        except asyncio.CancelledError:
            return  # whoever cancelled it owns the run's fate (fenced / handed back)
        except Exception as exc:  # a bug in our own code must not kill the loop
            log.exception("calling %s failed unexpectedly", entry.run_key)
            result = retry.CallResult(retry.RETRY, error=retry.truncate(f"{type(exc).__name__}: {exc}"))
        if entry.host is not None:
            entry.host_outcome = inflight.host_outcome(result)
        if entry.lost:
            return
        if result.missing_task:
            self.alert_sender.send(
                alerts.Alert.task_missing(run, task=result.missing_task, executor=self.owner)
            )
        decision = retry.decide(
            result,
            attempt=run.attempts_used,
            max_attempts=run.max_attempts,
            base=run.retry_backoff_seconds,
            cap=run.retry_backoff_cap_seconds,
            rng=self.rng,
        )
        completion = inflight.completion(
            entry,
            owner=self.owner,
            status=decision.status,
            outcome=decision.outcome,
            result=result,
            retry_in_s=decision.retry_in_s,
        )
        self._results.append((entry, completion))
        self._results_ready.set()

    # --- after a write -----------------------------------------------------------------

    async def _record_hosts(self, batch: list[tuple[InFlight, rows.Completion]]) -> None:
        """Feed the answers of HTTP calls (fenced or not: the host did answer) to the breakers."""
        outcomes = [(e.breaker, e.host_outcome) for e, _ in batch if e.breaker and e.host_outcome]
        if not outcomes:
            return
        try:
            await breakers.record(self._write_conn, outcomes, policy=self.breaker_policy)
        except psycopg.Error as exc:
            # Breaker state only spares a sick host; the outcomes themselves are written.
            log.warning("recording %d host outcome(s) failed (%s)", len(outcomes), exc)
            self._write_conn = await self.reconnect(self._write_conn)

    async def _write_one_by_one(
        self, batch: list[tuple[InFlight, rows.Completion]], error: psycopg.DataError, *, now: datetime
    ) -> set[RunKey]:
        """Write each outcome alone; one the database still refuses is stored without
        its error text and response details, which are what it could not take."""
        log.warning("writing %d outcome(s) was refused (%s); writing them one by one", len(batch), error)
        written: set[RunKey] = set()
        await self._write_conn.rollback()
        for _, completion in batch:
            for attempt in (completion, inflight.scrubbed(completion, error)):
                try:
                    written |= await outcomes.complete_runs(self._write_conn, [attempt], now=now)
                    break
                except psycopg.DataError as exc:
                    await self._write_conn.rollback()
                    log.error("outcome of %s refused by the database: %s", completion.job_id, exc)
        return written

    def _written(
        self,
        batch: list[tuple[InFlight, rows.Completion]],
        written: set[RunKey],
        *,
        finished_at: datetime,
    ) -> None:
        loop = asyncio.get_running_loop()
        for entry, completion in batch:
            self._inflight.pop(entry.key, None)
            if entry.key not in written:
                self._fenced(entry)
                continue
            handed_back = completion.entry.outcome == HANDED_BACK
            self.counters.handed_back += int(handed_back)
            if completion.status == "succeeded":
                self.counters.succeeded += 1
                if self._citus:  # written in place: moved to run_history later
                    self.moves.note([(entry.run.partition_id, completion.job_id, completion.scheduled_at)])
                # The run's finished_at: its tenant's newest success (/metrics).
                self.tally.succeeded(entry.run.tenant_id, finished_at)
            elif completion.status == "retrying" and not handed_back:
                self.counters.retried += 1
                # Retry our own backoff promptly instead of at the next poll.
                loop.call_later((completion.retry_in_s or 0) + 0.01, self._wake.set)
            elif completion.status == "dead":
                self.counters.dead += 1
                run = entry.run
                self.alert_sender.send(
                    alerts.Alert.run_dead(run, result_code=completion.result_code, error=completion.error)
                )
        self._wake.set()

    def _fenced(self, entry: InFlight) -> None:
        self.counters.fenced += 1
        log.warning(
            "fenced: attempt %d of %s is no longer ours (lease lost or run cancelled); wrote nothing",
            entry.run.attempt,
            entry.run_key,
        )

    # --- connections -------------------------------------------------------------------

    def _conninfo(self) -> str:
        return self.conninfo or connections.database_conninfo()

    async def reconnect(self, conn):
        """A new connection in place of a failed one (after RECONNECT_DELAY_SECONDS)."""
        await connections.close_quietly(conn)
        return await self._connect(wait_first=True)

    async def _connect(self, *, wait_first: bool):
        return await connections.connect_until_up(self.conninfo, outage=self._outage, wait_first=wait_first)

    @classmethod
    def from_settings(cls, **overrides) -> Executor:
        from django.conf import settings

        options = {
            "poll_seconds": settings.EXECUTOR_POLL_SECONDS,
            "allow_private": settings.SCHEDULER_ALLOW_PRIVATE_TARGETS,
            "alert_destination": alerts.Destination.from_settings(),
            "task_modules": tuple(settings.EXECUTOR_TASK_MODULES),
            "conninfo": connections.database_conninfo(),
            "node_lease_seconds": float(settings.SCHEDULER_LEASE_SECONDS),
            "aging_seconds": settings.EXECUTOR_PRIORITY_AGING_SECONDS,
            "breaker_policy": breakers.Policy.from_settings(),
        }
        options.update(overrides)
        return cls(**options)

    # --- lifecycle -----------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: stop claiming, finish or hand back in-flight runs, exit 0."""
        self._signals = True

    def run(self, *, once: bool = False) -> None:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self.main(once=once))

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def _on_first_signal(self, name: str) -> None:
        log.info(
            "%s: no more claims; %d run(s) in flight get %.1fs to finish, then are handed back",
            name,
            len(self._inflight),
            self.grace_seconds,
        )
        self.stop()

    async def main(self, *, once: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._flushed = asyncio.Event()
        if self._signals:
            for signum in STOP_SIGNALS:
                loop.add_signal_handler(
                    signum,
                    lambda s=signum: on_stop_signal(
                        s, stopping=self._stopping.is_set(), stop=self._on_first_signal
                    ),
                )
        await self.open()
        writer = asyncio.create_task(self._writer(), name="writer")
        background = [
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
            asyncio.create_task(self._node_heartbeat(), name="node-heartbeat"),
        ]
        if not once:  # `once` reaps inline, before its one claim
            background.append(asyncio.create_task(self._listen(), name="listen"))
            background.append(asyncio.create_task(self._reaper(), name="reaper"))
        log.info(
            "executor %s started: concurrency %d, tasks %s%s",
            self.owner,
            self.concurrency,
            ", ".join(tasks.names()) or "none",
            ", private targets allowed" if self.allow_private else "",
        )
        try:
            await self._claim_loop(once=once)
            await self._drain(grace=None if once and not self._stopping.is_set() else self.grace_seconds)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            await self._move_the_rest()  # after the reaper and the writer: nothing moves or notes beside it
            await self.close()
            log.info("executor %s stopped: %s", self.owner, self.counters)

    async def _guarded(self, step: Callable[[], Awaitable[T]], conn: str) -> T | None:
        """Run a step; if its connection (attribute `conn`) failed, log the outage once,
        replace the connection and return None."""
        try:
            return await step()
        except psycopg.Error as exc:
            self._outage.failed(exc)  # one line per outage, not one per retry
            setattr(self, conn, await self.reconnect(getattr(self, conn)))
            return None

    # --- the drivers ---------------------------------------------------------------

    async def _claim_loop(self, *, once: bool) -> None:
        if once:
            await self._guarded(self.reap_once, "_reap_conn")
        while not self._stopping.is_set():
            self._wake.clear()
            if self._statistics_suspect:
                self._statistics_suspect = False
                # Before the first claim of the newly announced runs.
                await self._statistics_step(
                    table_statistics.analyze_if_called_empty,
                    "_claim_conn",
                    "their statistics said they were empty",
                )
            claimed = await self._guarded(self.claim_once, "_claim_conn")
            if claimed is None:
                continue
            self._came_back_empty = claimed.limit > 0 and not claimed.claimed
            if claimed.limit > 0:
                self._outage.ok()
            if once:
                return
            if claimed.full:
                continue  # the queue may hold more right now
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_seconds)
            except TimeoutError:
                pass

    async def _writer(self) -> None:
        while True:
            await self._results_ready.wait()
            self._results_ready.clear()
            while self._results:
                pause = self._retry_writes_at - time.monotonic()
                if pause > 0:  # outcomes waiting for a worker out of reach
                    try:
                        await asyncio.wait_for(self._results_ready.wait(), timeout=pause)
                        self._results_ready.clear()
                    except TimeoutError:
                        pass
                await self._guarded(self.write_outcomes_once, "_write_conn")
            self._flushed.set()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_TICK_SECONDS)
            now = time.monotonic()
            if not self._inflight:
                self._next_beat = float("inf")
                continue
            if now < self._next_beat:
                continue
            leases = [e.run.lease_seconds for e in self._inflight.values()]
            self._next_beat = now + max(min(leases) / 3, HEARTBEAT_TICK_SECONDS)
            if await self._guarded(self.heartbeat_once, "_beat_conn") is None:
                self._next_beat = time.monotonic()  # beat again as soon as reconnected

    async def _reaper(self) -> None:
        while True:
            began = time.monotonic()
            if await self._guarded(self.reap_in_turn, "_reap_conn"):
                self._wake.set()  # the reaped runs are claimable now
            took = time.monotonic() - began
            await self._statistics_step(
                table_statistics.keep_statistics, "_reap_conn", "their statistics were out of date"
            )
            await self._guarded(self.keep_floors_once, "_reap_conn")
            await self._move_step()
            await asyncio.sleep(max(REAP_EVERY_SECONDS, took * (1 - REAP_SHARE) / REAP_SHARE))

    async def _move_step(self) -> None:
        """The reaper's moves (Citus): while a move is due and the last one took keys off;
        then, in turn, the sweep. Nothing they raise may stop the reaper (a database
        error still replaces its connection)."""
        try:
            await self._moves(self.moves.due, lambda: self._guarded(self.move_history_once, "_reap_conn"))
        except Exception:
            log.exception("moving successes to run_history failed; %d wait", len(self.moves))
        try:
            await self._guarded(self.sweep_history_once, "_reap_conn")
        except Exception:
            log.exception("sweeping successes to run_history failed")

    async def _statistics_step(
        self, analyze: Callable[[psycopg.AsyncConnection], Awaitable[tuple[str, ...]]], conn: str, why: str
    ) -> None:
        """ANALYZE what `analyze` (runs/execution/table_statistics.py) finds, on connection `conn`.
        An optimisation: nothing it raises may stop the reaper or the claim loop (a
        database error still replaces its connection)."""
        try:
            analyzed = await self._guarded(lambda: analyze(getattr(self, conn)), conn)
        except Exception:
            log.exception("statistics step failed; next look in %.0fs", REAP_EVERY_SECONDS)
            return
        if analyzed:
            log.info("analyzed %s: %s", ", ".join(analyzed), why)

    async def _node_heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.node_lease_seconds / 3)
            try:
                await self.node_beat_once()
            except psycopg.Error as exc:
                self._outage.failed(exc)  # one line per outage, not one per retry
                await close_quietly(self._node_conn)
                try:
                    self._node_conn = await nodes.connect(self._conninfo(), node_id=self.owner)
                except psycopg.Error:
                    pass  # next beat tries again; claims never wait for this row

    async def _listen(self) -> None:
        while True:
            conn = None
            try:
                conn = await connections.listen_connection(self.conninfo)
                self._outage.ok()
                self.planner.read_all()  # NOTIFYs sent while we were not listening are lost
                self._wake.set()  # anything queued while we were not listening
                async for notify in conn.notifies():
                    self.open_from.forget()  # new runs, maybe in an older day (a replay)
                    # ... and maybe of a tenant the last plan left out, or before its floor
                    self.planner.forget(oldest=_slot(notify.payload))
                    self._statistics_suspect = self._statistics_suspect or self._came_back_empty
                    self._wake.set()
            except psycopg.Error as exc:
                # Claims poll every poll_seconds meanwhile, so nothing is missed.
                self._outage.failed(exc)
                await asyncio.sleep(RECONNECT_DELAY_SECONDS)
            finally:
                if conn is not None:
                    await conn.close()

    # --- shutdown ------------------------------------------------------------------

    async def _drain(self, *, grace: float | None) -> None:
        """Put back runs claimed ahead and never sent, let in-flight runs finish (within
        `grace` seconds), then hand back the rest. With no grace (`once`) all are run."""
        deadline = None if grace is None else time.monotonic() + grace
        if deadline is not None:
            try:
                await self.put_back_unsent()
            except psycopg.Error as exc:
                log.error("could not put back unsent runs (%s); their leases will expire", exc)
        while self._inflight:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            self._flushed.clear()
            try:
                await asyncio.wait_for(self._flushed.wait(), timeout=min(remaining or 0.5, 0.5))
            except TimeoutError:
                pass
        # Not a run whose outcome waits for the writer: handed back, its call would be
        # made again though it happened.
        waiting = {id(e) for e, _ in self._results}
        unfinished = [e for e in self._inflight.values() if not e.writing and id(e) not in waiting]
        if unfinished:
            await self._hand_back(unfinished)
        # Outcomes already in the writer's hands: give them a moment to land.
        deadline = time.monotonic() + 5
        while (
            self._results or any(e.writing for e in self._inflight.values())
        ) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _moves(self, more: Callable[[], bool], move: Callable[[], Awaitable[object]]) -> None:
        """`move` while `more()` says so and the last move took keys off (none taken off:
        a worker out of reach or an error, whose keys wait for a later move)."""
        while more():
            waiting = len(self.moves)
            await move()
            if len(self.moves) >= waiting:
                return

    async def _move_the_rest(self) -> None:
        """At shutdown, move what this executor still holds for run_history (Citus), on a
        connection of its own: the reaper's may have been cancelled mid-statement. What
        cannot be moved stays in job_runs, where it reads the same."""
        if not self.moves:
            return
        try:
            conn = await connections.connect_async(self._conninfo())
        except psycopg.Error as exc:
            log.error("could not move %d success(es) to run_history (%s)", len(self.moves), exc)
            return
        try:
            await self._moves(lambda: bool(self.moves), lambda: self.move_history_once(conn))
        except psycopg.Error as exc:
            log.error("could not move %d success(es) to run_history (%s)", len(self.moves), exc)
        finally:
            await close_quietly(conn)
        if self.moves:
            log.warning("%d success(es) stay in job_runs for the sweep to move", len(self.moves))

    async def _hand_back(self, entries: list[InFlight]) -> None:
        for entry in entries:
            entry.lost = True
            if entry.task is not None:
                entry.task.cancel()
        await asyncio.gather(*(e.task for e in entries if e.task is not None), return_exceptions=True)
        batch = [(e, inflight.hand_back_completion(e, owner=self.owner)) for e in entries]
        now = datetime.now(UTC)
        try:
            written = await outcomes.complete_runs(self._write_conn, [c for _, c in batch], now=now)
        except psycopg.Error as exc:
            log.error("could not hand back %d run(s) (%s); their leases will expire", len(batch), exc)
            return
        self._written(batch, written, finished_at=now)
        dead = sum(1 for e, c in batch if e.key in written and c.status == "dead")
        log.info("handed back %d unfinished run(s), %d of them dead (no attempts left)", len(written), dead)


def _slot(payload: str) -> datetime | None:
    """The oldest slot a NOTIFY names (runs/enqueue.notify_executors), if any."""
    try:
        return parse_rfc3339(payload) if payload else None
    except ValueError:
        return None  # not ours to read: the claim reads again anyway
