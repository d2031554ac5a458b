"""Prometheus counters kept across processes: what each one means, how a process adds to
them, and how /metrics reads their totals.

A counter only goes up, so `rate()` and `increase()` work on it, and it must survive the
process that counted: any web worker answers the scrape, and schedulers and executors
come and go. Each process counts in memory (`Tally`) and flushes what it counted since
its last flush into `process_counters`, one row per (process, counter, label), adding to
that row: rows of its own only, so no two processes ever wait on one row. A flush is one
small autocommit statement, never inside a transaction that holds run or job rows. /metrics
sums the rows per counter and label (`totals`). Rows of processes gone for a day are
folded into one `(retired)` row per counter and label in a single statement
(`fold_retired`), which leaves every sum unchanged.

What can be lost: a process killed without a clean exit loses what it counted since its
last flush (at most FLUSH_EVERY_SECONDS); a flush whose commit fails on a lost connection
may be lost or, if the commit did land, counted again on the retry. Counters describe
rates, not the exact history: the run rows are that (docs/decisions/0066-metrics-gauges.md).

Labels are bounded: statuses and alert types, never a job, run or tenant.

Beside the counters, a process keeps one gauge the same way: the finish time of the
newest success it wrote per tenant (`Tally.succeeded`), flushed into `tenant_successes`
with GREATEST instead of +, read as max per tenant (`last_successes`) and folded the
same way. One row per (process, tenant) that succeeded; /metrics shows only existing
tenants.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime

# How often a process writes its counts; also when it exits cleanly.
FLUSH_EVERY_SECONDS = 5.0
# A process whose rows have not changed for this long is gone: its rows are folded.
RETIRE_AFTER_SECONDS = 24 * 3600
RETIRED = "(retired)"


@dataclass(frozen=True)
class Spec:
    name: str
    help: str
    label: str = ""  # the one label's name, or "" for none
    values: tuple[str, ...] = ("",)  # every label value, each exported from the start (0 if none yet)


DISPATCHED = Spec(
    "cronyard_runs_dispatched",
    "Runs the schedulers created: queued to run, or skipped by the job's overlap policy "
    "(written as skipped, never executed).",
    "outcome",
    ("queued", "skipped"),
)
MISFIRES = Spec("cronyard_misfires", "Misfires the schedulers recorded (slots missed past the threshold).")
ATTEMPTS = Spec("cronyard_run_attempts", "Attempts the executors started (claims that sent a call).")
FINISHED = Spec(
    "cronyard_runs_finished",
    "Runs that ended, by status: succeeded, or dead (attempts used up, or a permanent failure).",
    "status",
    ("succeeded", "dead"),
)
RETRIES = Spec("cronyard_run_retries", "Attempts that failed and left their run to retry after a backoff.")
DEFERRALS = Spec(
    "cronyard_run_deferrals",
    "Claims put back unsent by an open circuit breaker or a spent retry budget (no attempt used).",
)
LEASE_EXPIRIES = Spec(
    "cronyard_lease_expiries", "Attempts whose executor stopped heartbeating; their runs were reaped."
)
FENCED = Spec(
    "cronyard_fenced_results",
    "Results an executor dropped because its attempt no longer held the run (lease lost, run cancelled).",
)
ALERTS = Spec(
    "cronyard_alerts_sent",
    "Alerts the alert webhook accepted, by type.",
    "type",
    ("run.dead", "job.failing", "job.overdue", "task.missing"),
)
SPECS: tuple[Spec, ...] = (
    DISPATCHED,
    MISFIRES,
    ATTEMPTS,
    FINISHED,
    RETRIES,
    DEFERRALS,
    LEASE_EXPIRIES,
    FENCED,
    ALERTS,
)

_FLUSH_SQL = """
INSERT INTO process_counters (node_id, name, label, value, updated_at)
SELECT %(node_id)s, n, l, v, now()
FROM unnest(%(names)s::text[], %(labels)s::text[], %(values)s::bigint[]) AS u(n, l, v)
ON CONFLICT (node_id, name, label)
DO UPDATE SET value = process_counters.value + EXCLUDED.value, updated_at = EXCLUDED.updated_at
"""
_TOTALS_SQL = "SELECT name, label, sum(value)::bigint FROM process_counters GROUP BY name, label"
# One statement: the rows leave and their sums arrive together, so no scrape sees a dip.
_FOLD_SQL = """
WITH gone AS (
    DELETE FROM process_counters
    WHERE node_id <> %(retired)s AND updated_at < now() - make_interval(secs => %(after)s)
    RETURNING name, label, value
)
INSERT INTO process_counters (node_id, name, label, value, updated_at)
SELECT %(retired)s, name, label, sum(value), now() FROM gone GROUP BY name, label
ON CONFLICT (node_id, name, label)
DO UPDATE SET value = process_counters.value + EXCLUDED.value, updated_at = EXCLUDED.updated_at
"""


_SUCCESS_FLUSH_SQL = """
INSERT INTO tenant_successes (node_id, tenant_id, at, updated_at)
SELECT %(node_id)s, t, a, now() FROM unnest(%(tenants)s::bigint[], %(ats)s::timestamptz[]) AS u(t, a)
ON CONFLICT (node_id, tenant_id)
DO UPDATE SET at = GREATEST(tenant_successes.at, EXCLUDED.at), updated_at = EXCLUDED.updated_at
"""
_LAST_SUCCESSES_SQL = "SELECT tenant_id, max(at) FROM tenant_successes GROUP BY tenant_id"
_SUCCESS_FOLD_SQL = """
WITH gone AS (
    DELETE FROM tenant_successes
    WHERE node_id <> %(retired)s AND updated_at < now() - make_interval(secs => %(after)s)
    RETURNING tenant_id, at
)
INSERT INTO tenant_successes (node_id, tenant_id, at, updated_at)
SELECT %(retired)s, tenant_id, max(at), now() FROM gone GROUP BY tenant_id
ON CONFLICT (node_id, tenant_id)
DO UPDATE SET at = GREATEST(tenant_successes.at, EXCLUDED.at), updated_at = EXCLUDED.updated_at
"""


class Tally:
    """One process's counts since its last flush. `add` may be called from any thread."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._pending: Counter[tuple[str, str]] = Counter()
        self._successes: dict[int, datetime] = {}
        self._lock = threading.Lock()

    def succeeded(self, tenant_id: int, at: datetime) -> None:
        """A run of `tenant_id` succeeded, finished at `at` (its finished_at)."""
        with self._lock:
            if tenant_id not in self._successes or at > self._successes[tenant_id]:
                self._successes[tenant_id] = at

    def add(self, spec: Spec, n: int = 1, *, label: str = "") -> None:
        if n > 0:
            with self._lock:
                self._pending[(spec.name, label)] += n

    def _take(self) -> Counter[tuple[str, str]]:
        with self._lock:
            taken, self._pending = self._pending, Counter()
        return taken

    def _give_back(self, taken: Counter[tuple[str, str]]) -> None:
        with self._lock:
            self._pending.update(taken)

    def _take_successes(self) -> dict[int, datetime]:
        with self._lock:
            taken, self._successes = self._successes, {}
        return taken

    def _give_back_successes(self, taken: dict[int, datetime]) -> None:
        for tenant_id, at in taken.items():
            self.succeeded(tenant_id, at)

    def _success_params(self, taken: dict[int, datetime]) -> dict:
        tenants = sorted(taken)
        return {"node_id": self.node_id, "tenants": tenants, "ats": [taken[t] for t in tenants]}

    def _params(self, taken: Counter[tuple[str, str]]) -> dict:
        keys = sorted(taken)
        return {
            "node_id": self.node_id,
            "names": [name for name, _ in keys],
            "labels": [label for _, label in keys],
            "values": [taken[key] for key in keys],
        }

    def _writes(self) -> Iterator[tuple[str, dict]]:
        """What a flush writes, one statement at a time (nothing when nothing is pending).
        Each is taken as written when the caller asks for the next; a flush that stops at
        an error gives that statement's data and the rest back to the tally."""
        statements: list[tuple[str, dict, Callable[[], None]]] = []
        taken = self._take()
        if taken:
            statements.append((_FLUSH_SQL, self._params(taken), lambda: self._give_back(taken)))
        successes = self._take_successes()
        if successes:
            statements.append(
                (
                    _SUCCESS_FLUSH_SQL,
                    self._success_params(successes),
                    lambda: self._give_back_successes(successes),
                )
            )
        written = 0
        try:
            for sql, params, _ in statements:
                yield sql, params
                written += 1
        finally:
            for _, _, give_back in statements[written:]:
                give_back()

    def flush(self, cursor) -> None:
        """Write what was counted since the last flush (a sync cursor, autocommit or a
        transaction of its own). On an error the counts stay pending for the next flush."""
        with closing(self._writes()) as writes:
            for sql, params in writes:
                cursor.execute(sql, params)

    async def flush_async(self, conn) -> None:
        """`flush` on an async autocommit connection (the executor's node connection)."""
        with closing(self._writes()) as writes:
            for sql, params in writes:
                await conn.execute(sql, params)


