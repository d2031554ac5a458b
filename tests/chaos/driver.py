"""Chaos driver: real schedulers and executors on a private PostgreSQL cluster, killed,
stalled and cut off from the database while interval jobs fire against a local HTTP
target; afterwards every expected (job, slot) must exist exactly once and succeed.

    python -m tests.chaos --duration 720 --jobs 5000        # make chaos
    python -m tests.chaos --short                           # the form in make test
    python -m tests.chaos --citus                           # make chaos-citus
    python -m tests.chaos --citus --short                   # the form in make test-citus

The window of slots is closed with end_at (set when the jobs are made), so the
expected set is exact: every anchor + k*interval <= end_at, nothing else. Jobs use
misfire_policy catch_up with a threshold far above the outages, so a late slot is
fired late, never dropped. Exit status 0 when every check holds; the counts are
printed either way and written as JSON (--report).

With --citus the database is a Citus coordinator + 2 workers of the run's own
(tests/support/private_pg.py PrivateCitus) and the faults include a worker crashed for
--worker-outage seconds, the coordinator restarted, a shard moved under load and a
third worker added and rebalanced (tests/chaos/citus.py). Either way the report holds
how long each fault took to heal, and with --citus the request rate of the jobs on
the healthy workers during the worker outage against before it (tests/chaos/measure.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.chaos import citus as citus_faults
from tests.chaos import measure
from tests.support.http_target import HttpTarget, Reply
from tests.support.private_pg import PrivateCitus, PrivatePg, wait_port_closed
from tests.support.processes import ROOT, Processes


@dataclass
class Params:
    duration: float = 720.0  # seconds of slots (the end_at window)
    jobs: int = 5000
    schedulers: int = 2
    executors: int = 3
    concurrency: int = 64
    interval_min: int = 5
    interval_max: int = 10
    lease: int = 5
    chaos_every: float = 12.0  # seconds between random kills/stalls
    db_outage: float = 20.0  # the one long stop of PostgreSQL
    drain_timeout: float = 600.0
    seed: int = 1
    slow_share: float = 0.1  # jobs whose call takes 2 s: kills and stalls catch them in flight
    script: list[tuple[float, str]] | None = None  # fixed (at, action) list instead of random chaos
    # Executors claim one tenant's runs at a time (runs/execution/claims.py): more
    # tenants, more claims side by side.
    tenants: int = 1
    citus: bool = False  # a private Citus cluster and its node faults (tests/chaos/citus.py)
    worker_outage: float = 20.0  # seconds a Citus worker stays down


SHORT = dict(
    duration=70.0,
    jobs=200,
    schedulers=2,
    executors=2,
    concurrency=16,
    interval_min=3,
    interval_max=6,
    lease=3,
    db_outage=5.0,
    drain_timeout=120.0,
    # One of each kind, spaced so that the system is back to normal in between.
    script=[
        (8, "kill scheduler"),
        (14, "kill executor"),
        (20, "stall executor"),
        (30, "stall scheduler"),
        (40, "restart database"),
        (50, "stop database"),
    ],
)


# make chaos-citus: 2,000 jobs over 8 tenants, each every 4-8 minutes: about 5.6 runs/s,
# below what executors on Citus keep up with on one 2-core machine that also runs the
# coordinator and three workers (each claim reads every shard under its tenant's claim
# lock: 7-10 runs/s here with other work on the machine, docs/SCALING.md). Above that
# every slot is late and gets later, and no fault could be seen to heal. The four node
# faults at fixed points, kills and stalls between.
CITUS = dict(jobs=2000, tenants=8, interval_min=240, interval_max=480, chaos_every=20.0)
CITUS_FAULTS = [
    (0.2, "stop worker"),
    (0.38, "move shard"),
    (0.55, "restart coordinator"),
    (0.7, "add worker"),
]

# The short form in make test-citus (tests/test_chaos_citus.py): one worker outage, one
# shard move, one stall past the lease (fencing is exercised), each with room to heal.
SHORT_CITUS = dict(
    SHORT,
    citus=True,
    duration=80.0,
    jobs=60,
    tenants=4,
    interval_min=8,
    interval_max=16,
    worker_outage=10.0,
    script=[(25, "stop worker"), (50, "move shard"), (62, "stall executor")],
)


# One shard down is not everything down: while a worker is stopped, the jobs whose
# shards are on the other workers keep at least this share of their request rate.
HEALTHY_SHARE = 0.5
NO_FENCE_PROBLEM = "chaos never reclaimed a run and fenced its old attempt"
HEALTHY_PROBLEM = "jobs on the healthy workers slowed below half while one worker was down"


@dataclass
class Record:
    actions: Counter = field(default_factory=Counter)
    unexpected_exits: list[str] = field(default_factory=list)
    timeline: list[str] = field(default_factory=list)
    # Each fault as {action, start, end (epoch seconds), what it did}: for measure.py.
    faults: list[dict] = field(default_factory=list)


def say(message: str) -> None:
    print(f"chaos {datetime.now(UTC):%H:%M:%S} {message}", flush=True)


class Cluster:
    """The processes under test, replaced when killed."""

    def __init__(self, processes: Processes, params: Params, record: Record) -> None:
        self.processes = processes
        self.params = params
        self.record = record
        # str(job id) -> partition_id, and -> the worker holding it when one was stopped.
        self.job_partitions: dict[str, int] = {}
        self.placement: dict[str, str] = {}
        self.schedulers = [self._start("scheduler") for _ in range(params.schedulers)]
        self.executors = [self._start("executor") for _ in range(params.executors)]

    def _start(self, kind: str) -> subprocess.Popen:
        if kind == "scheduler":
            return self.processes.start("run_scheduler")
        return self.processes.start("run_executor", "--concurrency", str(self.params.concurrency))

    def group(self, kind: str) -> list[subprocess.Popen]:
        return self.schedulers if kind == "scheduler" else self.executors

    def kill(self, kind: str, rng: random.Random) -> None:
        group = self.group(kind)
        i = rng.randrange(len(group))
        group[i].kill()  # SIGKILL: mid-batch, mid-call, whatever it was doing
        group[i].wait()
        group[i] = self._start(kind)

    def stall(self, kind: str, rng: random.Random, seconds: float) -> None:
        proc = rng.choice(self.group(kind))
        if kind == "executor":
            # The executor holding the most runs: a random pick on a loaded machine could
            # be one restarted a moment ago that holds nothing yet, and the stall would
            # then prove nothing about fencing (the run's own check below fails).
            proc = self._busiest_executor() or proc
        held = self._runs_of(proc) if kind == "executor" else {}
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(seconds)
        # Past the lease is not enough on a loaded machine: the other executor may not
        # have reclaimed anything yet, and a stalled executor that wakes up still holding
        # its leases proves nothing about fencing. Stay stopped until one of its runs has
        # a newer attempt (bounded: the run's own check reports a stall that never was).
        deadline = time.monotonic() + 30
        while held and not self._reclaimed(held) and time.monotonic() < deadline:
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGCONT)

    def _runs_of(self, proc: subprocess.Popen) -> dict[tuple, int]:
        """{(job_id, scheduled_at): attempt} of the runs `proc` is running now."""
        from django.db import DatabaseError, connection

        from runs.models import JobRun

        try:
            rows = JobRun.objects.filter(status="running", owner__contains=f":{proc.pid}:").values_list(
                "job_id", "scheduled_at", "attempt"
            )
            return {(job_id, at): attempt for job_id, at, attempt in rows}
        except DatabaseError:
            connection.close()
            return {}

    def _reclaimed(self, held: dict[tuple, int]) -> bool:
        """Whether any of `held` (runs a stalled process had) has moved to a newer attempt."""
        from django.db import DatabaseError, connection

        from runs.models import JobRun

        job_ids = {job_id for job_id, _ in held}
        try:
            rows = JobRun.objects.filter(job_id__in=job_ids).values_list("job_id", "scheduled_at", "attempt")
            return any(attempt > held.get((job_id, at), attempt) for job_id, at, attempt in rows)
        except DatabaseError:
            connection.close()
            return False

    def _busiest_executor(self) -> subprocess.Popen | None:
        """The executor process with the most running runs (its pid is in the owner id)."""
        from django.db import DatabaseError, connection

        from runs.models import JobRun

        try:
            owners = Counter(JobRun.objects.filter(status="running").values_list("owner", flat=True))
        except DatabaseError:
            connection.close()
            return None
        by_pid = Counter()
        for owner, n in owners.items():
            parts = owner.split(":")
            if len(parts) >= 3 and parts[-2].isdigit():
                by_pid[int(parts[-2])] += n
        running = [p for p in self.group("executor") if p.poll() is None and by_pid[p.pid] > 0]
        return max(running, key=lambda p: by_pid[p.pid], default=None)

    def check_alive(self) -> None:
        """A process that died on its own is a finding; replace it so the run goes on."""
        for kind in ("scheduler", "executor"):
            group = self.group(kind)
            for i, proc in enumerate(group):
                if proc.poll() is not None:
                    tail = self.processes.log_of(proc)[-1500:]
                    self.record.unexpected_exits.append(f"{kind} exited {proc.returncode}: {tail}")
                    say(f"{kind} pid {proc.pid} exited on its own ({proc.returncode}); restarting")
                    group[i] = self._start(kind)

    def all(self) -> list[subprocess.Popen]:
        return self.schedulers + self.executors


def make_jobs(params: Params, target: HttpTarget, *, start: datetime, end: datetime):
    from jobs.tenant_services import create_tenant
    from tests.support.scheduler import bulk_interval_jobs

    rng = random.Random(params.seed)
    anchors = []
    for _ in range(params.jobs):
        interval = rng.randint(params.interval_min, params.interval_max)
        anchors.append((start + timedelta(milliseconds=rng.randrange(interval * 1000)), interval))
    # Calls of two seconds for some: a killed or stalled executor always has runs in
    # flight, so reclaiming and fencing are exercised, not just restarts.
    slow = [rng.random() < params.slow_share for _ in anchors]
    jobs = []
    for n in range(params.tenants):
        tenant, _ = create_tenant(slug=f"chaos-{os.getpid()}-{n}", max_concurrency=100_000)
        mine = list(zip(anchors, slow, strict=True))[n :: params.tenants]
        for path, is_slow in (("/hook", False), ("/slow", True)):
            jobs += bulk_interval_jobs(
                tenant,
                anchors_and_intervals=[anchor for anchor, s in mine if s == is_slow],
                target={"type": "http", "url": target.url(path), "method": "POST", "timeout_seconds": 10},
                end_at=end,
                lease_seconds=params.lease,
                max_attempts=1000,  # a run may be reclaimed many times; it must still succeed
                retry_backoff_seconds=1,
                retry_backoff_cap_seconds=2,
                overlap_policy="allow",
                misfire_policy="catch_up",
                max_catch_up=10_000,
            )
    target.script("/slow", then=Reply(delay=2.0))
    return jobs


def random_plan(params: Params, rng: random.Random) -> list[tuple[float, str]]:
    """The database (or Citus node) events at fixed points; kills and stalls at random
    between, none in the 30 s before a fixed event or the 40 s after it: the fixed
    events' healing is measured against the load just before them."""
    if params.citus:
        fixed = [(params.duration * share, action) for share, action in CITUS_FAULTS]
    else:
        fixed = [(params.duration * 0.35, "restart database"), (params.duration * 0.65, "stop database")]
    plan = list(fixed)
    at = params.chaos_every
    kinds = ["kill scheduler", "kill executor", "stall scheduler", "stall executor"]
    while at < params.duration - params.chaos_every:
        if not any(f - 30 < at < f + 40 for f, _ in fixed):
            plan.append(
                (
                    at,
                    kinds.pop(0)
                    if kinds
                    else rng.choice(
                        [
                            "kill scheduler",
                            "kill executor",
                            "kill executor",
                            "stall scheduler",
                            "stall executor",
                        ]
                    ),
                )
            )
        at += params.chaos_every * rng.uniform(0.5, 1.5)
    return sorted(plan)


