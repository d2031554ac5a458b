"""Signal-aware run-until-stopped loop shared by the scheduler and the executor.

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

log = logging.getLogger(__name__)


class Loop:
    poll_seconds: float = 1.0

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._wake = threading.Event()

    def step(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        """Release what the loop holds; called once after the last step."""

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
        def handle(signum: int, frame) -> None:
            if self.stopping.is_set():
                log.warning("second %s: exiting now", signal.Signals(signum).name)
                os._exit(128 + signum)
            log.info("%s: finishing the current batch, then exiting", signal.Signals(signum).name)
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def run(self, *, once: bool = False) -> None:
        try:
            while not self.stopping.is_set():
                did_work = self.step()
                if once:
                    break
                if not did_work and not self.stopping.is_set():
                    self.wait_for_work(self.poll_seconds)
        finally:
            self.close()
