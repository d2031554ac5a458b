#!/usr/bin/env python3
"""Embedded PostgreSQL bootstrap for Cronyard (stdlib only).

Runs before the virtualenv exists, with the system ``python3``.

Usage::

    python3 scripts/embedded_pg.py start [--fast] [--db NAME] [--root DIR]
    python3 scripts/embedded_pg.py stop   [--root DIR]
    python3 scripts/embedded_pg.py url    [--db NAME] [--root DIR]
    python3 scripts/embedded_pg.py status [--root DIR]
    python3 scripts/embedded_pg.py destroy [--root DIR]

``start`` is idempotent and prints exactly one line on stdout, the
DATABASE_URL (``postgres://cronyard@127.0.0.1:PORT/cronyard``); all other
output goes to stderr, so a Makefile can do::

    DATABASE_URL=$(python3 scripts/embedded_pg.py start)

Layout (relative to the project root, the parent of ``scripts/``)::

    var/pg/data               the cluster (initdb on first use)
    var/pg/run                unix socket directory
    var/pg/log/postgres.log   server log
    var/pg/port               TCP port chosen on first init

PostgreSQL refuses to run as root.  When run as root, every PostgreSQL
server program runs as an unprivileged user (the ``postgres`` system user if
it exists, else ``nobody``; an existing cluster keeps the non-root user that
owns its data directory) via ``subprocess``'s ``user=``/``group=``/
``extra_groups=[]`` (setgroups, setgid, setuid in the child), and ``var/pg``
is chowned to it.

That user must be able to traverse every ancestor of ``var/pg``. When it cannot
(run as root from a clone under /root, or in a ``mktemp -d`` folder, mode 700),
the cluster is placed in a folder of its own instead,
``/var/tmp/cronyard-pg-<hash of the checkout path>/`` (owned by that user, mode
700), and ``var/pg`` becomes a symlink to it: every command follows the link, so
``stop``, ``status`` and ``destroy`` (``make db-stop``, ``make clean``) find it.
An existing cluster is never moved.
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import hashlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

SUPERUSER = "cronyard"
DEFAULT_DB = "cronyard"
PREFERRED_PORT = 54329
PG_LIB_GLOB = "/usr/lib/postgresql/*/bin"
SERVER_PROGRAMS = ("initdb", "pg_ctl", "postgres")
NO_BINARIES_MSG = (
    "embedded_pg: no PostgreSQL server binaries found; install them with: "
    "apt-get install postgresql (or set DATABASE_URL to an existing server)"
)
CONF_BEGIN = "# BEGIN embedded_pg (managed by scripts/embedded_pg.py; rewritten on every start)"
CONF_END = "# END embedded_pg"
# sun_path is 108 bytes including the NUL; the socket name is "/.s.PGSQL.NNNNN".
MAX_SOCKET_DIR_LEN = 107 - len("/.s.PGSQL.65535")


class PgError(Exception):
    """A failure to report as one line on stderr (exit status ``code``)."""

    def __init__(self, msg: str, code: int = 1):
        super().__init__(msg)
        self.code = code


def log(msg: str) -> None:
    print(f"embedded_pg: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Locating binaries
# --------------------------------------------------------------------------


def _version_key(path: str) -> tuple:
    # /usr/lib/postgresql/15/bin -> (15,) ; 9.6 -> (9, 6)
    ver = os.path.basename(os.path.dirname(path))
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.\-]", ver))


def find_bindir() -> str | None:
    """Directory holding initdb, pg_ctl and postgres, or None."""
    found = [shutil.which(p) for p in SERVER_PROGRAMS]
    if all(found):
        # Resolve symlinks (/usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb)
        # so that psql/createdb come from the same installation.
        dirs = {os.path.dirname(os.path.realpath(p)) for p in found}
        for d in sorted(dirs):
            if all(os.access(os.path.join(d, p), os.X_OK) for p in SERVER_PROGRAMS):
                return d
        # Binaries spread over several directories: use initdb's; pg_ctl finds
        # postgres next to itself, so prefer pg_ctl's directory.
        return os.path.dirname(os.path.realpath(found[1]))
    candidates = [
        d
        for d in glob.glob(PG_LIB_GLOB)
        if all(os.access(os.path.join(d, p), os.X_OK) for p in SERVER_PROGRAMS)
    ]
    if not candidates:
        return None
    return max(candidates, key=_version_key)


# --------------------------------------------------------------------------
# Paths / user
# --------------------------------------------------------------------------


FALLBACK_PARENTS = ("/var/tmp", "/tmp")


@dataclass
class Layout:
    root: str

    @property
    def link(self) -> str:
        """var/pg as named in the checkout: the cluster's folder or a symlink to it."""
        return os.path.join(self.root, "var", "pg")

    @property
    def base(self) -> str:
        # PostgreSQL gets resolved paths: the folders it must traverse are the real ones.
        return os.path.realpath(self.link)

    @property
    def relocated(self) -> bool:
        return os.path.islink(self.link)

    @property
    def data(self) -> str:
        return os.path.join(self.base, "data")

    @property
    def run(self) -> str:
        return os.path.join(self.base, "run")

    @property
    def logdir(self) -> str:
        return os.path.join(self.base, "log")

    @property
    def logfile(self) -> str:
        return os.path.join(self.logdir, "postgres.log")

    @property
    def portfile(self) -> str:
        return os.path.join(self.base, "port")

    @property
    def lockfile(self) -> str:
        return os.path.join(self.base, ".embedded_pg.lock")

    @property
    def pidfile(self) -> str:
        return os.path.join(self.data, "postmaster.pid")

    def initialized(self) -> bool:
        return os.path.isfile(os.path.join(self.data, "PG_VERSION"))