def run_chaos(
    cluster: Cluster, pg: PrivatePg | PrivateCitus, params: Params, *, until: float, record: Record
) -> None:
    rng = random.Random(params.seed)
    stall = params.lease * 2 + 1  # past the lease: the stalled process must be fenced off
    t0 = time.monotonic()
    plan = list(params.script) if params.script is not None else random_plan(params, rng)
    for at, action in plan:
        while time.monotonic() - t0 < at:
            cluster.check_alive()
            time.sleep(0.5)
        if time.monotonic() > until:
            break
        say(action)
        record.actions[action] += 1
        record.timeline.append(f"{time.monotonic() - t0:7.1f}s {action}")
        fault = {"action": action, "start": time.time()}
        fault.update(act(action, cluster, pg, params, rng, stall=stall) or {})
        fault["end"] = time.time()
        record.faults.append(fault)
        # A long fault (an outage, a rebalance) pushes the rest of the plan back rather
        # than letting the events it delayed fire back to back: each heals on its own.
        t0 += max(0.0, time.monotonic() - t0 - at - 1)
    while time.monotonic() < until:
        cluster.check_alive()
        time.sleep(0.5)


def act(
    action: str, cluster: Cluster, pg, params: Params, rng: random.Random, *, stall: float
) -> dict | None:
    """Do one fault; what it returns goes into the report beside its start and end."""
    from django.db import connection

    verb, kind = action.split(" ", 1)
    if kind in ("database", "coordinator"):
        if verb == "restart":
            pg.restart()
        else:
            pg.stop()
            wait_port_closed(pg.url)
            time.sleep(params.db_outage)
            pg.start()
        connection.close()
        return None
    if verb == "kill":
        cluster.kill(kind, rng)
        return None
    if verb == "stall":
        cluster.stall(kind, rng, stall)
        return None

    def wait(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            cluster.check_alive()
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    partitions = set(cluster.job_partitions.values())
    if action == "stop worker":
        nodes = citus_faults.placements(partitions)
        cluster.placement = {job: nodes[p] for job, p in cluster.job_partitions.items()}
        connection.close()  # the driver's own session must not outlive the worker's crash
        out = citus_faults.stop_worker(pg, name="worker1", seconds=params.worker_outage, wait=wait)
        out["address"] = pg.workers[0]
        connection.close()
        return out
    if action == "move shard":
        return citus_faults.move_shard(partitions, source=pg.workers[1], destination=pg.workers[0])
    if action == "add worker":
        return citus_faults.add_worker_and_rebalance(pg, wait=wait)
    raise ValueError(f"unknown chaos action {action!r}")


def drain(job_ids, *, timeout: float, cluster: Cluster) -> bool:
    """Wait until every job is past end_at and no run is queued, retrying or running."""
    from django.db import connection

    from jobs.models import Job
    from runs.models import ACTIVE_STATUSES, JobRun

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cluster.check_alive()
        connection.close()
        pending = Job.objects.filter(id__in=job_ids, next_run_at__isnull=False).count()
        active = JobRun.objects.filter(job_id__in=job_ids, status__in=ACTIVE_STATUSES).count()
        if not pending and not active:
            return True
        say(f"draining: {pending} jobs still have slots, {active} runs active")
        time.sleep(5)
    return False


def outage_lines(processes: Processes) -> dict[str, int]:
    from scheduler_project.outage import AWAY, BACK

    logs = [processes.log_of(p) for p in processes.children]
    return {"away lines": sum(t.count(AWAY) for t in logs), "back lines": sum(t.count(BACK) for t in logs)}


def run(params: Params, *, workdir: Path, report: Path | None) -> int:
    started = time.monotonic()
    pg = PrivateCitus() if params.citus else PrivatePg()
    target = HttpTarget(keep_requests=False)
    target.start()
    record = Record()
    processes = None
    try:
        url = pg.start()
        say(f"private {'Citus coordinator' if params.citus else 'PostgreSQL'} at {url}")
        env = dict(os.environ)
        env.pop("TEST_DB_SUFFIX", None)
        # make test-citus's own cluster (test databases only): this run has its own.
        env.pop("CRONYARD_CITUS_WORKERS", None)
        env.update(
            DATABASE_URL=url,
            DJANGO_SETTINGS_MODULE="scheduler_project.settings",
            PYTHONUNBUFFERED="1",
            SCHEDULER_POLL_SECONDS="0.5",
            EXECUTOR_POLL_SECONDS="0.5",
            SCHEDULER_LEASE_SECONDS=str(params.lease),
            # Far above every outage: a late slot must fire late, not become a misfire.
            SCHEDULER_MISFIRE_THRESHOLD_SECONDS="3600",
            SCHEDULER_ALLOW_PRIVATE_TARGETS="true",
        )
        pg.migrate(env)
        os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="scheduler_project.settings")
        import django

        django.setup()

        from jobs.models import Job
        from runs.models import JobRun
        from tests.support.exactly_once import RUN_FIELDS, audit
        from tests.support.scheduler import expected_interval_slots

        start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=10)
        end = start + timedelta(seconds=params.duration)
        jobs = make_jobs(params, target, start=start, end=end)
        say(f"{len(jobs)} jobs, slots from {start:%H:%M:%S} to {end:%H:%M:%S}")
        processes = Processes(env, workdir)
        cluster = Cluster(processes, params, record)
        cluster.job_partitions = {
            str(job_id): p
            for job_id, p in Job.objects.filter(id__in=[j.id for j in jobs]).values_list("id", "partition_id")
        }
        until = time.monotonic() + (start - datetime.now(UTC)).total_seconds() + params.duration
        run_chaos(cluster, pg, params, until=until, record=record)
        say("window closed; draining")
        drained = drain([j.id for j in jobs], timeout=params.drain_timeout, cluster=cluster)
        clean_exits = []
        for proc in cluster.all():
            proc.terminate()
        for proc in cluster.all():
            try:
                clean_exits.append(proc.wait(timeout=60) == 0)
            except subprocess.TimeoutExpired:
                proc.kill()
                clean_exits.append(False)

        from django.db import connection

        connection.close()
        runs = list(JobRun.objects.filter(job_id__in=[j.id for j in jobs]).values_list(*RUN_FIELDS))
        expected = expected_interval_slots(jobs, cutoff=end)
        result = audit(runs, expected=expected, seen=target.keys)
        fenced_lines = sum(processes.log_of(p).count("fenced: attempt") for p in processes.children)
        problems = dict(result.problems)
        if not drained:
            problems["did not drain in time"] = 1
        if record.unexpected_exits:
            problems["processes that died on their own"] = len(record.unexpected_exits)
        timeline = measure.Timeline(measure.arrivals(target.first_seen))
        faults = healing(record, cluster, timeline, horizon=end.timestamp())
        stopped_worker = [f for f in faults if f["action"] == "stop worker" and "healthy jobs" in f]
        if any((f["healthy jobs"]["healthy during / before"] or 0) < HEALTHY_SHARE for f in stopped_worker):
            problems[HEALTHY_PROBLEM] = 1
        if not result.reclaimed_attempts or not fenced_lines:
            # Otherwise the run proved nothing about fencing: no kill or stall hit a call.
            problems[NO_FENCE_PROBLEM] = 1
        if not all(clean_exits):
            problems["processes that did not stop cleanly on SIGTERM"] = clean_exits.count(False)
        summary = {
            "finished_at": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "params": {k: v for k, v in vars(params).items() if k != "script"},
            "wall seconds": round(time.monotonic() - started),
            "jobs": len(jobs),
            **result.counts(),
            "target requests": target.count,
            "chaos actions": dict(record.actions),
            "executor 'fenced' log lines": fenced_lines,
            **outage_lines(processes),
            "timeline": record.timeline,
            "faults": faults,
            # [seconds after the first slot, requests/s, p90 lateness s] per 5 s.
            "requests every 5 s": timeline.series(start.timestamp(), time.time()),
            "logs": measure.log_lines({p.log_path.name: processes.log_of(p) for p in processes.children}),
            "problems": problems,
            "examples": {
                "missing": [str(s) for s in result.missing[:5]],
                "duplicates": [str(s) for s in result.duplicates[:5]],
                "fenced writes": [str(s) for s in result.fenced_writes[:3]],
                "unexpected exits": record.unexpected_exits[:3],
            },
        }
        print(json.dumps(summary, indent=2, default=str), flush=True)
        for fault in faults:
            say(
                f"{fault['action']}: took {fault['seconds']} s; rate back after"
                f" {fault.get('rate back after s')} s, on time after {fault.get('on time after s')} s"
            )
            if "healthy jobs" in fault:
                ratio = fault["healthy jobs"]["healthy during / before"]
                say(f"one worker down: the jobs on the healthy workers kept {ratio} of their request rate")
        if report:
            report.write_text(json.dumps(summary, indent=2, default=str) + "\n")
        say("PASS" if not problems else f"FAIL: {problems}")
        return 0 if not problems else 1
    finally:
        if processes is not None:
            processes.stop_all()
        target.stop()
        pg.destroy()


