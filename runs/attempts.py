"""Attempts: how many a run has used and when they are used up (`used`, `used_up`, their
SQL forms `sql_used`, `sql_used_up`, and `used` as a query expression, `orm_used`), and
one attempt's entry in `job_runs.attempts`: the only definition of its keys and format.

Attempts used is `attempt - deferrals`: the attempt number is the fencing token, taken
by every claim, and a claim that put its run back unsent (a breaker's or a retry
budget's deferral, an unsent claimed-ahead run at shutdown) adds one to `deferrals`.
They are used up at `max_attempts`: a failed call (runs/execution/retry.decide), an
expired lease (the reaping SQL, runs/execution/run_leases.py) and a hand-back
(runs/execution/inflight.hand_back_completion) then end the run `dead`
(docs/decisions/0037-attempts-used.md).

Three writers build an entry: the executor (an answered or handed-back call, in Python), an
operator's cancel (runs/services.py, in Python) and two SQL statements (a reaped lease,
REAP, and a cancel by a newer run, CLAIM, both in runs/execution/queries.py). Python
writers store `AttemptRecord.to_stored()`, SQL writers `sql_entry()`; both give the same
values in the same formats.

The stored entry is a JSON array of the values in `FIELDS` order, not an object: the
keys were more than half of an entry's bytes, repeated in every entry of every retried
run (docs/decisions/0004-attempt-history.md). In it:

- timestamps: integer microseconds since the Unix epoch (UTC), which `extract(epoch ...)`
  gives exactly in SQL and which take about fifteen bytes less than the text;
- `duration_ms`: a float rounded to 0.1 ms, null when unknown;
- `retry_in_s`: seconds until the retry may start, rounded to ms; null when there is
  no retry.

Rows stored before that hold objects with the same keys and RFC 3339 text timestamps
(seconds-only in the oldest): they are read as stored, never rewritten. A later field
is appended at the end of the array, so an entry shorter than `FIELDS` reads its
missing values as null, as an old object does its missing keys.

A run that succeeds on the first attempt that sent a call (its history is still empty
when that success is written) stores no entry: its own columns (`attempt`, `owner`,
`started_at`, `finished_at`, `result_code`, `last_error`) already say everything the
entry would. The outcome write keeps that rule in SQL (`sql_append`); every other entry
is stored, so a history that has one is complete, including a success after earlier
entries. That success is kept because a run with earlier entries is the only kind an
attempt that lost its run (a reaped lease, a cancel) could still try to finish: its
stored success names the attempt that wrote it, which is how the exactly-once audit
sees a write that got past the fence (tests/support/exactly_once.py). The synthesized
entry's times are the run's columns: `started_at` is the claim, `finished_at` the
outcome write, and `duration_ms` their difference (a stored entry's duration is the
executor's own measure of the call, a little shorter).

Readers take `history()`, the one way to read a run's history for display and counting:
the stored entries through `from_stored()` (in either shape, every key present), or the
entry synthesized from a succeeded run's columns when none is stored. SQL readers of an
entry's outcome use `sql_outcome()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Protocol

from django.db.models import F
from django.db.models.expressions import CombinedExpression


def used(*, attempt: int, deferrals: int) -> int:
    """Attempts a run has used: its attempt number less the claims that sent nothing."""
    return attempt - deferrals


def used_up(*, used: int, max_attempts: int) -> bool:
    """Whether `used` attempts leave none: the next failure ends the run dead."""
    return used >= max_attempts


def orm_used() -> CombinedExpression:
    """`used` as a query expression over job_runs (annotations, aggregates)."""
    return F("attempt") - F("deferrals")


def sql_used(alias: str) -> str:
    """`used` in SQL, of the job_runs row `alias` (a trusted constant of a statement)."""
    return f"({alias}.attempt - {alias}.deferrals)"


def sql_used_up(alias: str) -> str:
    """`used_up` in SQL, of the job_runs row `alias`: a boolean expression."""
    return f"({sql_used(alias)} >= {alias}.max_attempts)"


def format_moment(moment: datetime) -> str:
    """How readers show an entry's timestamp: RFC 3339 UTC, always with microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros(moment: datetime) -> int:
    """A stored timestamp: microseconds since the Unix epoch (exact, no float)."""
    return (moment - _EPOCH) // _MICROSECOND


def from_micros(value: int) -> datetime:
    return _EPOCH + value * _MICROSECOND


# Outcomes the run comes back to the queue after. Only RETRIED says the target failed
# the call (or it could not be sent) and the run retries on its own: what a host's retry
# budget counts (runs/execution/inflight.is_retry). The others are our side's doing: the executor
# stopped heartbeating (its lease was reaped) or shut down mid-call; an operator's
# replay follows whatever ended the run.
RETRIED = "retry"
LEASE_EXPIRED = "lease expired"
HANDED_BACK = "handed back"
# The outcome (and status) of an attempt that succeeded.
SUCCEEDED = "succeeded"