@dataclass
class RunAs:
    """Who runs the PostgreSQL programs. ``uid is None`` means 'as ourselves'."""

    name: str
    uid: int | None = None
    gid: int | None = None

    def kwargs(self) -> dict:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def choose_user(layout: Layout) -> RunAs:
    if os.geteuid() != 0:
        return RunAs(pwd.getpwuid(os.geteuid()).pw_name)
    # An existing cluster keeps the (non-root) user owning its data directory.
    try:
        st = os.stat(layout.data)
        if st.st_uid != 0:
            pw = pwd.getpwuid(st.st_uid)
            return RunAs(pw.pw_name, pw.pw_uid, pw.pw_gid)
    except (FileNotFoundError, KeyError):
        pass
    for name in ("postgres", "nobody"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        if pw.pw_uid != 0:
            return RunAs(pw.pw_name, pw.pw_uid, pw.pw_gid)
    raise PgError("running as root but neither a 'postgres' nor a 'nobody' user exists")


def child_env(layout: Layout) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["HOME"] = layout.base  # nobody's home (/nonexistent) does not exist
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PGCONNECT_TIMEOUT"] = "5"
    return env


def run(
    cmd: list,
    layout: Layout,
    who: RunAs | None = None,
    check: bool = False,
    timeout: float = 120,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    """Run cmd (as ``who`` if given) capturing output; never writes to our stdout."""
    kwargs = who.kwargs() if who else {}
    cwd = cwd or (layout.base if os.path.isdir(layout.base) else "/")
    try:
        proc = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=child_env(layout),
            cwd=cwd,
            timeout=timeout,
            **kwargs,
        )
    except subprocess.TimeoutExpired:
        raise PgError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}") from None
    if check and proc.returncode != 0:
        out = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise PgError(
            f"{os.path.basename(cmd[0])} failed (exit {proc.returncode}): "
            + (out[-1] if out else "no output")
        )
    return proc


