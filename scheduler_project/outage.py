"""One log line when the database goes away and one when it is back, per process.

The scheduler's lease thread and the executor's connections retry every second or
so while the database is down; logging each retry buries the one fact an operator
needs (since when, for how long) under hundreds of identical warnings. Every retry
loop of a process reports to the same `OutageLog` instead:

* `failed(exc)` after a database call failed, `ok()` after one succeeded;
* the first failure is only noted: a connection that broke while the server was
  fine (a stale connection after an earlier outage, a killed backend) is replaced
  at the next attempt, and that is not an outage;
* failures that go on for `grace_seconds` without an `ok()` in between are an
  outage: ONE warning, "database unreachable since ...";
* the first `ok()` after that: ONE info line, "database reachable again after N s";
* an error that is not about the connection (a bad statement, refused data) is no
  outage: it is logged as a warning every time, as before;
* on Citus, a worker the coordinator cannot reach ("connection to the remote node
  HOST:PORT failed") is an outage of that worker, with its own pair of lines naming
  it. The coordinator still answers meanwhile: the statements that touch only healthy
  shards succeed between the ones that need the worker, so an `ok()` proves nothing
  about the worker. It is back once no call has failed on it for `settle_seconds`;
* a caller that can address partitions by worker (both processes on Citus) leaves the
  partitions of a worker that failed out of its batches (`set_aside`), trying it again
  with a backoff, so one worker down never fails the batches of the healthy ones. Such
  a worker is back only when a call that reached it succeeds (`reached`): no call
  failing on it proves nothing while no call is sent to it.

Thread-safe: the scheduler's heartbeat thread and its dispatch loop share one.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psycopg

log = logging.getLogger(__name__)

AWAY = "database unreachable"
# What a lost or refused connection raises (psycopg; Django wraps them in its own
# OperationalError/InterfaceError, which the loops here do not use).
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, OSError)
BACK = "database reachable again"
# Citus's error when the coordinator cannot reach a worker: "connection to the remote
# node user@host:port failed with the following error: ...".
_REMOTE_NODE = re.compile(r"connection to the remote node (?:[^@\s]+@)?(\S+?:\d+) failed")


# A worker set aside is tried again after RETRY_FIRST_SECONDS, doubling per failure up to
# RETRY_MAX_SECONDS: a restarted worker is found within seconds, and a dead one costs a
# failed call per 8 s, not one per batch.
RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 8.0


# SQLSTATEs of a database out of reach: class 08, a crash shutdown, a server starting up.
# Not 57P01: pg_terminate_backend ends one session with it (an administrator, or a
# timeout's watchdog), which says something about that statement, not the database.
_LOST_CONNECTION_STATES = ("57P02", "57P03")


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` says the database (or a Citus worker) is out of reach, not that a
    statement failed: a statement timeout or a lock timeout is an OperationalError too,
    and must still be reported every time."""
    if not isinstance(exc, CONNECTION_ERRORS):
        return False
    if unreachable_worker(exc):
        return True
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith("08") or state in _LOST_CONNECTION_STATES


def unreachable_worker(exc: BaseException) -> str | None:
    """The 'host:port' of the Citus worker `exc` says the coordinator could not reach
    (None: not such an error)."""
    if not isinstance(exc, CONNECTION_ERRORS):
        return None
    found = _REMOTE_NODE.search(str(exc))
    return found.group(1) if found else None


