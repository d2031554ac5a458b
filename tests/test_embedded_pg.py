"""End-to-end test of scripts/embedded_pg.py on a throwaway cluster.

Plain pytest, no Django: the cluster lives under a private temp dir
(``--root``), uses ``--fast`` and its own port, and never touches the
project's real ``var/pg`` cluster.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "embedded_pg.py"


def _load_module():
    spec = importlib.util.spec_from_file_location("embedded_pg_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(mod)
    return mod


epg = _load_module()
BINDIR = epg.find_bindir()
needs_pg = pytest.mark.skipif(BINDIR is None, reason="no PostgreSQL server binaries installed")


def cli(*args: str, timeout: float = 90, script: str = str(SCRIPT)) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def psql(url: str, sql: str) -> str:
    binary = os.path.join(BINDIR, "psql")
    if not os.access(binary, os.X_OK):
        binary = shutil.which("psql")
    proc = subprocess.run(
        [binary, "-X", "-A", "-t", "-d", url, "-c", sql],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def psql_ok(url: str) -> str:
    return psql(url, "SELECT current_user || '/' || current_database()")


@pytest.fixture
def pg_root():
    # Not pytest's tmp_path: /tmp/pytest-of-root is 0700, and when we are root
    # the cluster runs as an unprivileged user that must traverse the path.
    root = tempfile.mkdtemp(prefix="cronyard-pg-")
    os.chmod(root, 0o755)
    try:
        yield root
    finally:
        cli("stop", "--root", root)
        shutil.rmtree(root, ignore_errors=True)


def _single_url_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout  # stdout is exactly the DATABASE_URL
    assert lines[0].startswith("postgres://cronyard@127.0.0.1:")
    assert lines[0].endswith("/cronyard")
    return lines[0]


@needs_pg
def test_start_idempotent_crash_recovery_stop(pg_root):
    first = cli("start", "--root", pg_root, "--fast")
    url = _single_url_line(first)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert Path(pg_root, "var/pg/port").read_text().strip() == str(port)
    assert Path(pg_root, "var/pg/log/postgres.log").exists()
    assert psql_ok(url) == "cronyard/cronyard"
    conf = Path(pg_root, "var/pg/data/postgresql.conf").read_text()
    assert "fsync = off" in conf and f"shared_buffers = {epg.shared_buffers_mb()}MB" in conf
    if os.geteuid() == 0:
        owner = Path(pg_root, "var/pg/data").stat().st_uid
        assert owner != 0

    # Idempotent: same URL, server untouched.
    pid = int(Path(pg_root, "var/pg/data/postmaster.pid").read_text().split()[0])
    again = cli("start", "--root", pg_root, "--fast")
    assert _single_url_line(again) == url
    assert int(Path(pg_root, "var/pg/data/postmaster.pid").read_text().split()[0]) == pid

    assert cli("url", "--root", pg_root).stdout.strip() == url
    status = cli("status", "--root", pg_root)
    assert status.returncode == 0 and "running" in status.stdout

    # Crash: kill -9 the postmaster (it may linger as a zombie), then recover.
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    assert cli("url", "--root", pg_root).returncode == 1
    recovered = cli("start", "--root", pg_root, "--fast")
    assert _single_url_line(recovered) == url
    assert psql_ok(url) == "cronyard/cronyard"

    # Extra database.
    extra = cli("start", "--root", pg_root, "--fast", "--db", "cronyard_extra")
    assert extra.returncode == 0, extra.stderr
    extra_url = extra.stdout.strip()
    assert extra_url == url.rsplit("/", 1)[0] + "/cronyard_extra"
    assert psql_ok(extra_url) == "cronyard/cronyard_extra"

    # Stop, stop again (no error), url reports not running.
    stop = cli("stop", "--root", pg_root)
    assert stop.returncode == 0, stop.stderr
    assert stop.stdout == ""
    assert not Path(pg_root, "var/pg/data/postmaster.pid").exists()
    assert cli("stop", "--root", pg_root).returncode == 0
    assert cli("url", "--root", pg_root).returncode == 1


@needs_pg
def test_cluster_has_room_for_a_million_job_burst(pg_root):
    """A 1M-job dispatch writes ~3 GB of WAL: the default max_wal_size (1GB) forced a
    checkpoint storm in the middle of it; and it touches ~1.5 GB of pages at random,
    which 256 MB of shared_buffers turned into reads and backend writes
    (docs/decisions/0065-benchmark-harness.md)."""
    url = _single_url_line(cli("start", "--root", pg_root, "--fast"))
    assert psql(url, "SHOW max_wal_size") == "8GB"
    pages = psql(url, "SELECT setting FROM pg_settings WHERE name = 'shared_buffers'")
    buffers_mb = int(pages) * 8 // 1024
    assert buffers_mb == epg.shared_buffers_mb()
    if os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >= 8 * 2**30:
        assert buffers_mb >= 1024
    if epg.has_statements(BINDIR):
        assert "pg_stat_statements" in psql(url, "SHOW shared_preload_libraries")


@needs_pg
@pytest.mark.skipif(os.geteuid() != 0, reason="root-only: falls back to 'nobody'")
def test_root_falls_back_to_nobody_without_postgres_user(pg_root, monkeypatch, capsys):
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user")
    real_getpwnam = pwd.getpwnam

    def fake_getpwnam(name):
        if name == "postgres":
            raise KeyError(name)
        return real_getpwnam(name)

    monkeypatch.setattr(epg.pwd, "getpwnam", fake_getpwnam)
    try:
        assert epg.main(["start", "--root", pg_root, "--fast"]) == 0
        url = capsys.readouterr().out.strip()
        assert Path(pg_root, "var/pg/data").stat().st_uid == nobody.pw_uid
        assert psql_ok(url) == "cronyard/cronyard"
    finally:
        assert epg.main(["stop", "--root", pg_root]) == 0


def test_no_binaries_message(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(epg, "PG_LIB_GLOB", str(tmp_path / "nothing" / "*" / "bin"))
    assert epg.main(["start", "--root", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "embedded_pg: no PostgreSQL server binaries found; install them with: "
        "apt-get install postgresql (or set DATABASE_URL to an existing server)\n"
    )


def test_find_bindir_prefers_highest_version(monkeypatch, tmp_path):
    for ver in ("9.6", "13", "15", "16"):
        d = tmp_path / ver / "bin"
        d.mkdir(parents=True)
        for prog in ("initdb", "pg_ctl", "postgres") if ver != "16" else ("initdb",):
            f = d / prog
            f.write_text("#!/bin/sh\n")
            f.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(epg, "PG_LIB_GLOB", str(tmp_path / "*" / "bin"))
    # 16 is incomplete (initdb only), so 15 wins over 13 and 9.6.
    assert epg.find_bindir() == str(tmp_path / "15" / "bin")


@needs_pg
@pytest.mark.skipif(os.geteuid() != 0, reason="root-only: the cluster runs as another user")
def test_root_in_a_folder_postgres_cannot_traverse():
    """A checkout inside a mode-700 folder (mktemp -d, /root): start, db-stop, start again
    and clean all work without a chmod; the cluster lives in a folder of its own."""
    private = Path(tempfile.mkdtemp(prefix="cronyard-private-"))
    assert private.stat().st_mode & 0o777 == 0o700
    checkout = private / "cronyard"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, checkout / "scripts" / "embedded_pg.py")
    shutil.copy(SCRIPT.parent.parent / "Makefile", checkout / "Makefile")
    script = str(checkout / "scripts" / "embedded_pg.py")
    make = ["make", "-s", "-C", str(checkout), f"PYTHON={sys.executable}"]
    link = checkout / "var" / "pg"
    try:
        first = cli("start", "--fast", script=script)
        url = _single_url_line(first)
        assert psql_ok(url) == "cronyard/cronyard"
        assert link.is_symlink(), first.stderr
        target = Path(os.readlink(link))
        assert str(target) in first.stderr  # says where the cluster went
        assert target.stat().st_uid == pwd.getpwnam(epg.choose_user(epg.Layout(str(checkout))).name).pw_uid
        assert target.stat().st_mode & 0o777 == 0o700
        assert (target / "data" / "PG_VERSION").exists()
        assert private.stat().st_mode & 0o777 == 0o700  # nothing was chmodded

        stop = subprocess.run([*make, "db-stop"], capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stderr
        assert not (target / "data" / "postmaster.pid").exists()

        again = cli("start", "--fast", script=script)
        assert _single_url_line(again) == url  # same cluster, same port
        assert psql_ok(url) == "cronyard/cronyard"

        clean = subprocess.run([*make, "clean"], capture_output=True, text=True, timeout=120)
        assert clean.returncode == 0, clean.stderr
        assert not target.exists()
        assert not (checkout / "var").exists()
    finally:
        cli("destroy", script=script)
        shutil.rmtree(private, ignore_errors=True)


def test_manage_py_finds_this_checkouts_cluster_without_database_url(tmp_path):
    """A command run beside `make run` (README: create_tenant) must reach the cluster of
    its own checkout, whose port was whichever was free at init, not 54329 blindly."""
    from scheduler_project.settings import embedded_database_url

    assert embedded_database_url(tmp_path) == "postgres://cronyard@127.0.0.1:54329/cronyard"  # not set up yet
    (tmp_path / "var" / "pg").mkdir(parents=True)
    (tmp_path / "var" / "pg" / "port").write_text("41025\n")
    assert embedded_database_url(tmp_path) == "postgres://cronyard@127.0.0.1:41025/cronyard"
