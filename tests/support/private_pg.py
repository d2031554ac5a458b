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
        subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput"],
            cwd=ROOT,
            env={**env, "DATABASE_URL": self.url},
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=300,
        )

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


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