def totals(cursor) -> dict[tuple[str, str], int]:
    """Every counter's total per label, summed over all processes that ever counted."""
    cursor.execute(_TOTALS_SQL)
    return {(name, label): value for name, label, value in cursor.fetchall()}


def fold_retired(cursor, *, after_seconds: float = RETIRE_AFTER_SECONDS) -> None:
    """Fold the rows of processes silent for `after_seconds` into the `(retired)` rows."""
    cursor.execute(_FOLD_SQL, {"retired": RETIRED, "after": after_seconds})
    cursor.execute(_SUCCESS_FOLD_SQL, {"retired": RETIRED, "after": after_seconds})


def forget_tenant(cursor, *, tenant_id: int) -> None:
    """A deleted tenant's newest-success rows (no foreign key: they are per process)."""
    cursor.execute("DELETE FROM tenant_successes WHERE tenant_id = %s", [tenant_id])


def last_successes(cursor) -> dict[int, datetime]:
    """Per tenant id, the finish time of its newest success any process wrote."""
    cursor.execute(_LAST_SUCCESSES_SQL)
    return dict(cursor.fetchall())


def samples(spec: Spec, found: dict[tuple[str, str], int]) -> Iterable[tuple[str, int]]:
    """(label value, total) of `spec`: every declared value (0 until counted), then any
    other value the rows hold."""
    declared = dict.fromkeys(spec.values, 0)
    for (name, label), value in found.items():
        if name == spec.name:
            declared[label] = value
    return declared.items()