def healing(record: Record, cluster: Cluster, timeline: measure.Timeline, *, horizon: float) -> list[dict]:
    """Each fault with the time it took to heal; a worker outage with the rate of the
    jobs on the healthy workers during it against before it (tests/chaos/measure.py)."""
    out = []
    for fault in record.faults:
        row = {k: v for k, v in fault.items() if k not in ("start", "end", "down from", "down until")}
        row["seconds"] = round(fault["end"] - fault["start"], 1)
        row.update(timeline.heal(start=fault["start"], end=fault["end"], horizon=horizon))
        if fault["action"] == "stop worker":
            row["healthy jobs"] = measure.shard_outage_ratio(
                timeline, outage=fault, placement=cluster.placement, down=fault["address"]
            )
        out.append(row)
    return out


def parse(argv: list[str] | None) -> tuple[Params, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--short", action="store_true", help="the ~2-minute form run inside make test")
    p.add_argument("--citus", action="store_true", help="on a private Citus cluster, with node faults")
    defaults = Params()
    for name in (
        "duration",
        "jobs",
        "schedulers",
        "executors",
        "concurrency",
        "interval_min",
        "interval_max",
        "lease",
        "chaos_every",
        "db_outage",
        "drain_timeout",
        "seed",
        "worker_outage",
        "tenants",
    ):
        value = getattr(defaults, name)
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=None)
    p.add_argument("--report", type=Path, help="also write the summary as JSON here")
    p.add_argument("--workdir", type=Path, help="process logs (default: a temporary directory)")
    args = p.parse_args(argv)
    if args.citus:
        params = Params(**SHORT_CITUS) if args.short else Params(**CITUS, citus=True)
    else:
        params = Params(**SHORT) if args.short else Params()
    for name in vars(defaults):
        value = getattr(args, name, None)
        if value is not None:
            setattr(params, name, value)
    return params, args


def main(argv: list[str] | None = None) -> int:
    params, args = parse(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="chaos-", dir=ROOT / "var"))
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"logs in {workdir}")
    return run(params, workdir=workdir, report=args.report)


if __name__ == "__main__":
    sys.exit(main())
