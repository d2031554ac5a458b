"""The short form of `make chaos` (tests/chaos/driver.py): two schedulers and two
executors on a private PostgreSQL cluster, one SIGKILL and one SIGSTOP past the lease
of each kind, a database restart and a 5 s database outage; then every expected
(job, slot) exists exactly once, succeeded, reached the target, and no fenced
attempt wrote a result.

The audit itself is checked first on rows with known faults, so a chaos run that
passes is known to be able to fail.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from runs.keys import run_key
from tests.support.exactly_once import audit
from tests.support.processes import ROOT

JOB = uuid.uuid4()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SLOTS = [T0 + timedelta(seconds=5 * i) for i in range(4)]


def run_row(at: datetime, status: str, attempt: int, history: list) -> tuple:
    """A row of RUN_FIELDS: the history, then the columns a stored-less success is read from."""
    return (JOB, at, status, attempt, "schedule", history, "exec-1", at, at + timedelta(seconds=1), 200, "")


def ok_run(at: datetime, attempt: int = 1, history: list | None = None) -> tuple:
    history = history or [{"attempt": attempt, "outcome": "succeeded"}]
    return run_row(at, "succeeded", attempt, history)


def seen_all(runs) -> set[tuple[str, str]]:
    return {(run_key(r[0], r[1]), str(r[3])) for r in runs}


def test_the_audit_passes_a_clean_run():
    # The last one as stored today: a first-attempt success keeps no history entry.
    runs = [ok_run(at) for at in SLOTS[:-1]] + [run_row(SLOTS[-1], "succeeded", 1, [])]
    assert audit(runs, expected={(JOB, at) for at in SLOTS}, seen=seen_all(runs)).problems == {}


@pytest.mark.parametrize(
    "fault, problem",
    [
        ("duplicate", "duplicate (job, slot)"),
        ("gap", "missing (job, slot)"),
        ("extra", "(job, slot) off the expected grid"),
        ("dead", "runs not succeeded"),
        ("fenced write", "results written by a fenced attempt"),
        ("never called", "run keys never seen by the target"),
    ],
)
def test_the_audit_finds_each_kind_of_fault(fault, problem):
    runs = [ok_run(at) for at in SLOTS]
    expected = {(JOB, at) for at in SLOTS}
    seen = seen_all(runs)
    if fault == "duplicate":
        runs.append(ok_run(SLOTS[0]))
    elif fault == "gap":
        runs.pop()
    elif fault == "extra":
        runs.append(ok_run(SLOTS[-1] + timedelta(seconds=1)))
        seen = seen_all(runs)
    elif fault == "dead":
        runs[0] = run_row(SLOTS[0], "dead", 1, [{"attempt": 1, "outcome": "dead"}])
    elif fault == "fenced write":
        # Attempt 1 was reclaimed, yet its worker's success is what the run holds.
        history = [{"attempt": 1, "outcome": "lease expired"}, {"attempt": 1, "outcome": "succeeded"}]
        runs[0] = run_row(SLOTS[0], "succeeded", 2, history)
        seen = seen_all(runs)
    elif fault == "never called":
        seen = seen_all(runs[1:])
    assert problem in audit(runs, expected=expected, seen=seen).problems


@pytest.mark.processes
def test_short_chaos_run_keeps_exactly_once(tmp_path):
    report = tmp_path / "chaos.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.chaos", "--short", "--report", str(report), "--workdir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-8000:]
    assert "PASS" in proc.stdout


def synthetic_arrivals(
    *, down: tuple[float, float], stopped: set[str], jobs: list[str], backlog: float = 0
) -> dict[str, float]:
    """One slot per job per second from T0; each arrives 0.5 s late, except that the
    `stopped` jobs' slots due while `down` arrive all at once when it ends, and those
    due in the `backlog` seconds after it 5 s late."""
    first_seen = {}
    for second in range(200):
        for job in jobs:
            at = T0 + timedelta(seconds=second)
            arrived = at.timestamp() + 0.5
            if job in stopped and down[0] <= arrived < down[1]:
                arrived = down[1] + 0.1
            elif job in stopped and down[1] <= at.timestamp() < down[1] + backlog:
                arrived = at.timestamp() + 5
            first_seen[run_key(job, at)] = arrived
    return first_seen


def test_the_chaos_measures_healing_and_the_healthy_share_of_an_outage():
    from tests.chaos import measure

    jobs = [str(uuid.UUID(int=i)) for i in range(10)]
    start, end = T0.timestamp() + 100, T0.timestamp() + 120
    everything = measure.Timeline(
        measure.arrivals(synthetic_arrivals(down=(start, end), stopped=set(jobs), jobs=jobs, backlog=10))
    )
    heal = everything.heal(start=start, end=end, horizon=T0.timestamp() + 200)
    assert heal["requests/s before"] == 10.0 and heal["lowest requests/s over 5 s during"] == 0.0
    # The backlog arrives at once (the rate is back); the slots due in the 10 s after
    # the outage are still 5 s late (not on time yet).
    assert heal["rate back after s"] == 0.0 and heal["on time after s"] == 10.0
    outage = {"down from": start, "down until": end}
    placement = {job: "w1" if i < 5 else "w2" for i, job in enumerate(jobs)}
    ratio = measure.shard_outage_ratio(everything, outage=outage, placement=placement, down="w1")
    assert ratio["healthy during / before"] == 0.0
    half = measure.Timeline(
        measure.arrivals(synthetic_arrivals(down=(start, end), stopped=set(jobs[:5]), jobs=jobs))
    )
    ratio = measure.shard_outage_ratio(half, outage=outage, placement=placement, down="w1")
    assert ratio["healthy during / before"] == 1.0 and ratio["stopped jobs' requests/s during"] == 0.0
