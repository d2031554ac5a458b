"""CPU time of processes, from /proc: where a benchmark's time goes on a 2-core machine.

A run's CPU milliseconds (executors, PostgreSQL) say what one more process could buy:
when the processes already share all the cores, more of them cannot be faster.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After "pid (comm)": state is field 3, utime 14, stime 15 (man 5 proc).
    return (int(fields[11]) + int(fields[12])) / TICKS


def children_of(parent: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    pids.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return pids


def postgres_pids(cursor) -> list[int]:
    """The cluster's postmaster and every process it forked (backends, background workers)."""
    cursor.execute("SELECT setting FROM pg_settings WHERE name = 'data_directory'")
    try:
        postmaster = int((Path(cursor.fetchone()[0]) / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError):
        return []  # a server on another host or user: not measured
    return [postmaster, *children_of(postmaster)]


def total(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)