def makedirs(path: str, mode: int) -> None:
    """mkdir -p, making every directory we create traversable (umask-proof)."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            continue
        os.chmod(d, mode if d == os.path.abspath(path) else 0o755)


def chown_tree(top: str, who: RunAs) -> None:
    if who.uid is None:
        return
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [None, *dirnames, *filenames]:
            p = dirpath if name is None else os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
                if st.st_uid != who.uid or st.st_gid != who.gid:
                    os.lchown(p, who.uid, who.gid)
            except FileNotFoundError:
                pass


def untraversable(path: str, layout: Layout, who: RunAs) -> str | None:
    """The outermost ancestor of ``path`` (itself included) that ``who`` cannot search."""
    if who.uid is None:
        return None
    dirs = []
    p = os.path.abspath(path)
    while True:
        dirs.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    dirs.reverse()  # report the outermost offender
    # Only existing folders: the ones we create later are made traversable.
    dirs = [d for d in dirs if os.path.isdir(d)]
    script = 'for d in "$@"; do [ -x "$d" ] || { echo "$d"; exit 1; }; done'
    proc = run(["/bin/sh", "-c", script, "sh", *dirs], layout, who, cwd="/")
    if proc.returncode != 0:
        return proc.stdout.strip() or "?"
    return None


def check_traversable(layout: Layout, who: RunAs) -> None:
    """Every ancestor of var/pg must be searchable by the unprivileged user."""
    bad = untraversable(layout.base, layout, who)
    if bad:
        raise PgError(
            f"directory {bad} is not traversable by user {who.name!r} (PostgreSQL cannot run "
            f"as root); fix with: chmod o+x {bad}  (or use --root elsewhere)"
        )


def fallback_dir(layout: Layout) -> str:
    """A folder of the cluster's own, stable for one checkout path."""
    digest = hashlib.sha256(os.path.realpath(layout.root).encode()).hexdigest()[:12]
    parent = next((p for p in FALLBACK_PARENTS if os.path.isdir(p)), FALLBACK_PARENTS[-1])
    return os.path.join(parent, f"cronyard-pg-{digest}")


def place_cluster(layout: Layout, who: RunAs) -> None:
    """Keep the cluster under var/pg when ``who`` can reach it; otherwise link var/pg to
    a folder of its own that it can reach (root in a folder postgres cannot traverse)."""
    if who.uid is None or layout.relocated or layout.initialized():
        return  # not root, already placed, or an existing cluster (never moved)
    bad = untraversable(layout.link, layout, who)
    if bad is None:
        return
    target = fallback_dir(layout)
    if os.path.islink(target) or (os.path.exists(target) and os.stat(target).st_uid != who.uid):
        raise PgError(f"{target} exists and is not {who.name}'s: remove it or use --root elsewhere")
    os.makedirs(target, mode=0o700, exist_ok=True)
    os.chown(target, who.uid, who.gid)
    os.chmod(target, 0o700)
    if os.path.isdir(layout.link):
        shutil.rmtree(layout.link)  # only our lock and port files: no cluster was ever made there
    makedirs(os.path.dirname(layout.link), 0o755)
    os.symlink(target, layout.link)
    log(
        f"{bad} is not traversable by user {who.name!r}, so the cluster lives in {target} "
        f"(var/pg links there); make db-stop and make clean find it"
    )


# --------------------------------------------------------------------------
# Server state
# --------------------------------------------------------------------------


def read_pidfile(layout: Layout) -> list[str] | None:
    try:
        with open(layout.pidfile) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return None


def process_alive(pid: int) -> bool:
    """True if pid is a live (non-zombie) postgres process.

    Plain kill(pid, 0) is not enough: in containers whose PID 1 does not reap
    orphans, a kill -9'd postmaster stays around as a zombie forever.
    """
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:
        stat = None
    if stat is None:  # no procfs: best effort
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    state = stat[stat.rindex(")") + 2 :].split()[0]
    if state in ("Z", "X", "x"):
        return False
    return comm.startswith(("postgres", "postmaster"))


@dataclass
class ServerState:
    running: bool
    pid: int | None = None
    port: int | None = None
    status: str = ""  # 'ready', 'starting', 'stopping', 'standby'
    stale: bool = False  # postmaster.pid exists but its process is gone


def server_state(layout: Layout) -> ServerState:
    lines = read_pidfile(layout)
    if not lines:
        return ServerState(False)
    try:
        pid = int(lines[0].strip())
    except ValueError:
        return ServerState(False, stale=True)
    port = None
    if len(lines) > 3 and lines[3].strip().isdigit():
        port = int(lines[3].strip())
    status = lines[7].strip() if len(lines) > 7 else ""
    if process_alive(pid):
        return ServerState(True, pid, port, status)
    return ServerState(False, pid, port, status, stale=True)