@dataclass(frozen=True)
class AttemptRecord:
    attempt: int
    owner: str | None
    started_at: datetime | None
    finished_at: datetime | None
    duration_ms: float | None
    outcome: str
    result_code: int | None
    error: str
    retry_in_s: float | None

    def to_stored(self) -> list:
        """The stored entry (the module docstring), in FIELDS order whatever the order
        of the fields here. No request headers, ever: they may carry the target's secrets."""
        values = self._values(micros)
        return [values[name] for name in FIELDS]

    def to_display(self) -> dict:
        """The entry as readers show it: every key, timestamps as RFC 3339 text."""
        return self._values(format_moment)

    def _values(self, moment: Callable[[datetime], object]) -> dict:
        """Every field by name, timestamps through `moment`, durations rounded."""
        # vars(), not asdict(): asdict deep-copies every field.
        return {
            **vars(self),
            "started_at": None if self.started_at is None else moment(self.started_at),
            "finished_at": None if self.finished_at is None else moment(self.finished_at),
            "duration_ms": _rounded(self.duration_ms, 1),
            "retry_in_s": _rounded(self.retry_in_s, 3),
        }


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(float(value), digits)


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(AttemptRecord))


_TIMESTAMPS = ("started_at", "finished_at")
# Where the outcome is in a stored array (SQL readers: sql_outcome).
OUTCOME_AT = FIELDS.index("outcome")


def from_stored(entry: object) -> dict | None:
    """A stored entry for display: every key of FIELDS present (null when an older entry
    lacks it), timestamps as RFC 3339 text. An array is read by position (values past
    FIELDS, a later version's, are left out); an object, the shape rows stored before
    arrays hold, as stored, keys this module does not know kept. None for anything else."""
    if isinstance(entry, dict):
        return {**dict.fromkeys(FIELDS), **entry}
    if not isinstance(entry, list):
        return None
    shown = dict(zip(FIELDS, entry, strict=False))
    for key in _TIMESTAMPS:
        if isinstance(shown.get(key), int):
            shown[key] = format_moment(from_micros(shown[key]))
    return {**dict.fromkeys(FIELDS), **shown}


class Run(Protocol):
    """What `history` reads of a run (a runs.models.JobRun)."""

    status: str
    attempts: list
    attempt: int
    owner: str
    started_at: datetime | None
    finished_at: datetime | None
    result_code: int | None
    last_error: str


def history(run: Run) -> list[dict]:
    """A run's attempts history for display and counting: its stored entries, or, for a
    succeeded run that stored none, the one entry its columns say (what `AttemptRecord`
    would have stored, with the module docstring's times)."""
    if run.attempts or run.status != SUCCEEDED:
        return [e for e in map(from_stored, run.attempts or []) if e is not None]
    started, finished = run.started_at, run.finished_at
    return [
        AttemptRecord(
            attempt=run.attempt,
            owner=run.owner,
            started_at=started,
            finished_at=finished,
            duration_ms=(finished - started).total_seconds() * 1000 if started and finished else None,
            outcome=SUCCEEDED,
            result_code=run.result_code,
            error=run.last_error,
            retry_in_s=None,
        ).to_display()
    ]


_MICROS_SQL = "(extract(epoch FROM ({expr})) * 1000000)::bigint"


def sql_entry(
    *,
    attempt: str,
    owner: str,
    started_at: str,
    finished_at: str,
    duration_ms: str,
    outcome: str,
    result_code: str,
    error: str,
    retry_in_s: str,
) -> str:
    """The `jsonb_build_array(...)` of one stored entry, from SQL expressions (trusted
    constants of runs/execution/queries.py, never user input). Timestamps are
    timestamptz expressions and are stored here as `to_stored` stores them; every value
    must be given, so a new field cannot be forgotten in SQL."""
    values = {
        "attempt": attempt,
        "owner": owner,
        "started_at": "NULL" if started_at == "NULL" else _MICROS_SQL.format(expr=started_at),
        "finished_at": "NULL" if finished_at == "NULL" else _MICROS_SQL.format(expr=finished_at),
        "duration_ms": duration_ms,
        "outcome": outcome,
        "result_code": result_code,
        "error": error,
        "retry_in_s": retry_in_s,
    }
    assert tuple(values) == FIELDS, "sql_entry and AttemptRecord disagree"
    return "jsonb_build_array(" + ", ".join(values.values()) + ")"


def sql_outcome(entry: str) -> str:
    """The outcome of the stored entry `entry` (a trusted jsonb expression), in either
    stored shape: `->>` by position is null on an object, by key null on an array."""
    return f"coalesce(({entry}) ->> {OUTCOME_AT}, ({entry}) ->> 'outcome')"


def sql_append(*, history: str, entry: str, status: str) -> str:
    """The history after an outcome write, in SQL: `history` (the row's jsonb array) with
    `entry` (a one-entry jsonb array) appended, except a success with no history before
    it, which stores nothing (the module docstring). Arguments are trusted SQL
    expressions of runs/execution/queries.py."""
    return (
        f"CASE WHEN {status} = '{SUCCEEDED}' AND {history} = '[]'::jsonb"
        f" THEN {history} ELSE {history} || {entry} END"
    )


def sql_duration_ms(*, started: str, finished: str) -> str:
    """duration_ms in SQL, rounded like AttemptRecord.to_stored()."""
    return f"round((extract(epoch FROM ({finished}) - ({started})) * 1000)::numeric, 1)"