@dataclass
class _Episode:
    since: float
    last_failure: float
    failures: int = 0
    announced: bool = False
    set_aside: bool = False  # left out of batches: only `reached` ends it

    def next_try(self) -> float:
        backoff = RETRY_FIRST_SECONDS * 2 ** max(0, self.failures - 1)
        return self.last_failure + min(RETRY_MAX_SECONDS, backoff)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class OutageLog:
    def __init__(
        self,
        *,
        name: str,
        grace_seconds: float = 0.5,
        settle_seconds: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.grace_seconds = grace_seconds
        self.settle_seconds = settle_seconds
        # Citus workers out of reach: "host:port" -> its episode.
        self._workers: dict[str, _Episode] = {}
        self._clock = clock
        self._lock = threading.Lock()
        self._failing_since: float | None = None
        self._failures = 0
        self._announced = False

    @property
    def away(self) -> bool:
        """True between the "unreachable" line and the "reachable again" line."""
        return self._announced or any(e.announced for e in self._workers.values())

    def failed(self, exc: BaseException) -> None:
        """A database call failed; the caller retries on its own schedule."""
        if not isinstance(exc, CONNECTION_ERRORS):
            log.warning("%s: database call failed (%s); retrying", self.name, first_line(exc))
            return
        worker = unreachable_worker(exc)
        if worker:
            self._worker_failed(worker, exc)
            return
        with self._lock:
            now = self._clock()
            if self._failing_since is None:
                self._failing_since = now
            self._failures += 1
            if self._announced or now - self._failing_since < self.grace_seconds:
                log.debug("%s: database call failed (%s); retrying", self.name, first_line(exc))
                return
            self._announced = True
            log.warning(
                "%s: %s since %.1fs (%s); retrying quietly until it is back",
                self.name,
                AWAY,
                now - self._failing_since,
                first_line(exc),
            )

    def _worker_failed(self, worker: str, exc: BaseException) -> None:
        with self._lock:
            now = self._clock()
            episode = self._workers.setdefault(worker, _Episode(since=now, last_failure=now))
            episode.failures += 1
            episode.last_failure = now
            if episode.announced or now - episode.since < self.grace_seconds:
                log.debug("%s: Citus worker %s failed (%s); retrying", self.name, worker, first_line(exc))
                return
            episode.announced = True
            log.warning(
                "%s: %s: Citus worker %s since %.1fs (%s); retrying quietly until it is back",
                self.name,
                AWAY,
                worker,
                now - episode.since,
                first_line(exc),
            )

    def set_aside(self, workers: Iterable[str]) -> set[str]:
        """Of `workers` ('host:port' of Citus workers), those a batch leaves out now: a
        call failed on them and their next try (a backoff from the last failure) is not
        due yet. A worker whose try is due is not left out: the batch tries it."""
        with self._lock:
            now = self._clock()
            out = set()
            for worker in workers:
                episode = self._workers.get(worker)
                if episode is None:
                    continue
                episode.set_aside = True
                if now < episode.next_try():
                    out.add(worker)
            return out

    def worker_set_aside(self) -> bool:
        """Whether some Citus worker is out of reach and its next try is not due yet. A
        write that must reach every worker (of a reference table) waits for that try, as
        the batches of the worker's own partitions do."""
        with self._lock:
            now = self._clock()
            return any(now < episode.next_try() for episode in self._workers.values())

    def reached(self, workers: Iterable[str]) -> None:
        """A call that touched `workers` succeeded: their outages are over."""
        with self._lock:
            for worker in workers:
                episode = self._workers.pop(worker, None)
                if episode is not None and episode.announced:
                    self._log_back(worker, episode)

    def _log_back(self, worker: str, episode: _Episode) -> None:
        log.info(
            "%s: %s: Citus worker %s after %.1fs away (%d failed attempts)",
            self.name,
            BACK,
            worker,
            # Set aside, it was last tried just now; otherwise nothing has failed on it
            # since its last failure.
            (self._clock() if episode.set_aside else episode.last_failure) - episode.since,
            episode.failures,
        )

    def ok(self) -> None:
        """A database call succeeded: whatever outage there was is over (a Citus
        worker's once no call has failed on it for settle_seconds)."""
        if self._workers:
            self._workers_ok()
        if self._failing_since is None:  # the common case, without taking the lock
            return
        with self._lock:
            if self._failing_since is None:
                return
            if self._announced:
                log.info(
                    "%s: %s after %.1fs away (%d failed attempts)",
                    self.name,
                    BACK,
                    self._clock() - self._failing_since,
                    self._failures,
                )
            self._failing_since = None
            self._failures = 0
            self._announced = False

    def _workers_ok(self) -> None:
        with self._lock:
            now = self._clock()
            for worker, episode in list(self._workers.items()):
                if episode.set_aside or now - episode.last_failure < self.settle_seconds:
                    continue
                if episode.announced:
                    self._log_back(worker, episode)
                del self._workers[worker]
