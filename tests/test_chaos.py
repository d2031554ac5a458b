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


def ok_run(at: datetime, attempt: int = 1, history: list | None = None) -> tuple:
    history = history or [{"attempt": attempt, "outcome": "succeeded"}]
    return (JOB, at, "succeeded", attempt, "schedule", history)


def seen_all(runs) -> set[tuple[str, str]]:
    return {(run_key(r[0], r[1]), str(r[3])) for r in runs}


def test_the_audit_passes_a_clean_run():
    runs = [ok_run(at) for at in SLOTS]
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
        runs[0] = (JOB, SLOTS[0], "dead", 1, "schedule", [{"attempt": 1, "outcome": "dead"}])
    elif fault == "fenced write":
        # Attempt 1 was reclaimed, yet its worker's success is what the run holds.
        history = [{"attempt": 1, "outcome": "lease expired"}, {"attempt": 1, "outcome": "succeeded"}]
        runs[0] = (JOB, SLOTS[0], "succeeded", 2, "schedule", history)
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