def shm_attached(layout: Layout) -> int:
    """Attach count of the stale cluster's SysV segment (0 if gone/unknown)."""
    lines = read_pidfile(layout) or []
    if len(lines) < 7:
        return 0
    parts = lines[6].split()
    if len(parts) < 2 or not parts[1].isdigit():
        return 0
    shmid = parts[1]
    try:
        with open("/proc/sysvipc/shm") as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return 0
    for row in rows:
        cols = row.split()
        if len(cols) > 6 and cols[1] == shmid:
            return int(cols[6])
    return 0


def clear_stale(layout: Layout, state: ServerState) -> None:
    """Remove a dead postmaster's lock files once no orphaned backend is left.

    PostgreSQL itself removes stale lock files, but it treats a zombie PID as
    alive ("lock file already exists"), so we do it for it.
    """
    deadline = time.monotonic() + 15
    while shm_attached(layout) > 0:
        if time.monotonic() > deadline:
            raise PgError(
                "postmaster is gone but orphaned backends still hold its shared "
                f"memory; kill the leftover 'postgres' processes of {layout.data}"
            )
        time.sleep(0.2)
    log(f"removing stale postmaster.pid (pid {state.pid} is dead)")
    for path in [layout.pidfile, *glob.glob(os.path.join(layout.run, ".s.PGSQL.*.lock"))]:
        if path != layout.pidfile:
            try:
                with open(path) as f:
                    owner = f.readline().strip()
                if owner.isdigit() and process_alive(int(owner)):
                    continue
            except OSError:
                continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------
# Ports / configuration
# --------------------------------------------------------------------------


def port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # PostgreSQL sets SO_REUSEADDR too, so TIME_WAIT leftovers don't count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def pick_port(avoid: set[int] = frozenset()) -> int:
    if PREFERRED_PORT not in avoid and port_free(PREFERRED_PORT):
        return PREFERRED_PORT
    for _ in range(20):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        finally:
            s.close()
        if port not in avoid:
            return port
    raise PgError("could not find a free TCP port on 127.0.0.1")


def stored_port(layout: Layout) -> int | None:
    try:
        with open(layout.portfile) as f:
            val = f.read().strip()
        return int(val) if val.isdigit() else None
    except FileNotFoundError:
        return None


def write_port(layout: Layout, port: int) -> None:
    tmp = layout.portfile + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, layout.portfile)


def _quote_conf(val: str) -> str:
    return "'" + val.replace("\\", "\\\\").replace("'", "''") + "'"


def write_config(
    layout: Layout, port: int, fast: bool, settings: tuple[str, ...] = (), *, preload_statements: bool = False
) -> None:
    sockdir = layout.run
    if len(sockdir) > MAX_SOCKET_DIR_LEN:
        log(f"socket dir path too long for a unix socket ({len(sockdir)} chars); TCP only")
        sockdir = ""
    block = [
        CONF_BEGIN,
        "listen_addresses = '127.0.0.1'",
        f"unix_socket_directories = {_quote_conf(sockdir)}",
        f"port = {port}",
        "max_connections = 200",
        f"shared_buffers = {shared_buffers_mb()}MB",
        # A 1M-job burst writes ~3 GB of WAL in a minute; with the default 1GB a
        # checkpoint was forced every ~0.5 GB and the full-page images after each one
        # inflated the WAL further (docs/decisions/0065-benchmark-harness.md).
        "max_wal_size = 8GB",
    ]
    if preload_statements:
        # Per-statement counters for profiling (make bench reports the heaviest).
        block.append("shared_preload_libraries = 'pg_stat_statements'")
    if fast:
        block += [
            "# --fast: throwaway cluster, NOT crash safe",
            "fsync = off",
            "synchronous_commit = off",
            "full_page_writes = off",
        ]
    block += list(settings)  # a caller's own lines (scripts/citus_cluster.py: the Citus ones)
    block.append(CONF_END)
    conf = os.path.join(layout.data, "postgresql.conf")
    with open(conf) as f:
        text = f.read()
    pattern = re.compile(re.escape(CONF_BEGIN) + r".*?" + re.escape(CONF_END) + r"\n?", re.S)
    text = pattern.sub("", text)
    if not text.endswith("\n"):
        text += "\n"
    text += "\n".join(block) + "\n"
    with open(conf + ".tmp", "w") as f:
        f.write(text)
    st = os.stat(conf)
    os.replace(conf + ".tmp", conf)
    os.chmod(conf, st.st_mode & 0o7777)
    if os.geteuid() == 0:
        os.chown(conf, st.st_uid, st.st_gid)

    # An ALTER SYSTEM SET port would override us: keep it in sync.
    auto = os.path.join(layout.data, "postgresql.auto.conf")
    try:
        with open(auto) as f:
            atext = f.read()
    except FileNotFoundError:
        return
    new = re.sub(r"(?m)^\s*port\s*=.*$", f"port = '{port}'", atext)
    if new != atext:
        with open(auto, "w") as f:
            f.write(new)


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------


