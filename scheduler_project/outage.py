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
  outage: it is logged as a warning every time, as before.

Thread-safe: the scheduler's heartbeat thread and its dispatch loop share one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import psycopg

log = logging.getLogger(__name__)

AWAY = "database unreachable"
# What a lost or refused connection raises (psycopg; Django wraps them in its own
# OperationalError/InterfaceError, which the loops here do not use).
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, OSError)
BACK = "database reachable again"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class OutageLog:
    def __init__(
        self,
        *,
        name: str,
        grace_seconds: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.grace_seconds = grace_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._failing_since: float | None = None
        self._failures = 0
        self._announced = False

    @property
    def away(self) -> bool:
        """True between the "unreachable" line and the "reachable again" line."""
        return self._announced

    def failed(self, exc: BaseException) -> None:
        """A database call failed; the caller retries on its own schedule."""
        if not isinstance(exc, CONNECTION_ERRORS):
            log.warning("%s: database call failed (%s); retrying", self.name, _first_line(exc))
            return
        with self._lock:
            now = self._clock()
            if self._failing_since is None:
                self._failing_since = now
            self._failures += 1
            if self._announced or now - self._failing_since < self.grace_seconds:
                log.debug("%s: database call failed (%s); retrying", self.name, _first_line(exc))
                return
            self._announced = True
            log.warning(
                "%s: %s since %.1fs (%s); retrying quietly until it is back",
                self.name,
                AWAY,
                now - self._failing_since,
                _first_line(exc),
            )

    def ok(self) -> None:
        """A database call succeeded: whatever outage there was is over."""
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
