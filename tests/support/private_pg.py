"""A PostgreSQL cluster of one's own (scripts/embedded_pg.py with --root), for tests
that stop or restart the server: the shared test cluster serves other xdist workers
and must never go down under them."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.processes import ROOT

EMBEDDED_PG = ROOT / "scripts" / "embedded_pg.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePg:
    """initdb + start on a random port; stop/start/restart keep that port."""

    def __init__(self, root: Path | None = None) -> None:
        # Under the worktree's var/ rather than /tmp: as root the server runs as an
        # unprivileged user, who must be able to traverse every ancestor directory.
        base = ROOT / "var" / "private-pg"
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(ROOT / "var", 0o755)
        os.chmod(base, 0o755)
        self.root = root or Path(tempfile.mkdtemp(prefix="pg-", dir=base))
        os.chmod(self.root, 0o755)
        self.url = ""

    def _cmd(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(EMBEDDED_PG), *args, "--root", str(self.root)],
            capture_output=True,
            text=True,
            timeout=180,
        )

    def start(self) -> str:
        portfile = self.root / "var" / "pg" / "port"
        if not portfile.exists():
            # Not embedded_pg's preferred port: the shared clusters of the other
            # worktrees want that one, and could take it while this one is stopped.
            portfile.parent.mkdir(parents=True, exist_ok=True)
            portfile.write_text(f"{_free_port()}\n")
        proc = self._cmd("start", "--fast")
        if proc.returncode != 0:
            raise RuntimeError(f"embedded_pg start failed: {proc.stderr[-2000:]}")
        url = proc.stdout.strip().splitlines()[-1]
        if self.url and url != self.url:
            raise RuntimeError(f"the cluster came back on another address: {url} (was {self.url})")
        self.url = url
        return url

    def stop(self) -> None:
        proc = self._cmd("stop")
        if proc.returncode != 0:
            raise RuntimeError(f"embedded_pg stop failed: {proc.stderr[-2000:]}")

    def restart(self) -> None:
        self.stop()
        self.start()

    def migrate(self, env: dict) -> None:
        migrate(self.url, env)

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def migrate(url: str, env: dict) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput"],
        cwd=ROOT,
        env={**env, "DATABASE_URL": url},
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=600,
    )


def wait_port_closed(url: str, timeout: float = 30) -> None:
    """Wait until nothing accepts connections at the URL's port (the server is really down)."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"port {port} still accepts connections")


CITUS_CLUSTER = ROOT / "scripts" / "citus_cluster.py"


class PrivateCitus:
    """A Citus coordinator + 2 workers of one's own (scripts/citus_cluster.py --base),
    with PrivatePg's interface for the coordinator (start/stop/restart/migrate/destroy)
    and node faults besides: a run that crashes workers and moves shards must never
    do so under the shared cluster of `make test-citus`."""

    DB = "cronyard_chaos"

    def __init__(self) -> None:
        base = ROOT / "var" / "private-citus"
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(ROOT / "var", 0o755)
        os.chmod(base, 0o755)
        self.base = Path(tempfile.mkdtemp(prefix="citus-", dir=base))
        os.chmod(self.base, 0o755)
        self.url = ""
        self.workers: list[str] = []

    def _cmd(self, *args: str) -> str:
        proc = subprocess.run(
            [sys.executable, str(CITUS_CLUSTER), *args, "--base", str(self.base)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"citus_cluster.py {' '.join(args)} failed: {proc.stderr[-2000:]}")
        return proc.stdout

    def start(self) -> str:
        """The whole cluster the first time; the coordinator alone after stop()."""
        if self.url:
            self.start_node("coordinator")
            return self.url
        out = dict(line.split("=", 1) for line in self._cmd("start", "--db", self.DB).split())
        self.url = out["DATABASE_URL"]
        self.workers = out["CRONYARD_CITUS_WORKERS"].split(",")
        return self.url

    def stop(self) -> None:
        self.stop_node("coordinator")

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop_node(self, name: str, *, immediate: bool = False) -> None:
        self._cmd("stop-node", name, *(["--immediate"] if immediate else []))

    def start_node(self, name: str) -> str:
        return self._cmd("start-node", name).strip()

    def add_worker(self) -> str:
        """Start one more worker and citus_add_node it (it holds nothing until a rebalance)."""
        worker = self._cmd("add-worker", "--db", self.DB).strip().splitlines()[-1]
        self.workers.append(worker)
        return worker

    def migrate(self, env: dict) -> None:
        migrate(self.url, env)

    def destroy(self) -> None:
        try:
            self._cmd("destroy")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