def make_url(port: int, db: str = DEFAULT_DB) -> str:
    from urllib.parse import quote

    return f"postgres://{SUPERUSER}@127.0.0.1:{port}/{quote(db, safe='')}"


class Lock:
    def __init__(self, path: str):
        self.path = path
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def require_bindir() -> str:
    bindir = find_bindir()
    if not bindir:
        raise PgError(NO_BINARIES_MSG[len("embedded_pg: ") :], code=2)
    return bindir


def pg(bindir: str, prog: str) -> str:
    path = os.path.join(bindir, prog)
    if os.access(path, os.X_OK):
        return path
    other = shutil.which(prog)
    if other:
        return other
    raise PgError(f"{prog} not found in {bindir} or on PATH")


def initdb(bindir: str, layout: Layout, who: RunAs, fast: bool) -> None:
    if os.path.isdir(layout.data) and os.listdir(layout.data):
        raise PgError(
            f"{layout.data} exists and is not empty but holds no cluster "
            "(no PG_VERSION); remove it to re-initialise"
        )
    base = [pg(bindir, "initdb"), "-D", layout.data, "-U", SUPERUSER, "--auth=trust", "-E", "UTF8"]
    if fast:
        base.append("--no-sync")
    log(f"initialising cluster in {layout.data} (as {who.name})")
    proc = run([*base, "--locale=C.UTF-8"], layout, who)
    if proc.returncode != 0:
        log("initdb --locale=C.UTF-8 failed; retrying with --no-locale")
        if os.path.isdir(layout.data):
            shutil.rmtree(layout.data)
        run([*base, "--no-locale"], layout, who, check=True)


