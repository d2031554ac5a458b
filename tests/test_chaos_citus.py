"""The short form of `make chaos-citus` (tests/chaos/driver.py --citus --short), in
`make test-citus`: two schedulers and two executors on a Citus coordinator + 2 workers
of the test's own, one worker crashed for 10 s (`pg_ctl stop -m immediate`), one shard
moved under load (`citus_move_shard_placement`, force_logical) and one executor stalled
past its lease; then every expected (job, slot) exists exactly once, succeeded, reached
the target, and no fenced attempt wrote a result.

The audit is tested on rows with known faults by tests/test_chaos.py; this file adds
the Citus faults. Skipped outside `make test-citus` (it starts three PostgreSQL nodes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.chaos.driver import HEALTHY_PROBLEM, NO_FENCE_PROBLEM
from tests.support.processes import ROOT

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(not os.environ.get("CRONYARD_CITUS_WORKERS"), reason="a make test-citus test"),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    workdir = tmp_path_factory.mktemp("chaos-citus")
    path = workdir / "chaos-citus.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.chaos",
            "--citus",
            "--short",
            "--report",
            str(path),
            "--workdir",
            str(workdir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=330,
    )
    if not path.exists():
        pytest.fail(f"the chaos run wrote no report:\n{(proc.stdout + proc.stderr)[-8000:]}")
    out = json.loads(path.read_text())
    out["output"] = (proc.stdout + proc.stderr)[-8000:]
    return out


def test_worker_crash_and_shard_move_keep_exactly_once(report):
    assert report["chaos actions"] == {"stop worker": 1, "move shard": 1, "stall executor": 1}
    # The healthy workers' rate is the next test's. Not this short form's to hold: that
    # the one executor stall caught a run in flight to fence. In a 7 s stall at a few runs
    # a second it sometimes holds none (0 duplicates, 0 fenced writes all the same);
    # make chaos-citus, with its many stalls, requires it.
    not_here = {HEALTHY_PROBLEM, NO_FENCE_PROBLEM}
    problems = {k: n for k, n in report["problems"].items() if k not in not_here}
    assert problems == {}, report["output"]
    assert report["runs"] == report["expected (job, slot)"] > 0


def test_jobs_on_the_healthy_workers_keep_firing_while_one_worker_is_down(report):
    (outage,) = [f for f in report["faults"] if f["action"] == "stop worker"]
    assert outage["healthy jobs"]["healthy during / before"] >= 0.5, outage
