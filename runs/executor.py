"""The executor: claims runs, calls their targets, writes outcomes under the attempt's fence.

One asyncio event loop (uvloop) per process. HTTP calls share one aiohttp session;
sync tasks run on threads of their own (an overrunning one is abandoned). The
database is reached through psycopg AsyncConnections with the raw SQL of runs/queue.py, never the ORM:

- claim connection: short claim transactions (never open during a call);
- write connection: outcomes of finished attempts, batched into one UPDATE;
- heartbeat connection: one UPDATE extending every in-flight lease, every lease/3;
- listen connection: LISTEN cronyard_runs, so new runs start without waiting for a poll;
- node connection: the executor_nodes row (in-flight count, last claim) every
  node_lease/3, named after the owner so a dead process drops out at once (runs/nodes.py).

A run whose lease this process no longer holds (reclaimed after a stall, or
cancelled) is dropped at the next heartbeat: its call is cancelled and nothing is
written for it. Every write is `WHERE attempt = <mine> AND status = 'running'`, so
even a write racing that discovery is a no-op.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import secrets
import signal
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID

import psycopg

from runs import breakers, nodes, queue, retry, targets, tasks
from runs.alerts import Alerter, DeadRun
from runs.attempts import AttemptRecord
from runs.keys import run_key
from scheduler_project.outage import OutageLog

log = logging.getLogger(__name__)

RunKey = tuple[UUID, datetime, int]

WRITE_BATCH = 500
REAP_EVERY_SECONDS = 1.0
HEARTBEAT_TICK_SECONDS = 0.25
RECONNECT_DELAY_SECONDS = 1.0
# Generic plans are kept per connection (see queue.connect_async); re-plan this often
# so a plan made when the queue was small does not outlive the backlog's arrival.
REPLAN_SECONDS = 5.0


@dataclass
class InFlight:
    run: queue.ClaimedRun
    started_monotonic: float
    started_wall: datetime
    task: asyncio.Task | None = None
    writing: bool = False  # its outcome is in a write batch; the write decides
    lost: bool = False  # fenced, cancelled or handed back: its outcome is discarded
    host: str | None = None  # HTTP targets: scheme://host:port, the circuit breaker's unit
    host_outcome: str | None = None  # breakers.UP / DOWN once the call answered

    @property
    def key(self) -> RunKey:
        return (self.run.job_id, self.run.scheduled_at, self.run.attempt)

    @property
    def run_key(self) -> str:
        return run_key(self.run.job_id, self.run.scheduled_at)


@dataclass
class Counters:
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    fenced: int = 0
    handed_back: int = 0
    lease_expiries: int = 0
    deferred: int = 0


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"[:100]


@dataclass
class Executor:
    concurrency: int = 32
    poll_seconds: float = 1.0
    grace_seconds: float = 10.0
    allow_private: bool = False
    webhook_url: str = ""
    task_modules: Iterable[str] = ()
    claim_batch: int = 100
    # The node heartbeat follows the schedulers' lease so one liveness rule fits both.
    node_lease_seconds: float = 30.0
    aging_seconds: float = queue.DEFAULT_AGING_SECONDS
    breaker_policy: breakers.Policy = field(default_factory=breakers.Policy)
    conninfo: str | None = None
    owner: str = field(default_factory=default_owner)
    rng: random.Random = field(default_factory=random.Random)
    counters: Counters = field(default_factory=Counters)

    def __post_init__(self) -> None:
        self._signals = False
        self._inflight: dict[RunKey, InFlight] = {}
        self._calls = 0  # runs of _inflight whose call has not returned yet
        self._results: list[tuple[InFlight, queue.Completion]] = []
        self._alerter = Alerter(webhook_url=self.webhook_url)
        # All connections report here: one "away" and one "back" line per outage.
        self._outage = OutageLog(name="executor")
        self._last_claim_at: datetime | None = None

    @classmethod
    def from_settings(cls, **overrides) -> Executor:
        from django.conf import settings

        options = {
            "poll_seconds": settings.EXECUTOR_POLL_SECONDS,
            "allow_private": settings.SCHEDULER_ALLOW_PRIVATE_TARGETS,
            "webhook_url": settings.SCHEDULER_ALERT_WEBHOOK_URL,
            "task_modules": tuple(settings.EXECUTOR_TASK_MODULES),
            "conninfo": queue.database_conninfo(),
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

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._stopping.is_set():
            log.warning("second %s: exiting now", name)
            os._exit(128 + signum)
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
        self._wake = asyncio.Event()
        self._results_ready = asyncio.Event()
        self._flushed = asyncio.Event()
        self._next_beat = float("inf")
        if self._signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self._on_signal, signum)
        tasks.load_modules(self.task_modules)
        # A process (re)started while the database is down waits for it, like one
        # that was already running, instead of exiting.
        self._claim_conn = await self._connect(wait_first=False)
        self._write_conn = await self._connect(wait_first=False)
        self._beat_conn = await self._connect(wait_first=False)
        self._node_conn = await nodes.connect(self.conninfo or queue.database_conninfo(), node_id=self.owner)
        await self._node_beat()  # registered before the first claim
        self._session = targets.make_session(concurrency=self.concurrency, allow_private=self.allow_private)
        writer = asyncio.create_task(self._writer(), name="writer")
        background = [
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
            asyncio.create_task(self._node_heartbeat(), name="node-heartbeat"),
        ]
        if not once:
            background.append(asyncio.create_task(self._listen(), name="listen"))
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
            await self._alerter.close(timeout=min(self.grace_seconds, 5.0))
            await self._session.close()
            try:
                await nodes.leave(self._node_conn, node_id=self.owner)
            except psycopg.Error:
                pass  # the row expires; the closed session already marks it dead
            for conn in (self._claim_conn, self._write_conn, self._beat_conn, self._node_conn):
                await conn.close()
            log.info("executor %s stopped: %s", self.owner, self.counters)

    # --- claiming ------------------------------------------------------------------

    async def _claim_loop(self, *, once: bool) -> None:
        next_reap = 0.0
        next_replan = time.monotonic() + REPLAN_SECONDS
        while not self._stopping.is_set():
            self._wake.clear()
            limit = min(self._free_slots(), self.claim_batch)
            claimed: list[queue.ClaimedRun] = []
            # Reaping does not wait for a free slot: an orphaned run counts against its
            # tenant's max_concurrency until someone reclaims it, and a fully busy
            # executor may stay busy for as long as its longest call.
            if time.monotonic() >= next_reap:
                try:
                    self._reaped(await queue.reap_expired_leases(self._claim_conn))
                except psycopg.Error as exc:
                    self._outage.failed(exc)  # one line per outage, not one per retry
                    self._claim_conn = await self._reconnect(self._claim_conn)
                    continue
                next_reap = time.monotonic() + REAP_EVERY_SECONDS
            if limit > 0:
                try:
                    if time.monotonic() >= next_replan:
                        await queue.replan(self._claim_conn)
                        next_replan = time.monotonic() + REPLAN_SECONDS
                    claimed = await queue.claim_runs(
                        self._claim_conn, owner=self.owner, limit=limit, aging_seconds=self.aging_seconds
                    )
                    sendable = await self._admit(claimed)
                except psycopg.Error as exc:
                    self._outage.failed(exc)
                    self._claim_conn = await self._reconnect(self._claim_conn)
                    continue
                self._outage.ok()
                if not claimed:
                    # Plans made now see an empty queue; make them again when work comes.
                    next_replan = 0.0
                for run in sendable:
                    self._start(run)
                if claimed:
                    self._last_claim_at = max(run.started_at for run in claimed)
            if once:
                return
            if limit > 0 and len(claimed) == limit:
                continue  # the queue may hold more right now
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_seconds)
            except TimeoutError:
                pass

    async def _admit(self, claimed: list[queue.ClaimedRun]) -> list[queue.ClaimedRun]:
        """The claimed runs that may be sent now; runs/breakers.py defers the others
        (their host's circuit is open, or their retry is over its host's budget)."""
        candidates = []
        for run in claimed:
            host = _host_of(run)
            if host is not None:
                key = (run.job_id, run.scheduled_at, run.attempt)
                left = run.max_attempts - run.attempts_used
                retried = run.attempts_used > 1
                candidates.append(breakers.Candidate(key, host, retried, run.deferred_since, left))
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

    def _free_slots(self) -> int:
        """Runs we may claim now.

        `concurrency` bounds calls, not rows awaiting their outcome write: a slot frees
        when the call returns, so the next claim overlaps the previous outcomes' write
        instead of waiting for it. Outcomes not yet written are bounded separately so
        a stuck writer stops the claiming too.
        """
        return min(self.concurrency - self._calls, self.concurrency + self.claim_batch - len(self._inflight))

    def _reaped(self, reaped: list[queue.ReapedRun]) -> None:
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
                self._alerter.dead(
                    DeadRun(
                        run.job_id,
                        run.scheduled_at,
                        run.tenant_id,
                        run.job_name,
                        run.attempt,
                        None,
                        run.last_error,
                    )
                )

    def _start(self, run: queue.ClaimedRun) -> None:
        self.counters.claimed += 1
        entry = InFlight(
            run=run, started_monotonic=time.monotonic(), started_wall=datetime.now(UTC), host=_host_of(run)
        )
        self._inflight[entry.key] = entry
        self._next_beat = min(self._next_beat, time.monotonic() + run.lease_seconds / 3)
        self._calls += 1
        entry.task = asyncio.create_task(self._execute(entry))
        entry.task.add_done_callback(self._call_done)

    def _call_done(self, _task: asyncio.Task) -> None:
        self._calls -= 1
        self._wake.set()  # a slot is free: claim again without waiting for the write

    # --- executing -----------------------------------------------------------------

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
            entry.host_outcome = _host_outcome(result)
        if entry.lost:
            return
        if result.missing_task:
            self._alerter.missing_task(
                task=result.missing_task,
                job_id=run.job_id,
                scheduled_at=run.scheduled_at,
                attempt=run.attempt,
                owner=self.owner,
            )
        decision = retry.decide(
            result,
            attempt=run.attempts_used,
            max_attempts=run.max_attempts,
            base=run.retry_backoff_seconds,
            cap=run.retry_backoff_cap_seconds,
            rng=self.rng,
        )
        self._results.append(
            (entry, self._completion(entry, decision.status, decision.outcome, result, decision.retry_in_s))
        )
        self._results_ready.set()

    def _completion(
        self, entry: InFlight, status: str, outcome: str, result: retry.CallResult, retry_in_s: float | None
    ) -> queue.Completion:
        finished = datetime.now(UTC)
        return queue.Completion(
            job_id=entry.run.job_id,
            scheduled_at=entry.run.scheduled_at,
            attempt=entry.run.attempt,
            status=status,
            retry_in_s=retry_in_s,
            result_code=result.result_code,
            error=result.error,
            entry=AttemptRecord(
                attempt=entry.run.attempt,
                owner=self.owner,
                started_at=entry.started_wall,
                finished_at=finished,
                duration_ms=(time.monotonic() - entry.started_monotonic) * 1000,
                outcome=outcome,
                result_code=result.result_code,
                error=result.error,
                retry_in_s=retry_in_s,
            ).to_json(),
        )

    # --- writing outcomes ----------------------------------------------------------

    async def _writer(self) -> None:
        next_replan = time.monotonic() + REPLAN_SECONDS
        while True:
            await self._results_ready.wait()
            self._results_ready.clear()
            while self._results:
                if time.monotonic() >= next_replan:
                    try:
                        await queue.replan(self._write_conn)
                    except psycopg.Error:
                        pass  # the write below finds out and reconnects
                    next_replan = time.monotonic() + REPLAN_SECONDS
                batch = self._results[:WRITE_BATCH]
                del self._results[:WRITE_BATCH]
                for entry, _ in batch:
                    entry.writing = True
                try:
                    written = await queue.complete_runs(self._write_conn, [c for _, c in batch])
                except psycopg.DataError as exc:
                    # The database refuses the data itself: retrying the same batch would
                    # fail forever and stop this executor recording anything.
                    written = await self._write_one_by_one(batch, exc)
                except psycopg.Error as exc:
                    self._outage.failed(exc)
                    self._results[:0] = batch
                    self._write_conn = await self._reconnect(self._write_conn)
                    continue
                self._written(batch, written)
                await self._record_hosts(batch)
            self._flushed.set()

    async def _record_hosts(self, batch: list[tuple[InFlight, queue.Completion]]) -> None:
        """Feed the answers of HTTP calls (fenced or not: the host did answer) to the breakers."""
        outcomes = [(e.host, e.host_outcome) for e, _ in batch if e.host and e.host_outcome]
        if not outcomes:
            return
        try:
            await breakers.record(self._write_conn, outcomes, policy=self.breaker_policy)
        except psycopg.Error as exc:
            # Breaker state only spares a sick host; the outcomes themselves are written.
            log.warning("recording %d host outcome(s) failed (%s)", len(outcomes), exc)
            self._write_conn = await self._reconnect(self._write_conn)

    async def _write_one_by_one(
        self, batch: list[tuple[InFlight, queue.Completion]], error: psycopg.DataError
    ) -> set[RunKey]:
        """Write each outcome alone; one the database still refuses is stored without
        its error text and response details, which are what it could not take."""
        log.warning("writing %d outcome(s) was refused (%s); writing them one by one", len(batch), error)
        written: set[RunKey] = set()
        await self._write_conn.rollback()
        for _, completion in batch:
            for attempt in (completion, _scrubbed(completion, error)):
                try:
                    written |= await queue.complete_runs(self._write_conn, [attempt])
                    break
                except psycopg.DataError as exc:
                    await self._write_conn.rollback()
                    log.error("outcome of %s refused by the database: %s", completion.job_id, exc)
        return written

    def _written(self, batch: list[tuple[InFlight, queue.Completion]], written: set[RunKey]) -> None:
        loop = asyncio.get_running_loop()
        for entry, completion in batch:
            self._inflight.pop(entry.key, None)
            if entry.key not in written:
                self._fenced(entry)
                continue
            handed_back = completion.entry["outcome"] == "handed back"
            if handed_back:
                self.counters.handed_back += 1
            if completion.status == "succeeded":
                self.counters.succeeded += 1
            elif completion.status == "retrying" and not handed_back:
                self.counters.retried += 1
                # Retry our own backoff promptly instead of at the next poll.
                loop.call_later((completion.retry_in_s or 0) + 0.01, self._wake.set)
            elif completion.status == "dead":
                self.counters.dead += 1
                self._alerter.dead(
                    DeadRun(
                        entry.run.job_id,
                        entry.run.scheduled_at,
                        entry.run.tenant_id,
                        entry.run.job_name,
                        entry.run.attempt,
                        completion.result_code,
                        completion.error,
                    )
                )
        self._wake.set()

    def _fenced(self, entry: InFlight) -> None:
        self.counters.fenced += 1
        log.warning(
            "fenced: attempt %d of %s is no longer ours (lease lost or run cancelled); wrote nothing",
            entry.run.attempt,
            entry.run_key,
        )

    # --- heartbeat -----------------------------------------------------------------

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
            # Runs whose outcome is waiting to be written keep their lease too: a slow
            # write (a failover, a reconnect) must not let the run be reclaimed and
            # executed again after the call already happened. The write decides them.
            keys = list(self._inflight)
            try:
                held = await queue.heartbeat_runs(self._beat_conn, keys)
            except psycopg.Error as exc:
                self._outage.failed(exc)
                self._beat_conn = await self._reconnect(self._beat_conn)
                self._next_beat = time.monotonic()
                continue
            for key in keys:
                entry = self._inflight.get(key)
                if key in held or entry is None or entry.writing or entry.lost:
                    continue
                entry.lost = True
                if entry.task is not None:
                    entry.task.cancel()
                del self._inflight[key]
                self._fenced(entry)
                self._wake.set()

    async def _node_heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.node_lease_seconds / 3)
            try:
                await self._node_beat()
            except psycopg.Error as exc:
                self._outage.failed(exc)  # one line per outage, not one per retry
                await _close_quietly(self._node_conn)
                try:
                    self._node_conn = await nodes.connect(
                        self.conninfo or queue.database_conninfo(), node_id=self.owner
                    )
                except psycopg.Error:
                    pass  # next beat tries again; claims never wait for this row

    async def _node_beat(self) -> None:
        await nodes.beat(
            self._node_conn,
            node_id=self.owner,
            concurrency=self.concurrency,
            in_flight=len(self._inflight),
            last_claim_at=self._last_claim_at,
            expire_after_seconds=5 * self.node_lease_seconds,
        )

    # --- waking --------------------------------------------------------------------

    async def _listen(self) -> None:
        while True:
            conn = None
            try:
                conn = await queue.listen_connection(self.conninfo)
                self._outage.ok()
                self._wake.set()  # anything queued while we were not listening
                async for _ in conn.notifies():
                    self._wake.set()
            except psycopg.Error as exc:
                # Claims poll every poll_seconds meanwhile, so nothing is missed.
                self._outage.failed(exc)
                await asyncio.sleep(RECONNECT_DELAY_SECONDS)
            finally:
                if conn is not None:
                    await conn.close()

    async def _reconnect(self, conn):
        try:
            await conn.close()
        except psycopg.Error:
            pass
        return await self._connect(wait_first=True)

    async def _connect(self, *, wait_first: bool):
        while True:
            if wait_first:
                await asyncio.sleep(RECONNECT_DELAY_SECONDS)
            wait_first = True
            try:
                conn = await queue.connect_async(self.conninfo)
            except psycopg.Error as exc:
                self._outage.failed(exc)
                continue
            self._outage.ok()
            return conn

    # --- shutdown ------------------------------------------------------------------

    async def _drain(self, *, grace: float | None) -> None:
        """Let in-flight runs finish (within `grace` seconds), then hand back the rest."""
        deadline = None if grace is None else time.monotonic() + grace
        while self._inflight:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            self._flushed.clear()
            try:
                await asyncio.wait_for(self._flushed.wait(), timeout=min(remaining or 0.5, 0.5))
            except TimeoutError:
                pass
        unfinished = [e for e in self._inflight.values() if not e.writing]
        if unfinished:
            await self._hand_back(unfinished)
        # Outcomes already in the writer's hands: give them a moment to land.
        deadline = time.monotonic() + 5
        while (
            self._results or any(e.writing for e in self._inflight.values())
        ) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _hand_back(self, entries: list[InFlight]) -> None:
        for entry in entries:
            entry.lost = True
            if entry.task is not None:
                entry.task.cancel()
        await asyncio.gather(*(e.task for e in entries if e.task is not None), return_exceptions=True)
        batch = [(e, self._hand_back_completion(e)) for e in entries]
        try:
            written = await queue.complete_runs(self._write_conn, [c for _, c in batch])
        except psycopg.Error as exc:
            log.error("could not hand back %d run(s) (%s); their leases will expire", len(batch), exc)
            return
        self._written(batch, written)
        dead = sum(1 for e, c in batch if e.key in written and c.status == "dead")
        log.info("handed back %d unfinished run(s), %d of them dead (no attempts left)", len(written), dead)

    def _hand_back_completion(self, entry: InFlight) -> queue.Completion:
        """An unfinished attempt consumed its number (it is the fence): with none left
        the run is dead like any other that ran out of attempts, not queued again."""
        run = entry.run
        if run.attempts_used >= run.max_attempts:
            result = retry.CallResult(
                retry.RETRY,
                error=(
                    f"handed back with no attempts left: attempt {run.attempts_used} of {run.max_attempts}"
                    " did not finish before the executor shut down"
                ),
            )
            return self._completion(entry, "dead", "handed back", result, None)
        result = retry.CallResult(
            retry.RETRY, error="handed back: the executor shut down before the call finished"
        )
        return self._completion(entry, "retrying", "handed back", result, 0.0)


async def _close_quietly(conn) -> None:
    try:
        await conn.close()
    except psycopg.Error:
        pass


def _scrubbed(completion: queue.Completion, error: Exception) -> queue.Completion:
    note = f"outcome details could not be stored ({type(error).__name__})"
    entry = {**completion.entry, "error": note}
    return dataclasses.replace(completion, error=note, entry=entry)


def _host_of(run: queue.ClaimedRun) -> str | None:
    target = run.target if isinstance(run.target, dict) else {}
    return breakers.host_key(str(target.get("url") or "")) if target.get("type") == "http" else None


def _host_outcome(result: retry.CallResult) -> str | None:
    """DOWN for what says the host is sick (no answer, 5xx, 429, 408, 425); UP for any
    other answer; None when nothing was sent (a refused address, an invalid URL)."""
    if result.kind == retry.RETRY:
        return breakers.DOWN
    if result.kind == retry.SUCCESS or result.result_code is not None:
        return breakers.UP
    return None