def log_tail(layout: Layout, n: int = 15) -> str:
    try:
        with open(layout.logfile, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def pg_ctl_start(bindir: str, layout: Layout, who: RunAs) -> subprocess.CompletedProcess:
    # pg_ctl redirects the postmaster's stdio to the log file, so the server
    # never holds our (possibly $(...)-captured) stdout/stderr open.
    return run(
        [pg(bindir, "pg_ctl"), "-D", layout.data, "-l", layout.logfile, "-w", "-t", "60", "start"],
        layout,
        who,
        timeout=90,
    )


def psql(bindir: str, layout: Layout, port: int, db: str, sql: str) -> subprocess.CompletedProcess:
    return run(
        [
            pg(bindir, "psql"),
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            SUPERUSER,
            "-d",
            db,
            "-c",
            sql,
        ],
        layout,
        timeout=60,
    )


def wait_ready(bindir: str, layout: Layout, port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        proc = psql(bindir, layout, port, "postgres", "SELECT 1")
        if proc.returncode == 0:
            return
        if time.monotonic() > deadline:
            err = (proc.stderr or "").strip().splitlines()
            raise PgError(
                f"server on port {port} does not accept connections" + (f": {err[-1]}" if err else "")
            )
        time.sleep(0.2)


def ensure_db(bindir: str, layout: Layout, port: int, db: str) -> None:
    lit = "'" + db.replace("'", "''") + "'"
    ident = '"' + db.replace('"', '""') + '"'
    proc = psql(bindir, layout, port, "postgres", f"SELECT 1 FROM pg_database WHERE datname = {lit}")
    if proc.returncode != 0:
        raise PgError(f"cannot query databases: {proc.stderr.strip()}")
    if proc.stdout.strip() == "1":
        return
    log(f"creating database {db}")
    proc = psql(bindir, layout, port, "postgres", f"CREATE DATABASE {ident} OWNER {SUPERUSER}")
    if proc.returncode != 0 and "already exists" not in proc.stderr:
        raise PgError(f"CREATE DATABASE {db} failed: {proc.stderr.strip()}")


def cmd_start(layout: Layout, fast: bool, dbs: list[str]) -> int:
    port = start_server(layout, fast=fast, dbs=dbs)
    print(make_url(port, dbs[-1] if dbs else DEFAULT_DB), flush=True)
    return 0


def shared_buffers_mb() -> int:
    """An eighth of the machine's memory, between 256 MB and 2 GB.

    At 1M jobs the pages a dispatch touches at random (jobs and its indexes, the run
    keys) are ~1.5 GB; with 256 MB every batch read them back from the OS cache and
    backends wrote dirty pages out themselves to make room, and the cost per run
    doubled from 100k to 1M jobs (docs/decisions/0065-benchmark-harness.md).
    The memory is used only as pages are touched (anonymous shared memory), so a
    test cluster that never grows stays small.
    """
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 256
    return max(256, min(2048, pages // 8 // 2**20))


def has_statements(bindir: str) -> bool:
    """Whether this server has the pg_stat_statements module (postgresql-contrib): preloading
    a missing library would keep the server from starting."""
    return os.path.exists(os.path.join(os.path.dirname(bindir), "lib", "pg_stat_statements.so"))


def start_server(layout: Layout, *, fast: bool, dbs: list[str], settings: tuple[str, ...] = ()) -> int:
    """Init if needed, start (idempotent), create the databases; return the port."""
    bindir = require_bindir()
    who = choose_user(layout)
    place_cluster(layout, who)
    makedirs(layout.base, 0o755)
    with Lock(layout.lockfile):
        state = server_state(layout)
        if state.running:
            if fast:
                log("server already running; --fast ignored")
            port = state.port or stored_port(layout)
            wait_ready(bindir, layout, port)
        else:
            check_traversable(layout, who)
            makedirs(layout.run, 0o755)
            makedirs(layout.logdir, 0o755)
            chown_tree(layout.base, who)
            if not layout.initialized():
                initdb(bindir, layout, who, fast)
            if state.stale:
                clear_stale(layout, state)
            port = stored_port(layout)
            if port is None or not port_free(port):
                if port is not None:
                    log(f"stored port {port} is busy; choosing another")
                port = pick_port()
            tried = set()
            for attempt in range(1, 6):
                write_port(layout, port)
                write_config(layout, port, fast, settings, preload_statements=has_statements(bindir))
                chown_tree(layout.base, who)
                log(f"starting PostgreSQL on 127.0.0.1:{port} (as {who.name}, {bindir})")
                proc = pg_ctl_start(bindir, layout, who)
                if proc.returncode == 0:
                    break
                tail = log_tail(layout)
                st = server_state(layout)
                if st.stale:
                    clear_stale(layout, st)
                if attempt < 5 and re.search(r"could not (bind|create listen)|in use", tail):
                    tried.add(port)
                    port = pick_port(tried)
                    log(f"port busy; retrying on {port}")
                    continue
                if attempt < 5 and re.search(r"shared memory|lock file", tail):
                    time.sleep(1)
                    continue
                sys.stderr.write((proc.stdout or "") + (proc.stderr or "") + tail)
                raise PgError(f"pg_ctl start failed; see {layout.logfile}")
            wait_ready(bindir, layout, port)
        for db in dict.fromkeys([DEFAULT_DB, *dbs]):
            ensure_db(bindir, layout, port, db)
    return port


def cmd_stop(layout: Layout, *, mode: str = "fast") -> int:
    """pg_ctl stop; mode "immediate" is a crash (no checkpoint, recovery at the next start)."""
    if not layout.initialized():
        log("no cluster; nothing to stop")
        return 0
    state = server_state(layout)
    if not state.running:
        log("server not running" + (" (stale postmaster.pid left behind)" if state.stale else ""))
        return 0
    bindir = require_bindir()
    who = choose_user(layout)
    makedirs(layout.base, 0o755)
    with Lock(layout.lockfile):
        log(f"stopping PostgreSQL (pid {state.pid})")
        proc = run(
            [pg(bindir, "pg_ctl"), "-D", layout.data, "-m", mode, "-w", "-t", "60", "stop"],
            layout,
            who,
            timeout=90,
        )
        if proc.returncode != 0 and server_state(layout).running:
            raise PgError("pg_ctl stop failed: " + (proc.stderr or proc.stdout).strip())
    return 0


def cmd_destroy(layout: Layout) -> int:
    """Stop the server and remove the cluster, wherever var/pg points (``make clean``)."""
    cmd_stop(layout)
    base = layout.base
    if layout.relocated:
        os.unlink(layout.link)
    if os.path.isdir(base):
        shutil.rmtree(base)
        log(f"removed {base}")
    return 0


def cmd_url(layout: Layout, dbs: list[str]) -> int:
    state = server_state(layout)
    if not state.running or state.status not in ("ready", ""):
        log("server not running")
        return 1
    port = state.port or stored_port(layout)
    print(make_url(port, dbs[-1] if dbs else DEFAULT_DB))
    return 0


def cmd_status(layout: Layout) -> int:
    bindir = find_bindir()
    state = server_state(layout)
    try:
        who = choose_user(layout).name
    except PgError as e:
        who = f"? ({e})"
    lines = [
        f"project root : {layout.root}",
        f"binaries     : {bindir or 'NOT FOUND'}",
        f"data dir     : {layout.data} ({'initialised' if layout.initialized() else 'not initialised'})"
        + (f", linked from {layout.link}" if layout.relocated else ""),
        f"runs as      : {who}",
        f"log          : {layout.logfile}",
        f"stored port  : {stored_port(layout) or '-'}",
    ]
    if state.running:
        port = state.port or stored_port(layout)
        lines.append(f"server       : running (pid {state.pid}, {state.status or '?'})")
        lines.append(f"url          : {make_url(port)}")
    else:
        lines.append(
            "server       : stopped" + (f" (stale postmaster.pid, pid {state.pid})" if state.stale else "")
        )
    print("\n".join(lines))
    return 0


def default_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root", default=argparse.SUPPRESS, help="project root (default: parent of scripts/)"
    )
    parser = argparse.ArgumentParser(
        prog="embedded_pg.py", parents=[common], description="Embedded PostgreSQL for Cronyard"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start", parents=[common], help="init if needed, start, print DATABASE_URL")
    p.add_argument(
        "--fast", action="store_true", help="throwaway cluster: fsync/synchronous_commit/full_page_writes off"
    )
    p.add_argument(
        "--db",
        action="append",
        default=[],
        metavar="NAME",
        help="also create database NAME (the URL printed points at it)",
    )
    sub.add_parser("stop", parents=[common], help="stop the server (no error if not running)")
    p = sub.add_parser("url", parents=[common], help="print DATABASE_URL if running, else exit 1")
    p.add_argument("--db", action="append", default=[], metavar="NAME")
    sub.add_parser("status", parents=[common], help="human-readable summary")
    sub.add_parser("destroy", parents=[common], help="stop and remove the cluster (where var/pg points)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    layout = Layout(os.path.abspath(getattr(args, "root", None) or default_root()))
    try:
        if args.command == "start":
            return cmd_start(layout, args.fast, args.db)
        if args.command == "stop":
            return cmd_stop(layout)
        if args.command == "url":
            return cmd_url(layout, args.db)
        if args.command == "destroy":
            return cmd_destroy(layout)
        return cmd_status(layout)
    except PgError as e:
        log(str(e))
        return e.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
