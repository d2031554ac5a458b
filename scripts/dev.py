"""`make run` / `make test` / `make bench` after the venv exists: database, migrate, go.

Without DATABASE_URL an embedded PostgreSQL cluster under var/pg is started
(scripts/embedded_pg.py) and stopped again on exit if this process started it.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
PY = sys.executable
sys.path.insert(0, str(ROOT))

from scheduler_project import serve  # noqa: E402  (needs ROOT on sys.path)


def log(message: str) -> None:
    print(f"cronyard: {message}", file=sys.stderr, flush=True)


def ensure_database() -> bool:
    """Export DATABASE_URL; return True when we started the embedded cluster."""
    if os.environ.get("DATABASE_URL"):
        log("using DATABASE_URL from the environment")
        return False
    already = subprocess.run(
        [sys.executable, "scripts/embedded_pg.py", "url"], cwd=ROOT, capture_output=True, text=True
    )
    result = subprocess.run(
        [sys.executable, "scripts/embedded_pg.py", "start"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    if result.returncode != 0:
        sys.exit(result.returncode)
    os.environ["DATABASE_URL"] = result.stdout.strip().splitlines()[-1]
    log(f"embedded PostgreSQL at {os.environ['DATABASE_URL']}")
    return already.returncode != 0


def stop_database() -> None:
    subprocess.run([sys.executable, "scripts/embedded_pg.py", "stop"], cwd=ROOT)


def manage(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "manage.py", *args], cwd=ROOT, check=True, **kwargs)


def admin_password() -> str:
    path = VAR / "admin_password"
    if path.exists():
        return path.read_text().strip()
    VAR.mkdir(exist_ok=True)
    password = secrets.token_urlsafe(12)
    path.write_text(password + "\n")
    path.chmod(0o600)
    return password


def run() -> int:
    started_db = ensure_database()
    children: list[subprocess.Popen] = []
    stopping = False

    def stop(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        manage("migrate", "--noinput", stdout=subprocess.DEVNULL)
        # WhiteNoise serves var/static from the gunicorn process, hashed and compressed.
        serve.collectstatic()
        password = admin_password()
        manage("ensure_admin", "--username", "admin", "--password", password, stdout=subprocess.DEVNULL)
        port = os.environ.get("PORT", "8000")
        # Alerts link to the console this command serves (runs/alerts.py).
        os.environ.setdefault("CRONYARD_PUBLIC_URL", f"http://127.0.0.1:{port}")
        # Children get their own process group so a terminal Ctrl-C reaches only us;
        # we then stop them in order and wait, which is what makes shutdown clean.
        popen = {"cwd": ROOT, "start_new_session": True}
        web = serve.gunicorn_command(port=int(port), workers=int(os.environ.get("WEB_WORKERS", "2")))
        children.append(subprocess.Popen(web, **popen))
        for _ in range(int(os.environ.get("SCHEDULERS", "2"))):
            children.append(subprocess.Popen([PY, "manage.py", "run_scheduler"], **popen))
        for _ in range(int(os.environ.get("EXECUTORS", "2"))):
            children.append(subprocess.Popen([PY, "manage.py", "run_executor"], **popen))
        print(
            f"\nCronyard is running: console http://127.0.0.1:{port}/admin/  API http://127.0.0.1:{port}/api/v1/\n"
            f"Admin login: admin / {password}\nCtrl-C stops everything.\n",
            flush=True,
        )
        while not stopping:
            for child in children:
                if child.poll() is not None:
                    name = " ".join(str(a) for a in child.args[1:3])
                    log(f"{name} exited with {child.returncode}; stopping everything")
                    stopping = True
            time.sleep(0.5)
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
        if started_db:
            stop_database()
        log("stopped")
    return 0


def test(args: list[str]) -> int:
    started_db = ensure_database()
    try:
        # Files are the unit of distribution: module-scoped fixtures stay in one worker.
        workers = ["-n", os.environ.get("PYTEST_WORKERS", "auto"), "--dist", "loadfile"]
        result = subprocess.run([PY, "-m", "pytest", *workers, *args], cwd=ROOT)
    finally:
        if started_db:
            stop_database()
    if result.returncode == 5:
        log("pytest collected no tests; that is a failure here")
        return 1
    return result.returncode


# What `make test-citus` runs on the local Citus cluster: the database-facing files (keys
# and distribution, dispatch, the ledger, the API's jobs and runs, retention, every
# console page, the executor's claim and fencing), the exactly-once process test (schedulers and
# executors SIGKILLed and SIGSTOPped), the short Citus chaos run (a worker crashed, a
# shard moved, on a cluster of its own) and dispatch with one worker down (the same).
CITUS_TESTS = (
    "tests/test_partition_keys.py",
    "tests/test_citus_retention.py",
    "tests/test_partitions.py",
    "tests/test_scheduler_unit.py",
    "tests/test_scheduler_misfire.py",
    "tests/test_scheduler_backlog.py",
    "tests/test_scheduler_processes.py",
    "tests/test_ledger.py",
    "tests/test_api_jobs.py",
    "tests/test_runs_api.py",
    "tests/test_job_edits.py",
    "tests/test_clock_and_pause.py",
    "tests/test_services_races.py",
    "tests/test_runs_admin.py",
    "tests/test_console_pages.py",
    "tests/test_admin_jobs.py",
    "tests/test_admin_lists.py",
    "tests/test_job_page.py",
    "tests/test_audit.py",
    "tests/test_dashboard_charts.py",
    "tests/test_executor_claims.py",
    "tests/test_claim_races.py",
    "tests/test_spare_holds.py",
    "tests/test_open_floors.py",
    "tests/test_executor_cancel_previous.py",
    "tests/test_job_targets.py",
    "tests/test_executor_fairness.py",
    "tests/test_executor_fencing.py",
    "tests/test_executor_reaping.py",
    "tests/test_citus_statistics.py",
    "tests/test_exactly_once.py",
    "tests/test_job_health.py",
    "tests/test_run_history.py",
    "tests/test_chaos_citus.py",
    "tests/test_citus_worker_down.py",
)
# A short dispatch, execute and claim latency run: enough to see Citus's overhead, not a benchmark.
# The raw dispatch loop too (--with-limit): `make bench`'s Citus rows run it there.
CITUS_BENCH = (
    (
        "dispatch.py",
        "--jobs",
        "10000",
        "--schedulers",
        "1",
        "--with-limit",
        "--db",
        "cronyard_bench_dispatch",
    ),
    ("execute.py", "--runs", "2000", "--executors", "1", "--kinds", "task"),
    ("claims.py", "--runs", "2000"),
)


def citus(command: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "scripts/citus_cluster.py", command, *args], cwd=ROOT, **kwargs)


# A bench that cannot make progress (a statement Citus refuses) would wait out its
# own long deadline; this one is generous for 10k jobs or 2k runs on a loaded machine.
CITUS_BENCH_SECONDS = int(os.environ.get("CITUS_BENCH_SECONDS", "300"))


def bench_script(script: str, args: list[str], *, env: dict) -> bool:
    """Run bench/<script> in a process group of its own; on timeout stop it and its
    schedulers or executors. True if it finished with exit status 0."""
    proc = subprocess.Popen([PY, f"bench/{script}", *args], cwd=ROOT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=CITUS_BENCH_SECONDS) == 0
    except subprocess.TimeoutExpired:
        log(f"{script} made no progress in {CITUS_BENCH_SECONDS}s; stopping it")
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # Its executors may still be handing runs back to a database that refuses them:
        # give them a moment, then nothing of the group survives the cluster's stop.
        time.sleep(5)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return False


def test_citus(args: list[str]) -> int:
    """Start the local Citus cluster, run CITUS_TESTS (or `args`) and the short bench, stop it."""
    started = citus("start", stdout=subprocess.PIPE, text=True)
    if started.returncode != 0:
        return started.returncode  # citus_cluster.py said why (e.g. Citus is not installed)
    env = dict(os.environ, **dict(line.split("=", 1) for line in started.stdout.split()))
    failed = []
    try:
        workers = ["-n", os.environ.get("PYTEST_WORKERS", "auto"), "--dist", "loadfile"]
        # The tests that start schedulers and executors run one at a time, after the
        # others: two of them side by side, besides three PostgreSQL nodes, overload a
        # 2-core machine to the point where each one's timing margins fail.
        phases = (
            [[*workers, *args]]
            if args
            else [
                [*workers, "-m", "not processes", *CITUS_TESTS],
                ["-p", "no:xdist", "-m", "processes", *CITUS_TESTS],
            ]
        )
        for phase in phases:
            if subprocess.run([PY, "-m", "pytest", *phase], cwd=ROOT, env=env).returncode:
                failed.append("tests")
                break
        # bench/execute.py uses the cluster's own database as is; bench/dispatch.py
        # migrates a scratch one, which must be a Citus database first.
        manage("migrate", "--noinput", env=env, stdout=subprocess.DEVNULL)
        citus("createdb", "cronyard_bench_dispatch", check=True)
        for script, *bench_args in CITUS_BENCH:
            log(f"Citus bench: {script} {' '.join(bench_args)}")
            if not bench_script(script, bench_args, env=env):
                failed.append(script)
    finally:
        citus("stop")
    if failed:
        log(f"make test-citus failed: {', '.join(failed)}")
    return 1 if failed else 0


def bench(args: list[str]) -> int:
    started_db = ensure_database()
    try:
        manage("migrate", "--noinput", stdout=subprocess.DEVNULL)
        return subprocess.run([PY, "-m", "bench", *args], cwd=ROOT).returncode
    finally:
        if started_db:
            stop_database()


if __name__ == "__main__":
    command, rest = sys.argv[1], sys.argv[2:]
    commands = {
        "run": lambda: run(),
        "test": lambda: test(rest),
        "test-citus": lambda: test_citus(rest),
        "bench": lambda: bench(rest),
    }
    sys.exit(commands[command]())
