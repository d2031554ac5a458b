"""The executor process: drives the steps of runs/executor_steps.py until stopped.

One asyncio event loop (uvloop) per process. HTTP calls share one aiohttp session;
sync tasks run on threads of their own (an overrunning one is abandoned). The steps
(claim, reap, write outcomes, heartbeat, node heartbeat) do the work and are tested
in-process; this module only decides when each runs, recovers from connection
failures, and shuts down:

- the claim loop claims; it repeats at once after a full batch and otherwise waits for
  a NOTIFY, a freed slot or `poll_seconds`;
- the writer writes outcomes as calls finish;
- the heartbeat extends leases every lease/3;
- the reaper hands back other executors' expired leases every REAP_EVERY_SECONDS, and
  analyzes tables whose planner statistics are out of date (runs/table_statistics.py);
- the node heartbeat refreshes this process's executor_nodes row every node_lease/3.

They are separate tasks, not one sequential loop, because each has its own connection
and none may wait behind another: a heartbeat stuck behind a slow write would let a
lease lapse and the run be executed twice (docs/decisions/0031-executor-process.md),
and a reaper behind a claim that waits for a stalled executor's tenant lock would leave
that executor's runs unreaped for as long as it stalls.

SIGTERM/SIGINT (scheduler_project.loop.on_stop_signal, the scheduler's rule): stop
claiming, let in-flight runs finish within `grace_seconds`, hand back the rest under
their attempt's fence, exit 0; a second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg

from runs import breakers, connections, inflight, nodes, outcomes, table_statistics, tasks
from runs.connections import RECONNECT_DELAY_SECONDS, close_quietly
from runs.executor_steps import ExecutorSteps
from runs.inflight import InFlight
from scheduler_project.loop import STOP_SIGNALS, on_stop_signal

log = logging.getLogger(__name__)

__all__ = ["Executor"]

T = TypeVar("T")

REAP_EVERY_SECONDS = 1.0
HEARTBEAT_TICK_SECONDS = 0.25


class Executor(ExecutorSteps):
    def __post_init__(self) -> None:
        super().__post_init__()
        self._signals = False
        # Whether the last claim found nothing, and whether runs were announced since:
        # the plan about to be made for them must not come from statistics that call
        # their partition empty (runs/table_statistics.py).
        self._came_back_empty = False
        self._statistics_suspect = False

    @classmethod
    def from_settings(cls, **overrides) -> Executor:
        from django.conf import settings

        options = {
            "poll_seconds": settings.EXECUTOR_POLL_SECONDS,
            "allow_private": settings.SCHEDULER_ALLOW_PRIVATE_TARGETS,
            "webhook_url": settings.SCHEDULER_ALERT_WEBHOOK_URL,
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
            if await self._guarded(self.reap_once, "_reap_conn"):
                self._wake.set()  # the reaped runs are claimable now
            await self._statistics_step(
                table_statistics.keep_statistics, "_reap_conn", "their statistics were out of date"
            )
            await asyncio.sleep(REAP_EVERY_SECONDS)

    async def _statistics_step(
        self, analyze: Callable[[psycopg.AsyncConnection], Awaitable[tuple[str, ...]]], conn: str, why: str
    ) -> None:
        """ANALYZE what `analyze` (runs/table_statistics.py) finds, on connection `conn`.
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
                self._wake.set()  # anything queued while we were not listening
                async for _ in conn.notifies():
                    self.open_from.forget()  # new runs, maybe in an older day (a replay)
                    self.planner.forget()  # ... and maybe of a tenant the last plan left out
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
        batch = [(e, inflight.hand_back_completion(e, owner=self.owner)) for e in entries]
        try:
            written = await outcomes.complete_runs(self._write_conn, [c for _, c in batch])
        except psycopg.Error as exc:
            log.error("could not hand back %d run(s) (%s); their leases will expire", len(batch), exc)
            return
        self._written(batch, written)
        dead = sum(1 for e, c in batch if e.key in written and c.status == "dead")
        log.info("handed back %d unfinished run(s), %d of them dead (no attempts left)", len(written), dead)
