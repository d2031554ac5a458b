"""The executor's call slots and the queue of runs claimed ahead of them. No I/O.

While every slot is busy, runs may be claimed into a queue that feeds the slots the
moment a call returns, so short calls do not wait for a claim's round trips (four; tens
of milliseconds on a loaded machine) and claims come in bigger, fewer batches. The
queue holds what the slots finish in CLAIM_AHEAD_SECONDS at the recent call duration
(at most claim_batch runs): slow calls, for which a claim costs nothing, claim no more
than their free slots, and no run waits long here while another executor is idle.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from runs.execution.inflight import InFlight

CLAIM_AHEAD_SECONDS = 0.05
# Weight of the newest call in the running mean of call durations that sizes the queue.
CALL_SECONDS_WEIGHT = 0.05


@dataclass
class Slots:
    concurrency: int
    claim_batch: int
    calls: int = 0  # calls started whose task has not finished
    ready: deque[InFlight] = field(default_factory=deque)  # claimed ahead, not called yet
    call_seconds: float | None = None  # running mean; None until a call returns

    def ahead(self) -> int:
        """How many runs the claimed-ahead queue may hold."""
        if self.call_seconds is None:
            return 0
        finished = self.concurrency * CLAIM_AHEAD_SECONDS / max(self.call_seconds, 1e-4)
        return min(int(finished), self.claim_batch)

    def claimable(self, *, in_flight: int) -> int:
        """Runs we may claim now: the free slots plus room in the queue.

        `concurrency` bounds calls, not rows awaiting their outcome write: a slot frees
        when the call returns, so the next claim overlaps the previous outcomes' write
        instead of waiting for it. Outcomes not yet written and queued runs are bounded
        together (`in_flight` counts both) so a stuck writer stops the claiming too.
        """
        room = self.concurrency - self.calls + max(0, self.ahead() - len(self.ready))
        return min(room, self.concurrency + self.claim_batch - in_flight)

    def free(self) -> bool:
        return self.calls < self.concurrency

    def called(self) -> None:
        """A call started: it holds a slot until returned()."""
        self.calls += 1

    def returned(self, took: float) -> None:
        """A call returned after `took` seconds: its slot is free."""
        self.calls -= 1
        mean = self.call_seconds
        self.call_seconds = took if mean is None else mean + CALL_SECONDS_WEIGHT * (took - mean)

    def next_calls(self, held: dict) -> Iterator[InFlight]:
        """Queued runs to call now, one per free slot; skips those no longer `held`
        (fenced or cancelled while they waited). The caller counts each call it starts."""
        while self.ready and self.free():
            entry = self.ready.popleft()
            if not entry.lost and entry.key in held:
                yield entry

    def wants_claim(self) -> bool:
        """Whether a returning call should wake the claim loop: always without a queue,
        else once it is half empty, so that claims come in batches."""
        return 2 * len(self.ready) <= self.ahead()

    def take_unsent(self, held: dict) -> list[InFlight]:
        """Empty the queue: its runs still `held`, never called, leave `held` too."""
        unsent = [e for e in self.ready if not e.lost and e.key in held]
        self.ready.clear()
        for entry in unsent:
            del held[entry.key]
        return unsent
