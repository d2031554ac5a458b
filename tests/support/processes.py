"""`manage.py` child processes for tests and the chaos driver: started with their own
log file, and none outlives its owner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


class Processes:
    """Starts `manage.py` commands and makes sure none outlives the test."""

    def __init__(self, env: dict, log_dir: Path):
        self.env = env
        self.log_dir = log_dir
        self.children: list[subprocess.Popen] = []

    def start(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        name = f"{args[0]}-{len(self.children)}"
        log = open(self.log_dir / f"{name}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()  # the child holds its own copy
        proc.log_path = self.log_dir / f"{name}.log"
        self.children.append(proc)
        return proc

    def log_of(self, proc: subprocess.Popen) -> str:
        return proc.log_path.read_text(errors="replace")

    def summary(self, *, tail: int = 12) -> str:
        """Each child's first line, its errors and its last lines: printed after every
        process test, shown by pytest when the test failed (CI keeps no log files)."""
        parts = []
        for proc in self.children:
            lines = self.log_of(proc).splitlines()
            errors = [line for line in lines[1:-tail] if " ERROR " in line or "Traceback" in line]
            parts.append(
                "\n".join(
                    [
                        f"== {proc.log_path.name} (pid {proc.pid}, {len(lines)} lines)",
                        *lines[:1],
                        *errors[-tail:],
                        "...",
                        *lines[-tail:],
                    ]
                )
            )
        return "\n".join(parts)

    def stop_all(self, timeout: float = 20) -> None:
        for proc in self.children:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.terminate()
                except ProcessLookupError:
                    pass
        for proc in self.children:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
