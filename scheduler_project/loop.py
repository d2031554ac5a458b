"""The scheduler's signal-aware run-until-stopped loop; `on_stop_signal` is both processes'.

A loop is a `step()` that returns whether it did work; the loop repeats at once
while there is work and otherwise waits `poll_seconds` (or until woken). SIGTERM or
SIGINT sets a flag: the current step (a batch) finishes, `close()` runs, exit 0.
A second signal exits at once, for the operator who really means it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signal(signum: int, *, stopping: bool, stop: Callable[[str], None]) -> None:
    """The one rule for SIGTERM/SIGINT, for the threaded Loop and the asyncio executor
    alike: the first calls `stop(signal name)` (finish, then exit 0), a second exits now."""
    name = signal.Signals(signum).name
    if stopping:
        log.warning("second %s: exiting now", name)
        os._exit(128 + signum)
    stop(name)


class Loop:
    poll_seconds: float = 1.0

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._wake = threading.Event()

    def step(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        """Release what the loop holds; called once after the last step."""

    def idle_seconds(self) -> float:
        """How long to wait after a step that did no work (at most `poll_seconds`)."""
        return self.poll_seconds

    def wait_for_work(self, timeout: float) -> None:
        """Sleep until woken, stopped or timed out. Subclasses may listen for NOTIFY here."""
        self._wake.wait(timeout)
        self._wake.clear()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        def first(name: str) -> None:
            log.info("%s: finishing the current batch, then exiting", name)
            self.stop()

        def handle(signum: int, frame) -> None:
            on_stop_signal(signum, stopping=self.stopping.is_set(), stop=first)

        for signum in STOP_SIGNALS:
            signal.signal(signum, handle)

    def run(self, *, once: bool = False) -> None:
        try:
            while not self.stopping.is_set():
                did_work = self.step()
                if once:
                    break
                if not did_work and not self.stopping.is_set():
                    self.wait_for_work(self.idle_seconds())
        finally:
            self.close()
