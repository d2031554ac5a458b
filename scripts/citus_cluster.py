#!/usr/bin/env python3
"""A local Citus cluster for `make test-citus`: a coordinator and two workers.

Usage (``start`` and ``createdb`` need the project's virtualenv, for psycopg; the
other commands run with the system ``python3`` too)::

    .venv/bin/python scripts/citus_cluster.py start [--db NAME]
    .venv/bin/python scripts/citus_cluster.py stop
    .venv/bin/python scripts/citus_cluster.py status
    .venv/bin/python scripts/citus_cluster.py createdb NAME
    .venv/bin/python scripts/citus_cluster.py destroy
    python3 scripts/citus_cluster.py available     # exit 0 when citus.so is installed

Each node is an embedded cluster of scripts/embedded_pg.py (same initdb, free port,
root handling, stale-pid clean-up) under ``var/citus/<node>``, started with
``shared_preload_libraries = 'citus'``. ``start`` prints, on stdout only::

    DATABASE_URL=postgres://cronyard@127.0.0.1:PORT/NAME
    CRONYARD_CITUS_WORKERS=127.0.0.1:PORT,127.0.0.1:PORT

Citus itself is not part of Cronyard: install it from the vendor's packages for the
server's PostgreSQL major version. Without it, every command says so and exits 2.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]

import embedded_pg as ep  # noqa: E402  (a sibling script, not a package)

NODES = ("coordinator", "worker1", "worker2")
CITUS_SETTINGS = (
    "shared_preload_libraries = 'citus'",
    # No phone-home from a test cluster.
    "citus.enable_statistics_collection = off",
    # Every test database and every xdist worker opens connections to the workers.
    "max_prepared_transactions = 200",
)
MISSING_MSG = (
    "citus_cluster: Citus is not installed; install Citus from its vendor's packages "
    "for PostgreSQL {major} (citus.so must be in {libdir})"
)


class NodeLayout(ep.Layout):
    """embedded_pg's layout rooted at var/citus/<node> instead of var/pg.

    `root` is the node folder itself, so embedded_pg's relocation for root (a folder
    named after a hash of `root`) gives each node a folder of its own.
    """

    @property
    def link(self) -> str:
        return self.root


def layouts(project: str) -> list[NodeLayout]:
    return [NodeLayout(os.path.join(project, "var", "citus", name)) for name in NODES]


def citus_libdir(bindir: str) -> str:
    """The server's pkglibdir (where citus.so must be), asked of pg_config beside the server."""
    pg_config = os.path.join(bindir, "pg_config")
    if os.access(pg_config, os.X_OK):
        out = subprocess.run([pg_config, "--pkglibdir"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return os.path.join(os.path.dirname(bindir), "lib")  # Debian: /usr/lib/postgresql/15/lib


def require_citus() -> str:
    bindir = ep.require_bindir()
    libdir = citus_libdir(bindir)
    if not os.path.isfile(os.path.join(libdir, "citus.so")):
        major = os.path.basename(os.path.dirname(bindir))
        raise ep.PgError(MISSING_MSG.format(major=major, libdir=libdir)[len("citus_cluster: ") :], code=2)
    return bindir


def node(port: int) -> str:
    return f"127.0.0.1:{port}"


def cmd_start(project: str, db: str) -> int:
    from scheduler_project.citus import prepare_database

    require_citus()
    ports = [
        ep.start_server(layout, fast=True, dbs=[], settings=CITUS_SETTINGS) for layout in layouts(project)
    ]
    coordinator, workers = node(ports[0]), [node(p) for p in ports[1:]]
    prepare_database(coordinator=coordinator, workers=workers, db=db)
    print(f"DATABASE_URL={ep.make_url(ports[0], db)}")
    print(f"CRONYARD_CITUS_WORKERS={','.join(workers)}", flush=True)
    return 0


def cmd_createdb(project: str, db: str) -> int:
    from scheduler_project.citus import prepare_database

    ports = [ep.server_state(layout).port for layout in layouts(project)]
    if not all(ports):
        raise ep.PgError("the Citus cluster is not running (citus_cluster.py start)")
    prepare_database(coordinator=node(ports[0]), workers=[node(p) for p in ports[1:]], db=db)
    return 0


def cmd_each(project: str, command) -> int:
    """stop / status / destroy: embedded_pg's own command, node by node (workers last)."""
    status = 0
    for name, layout in zip(NODES, layouts(project), strict=True):
        print(f"== {name}", file=sys.stderr if command is not ep.cmd_status else sys.stdout, flush=True)
        status = command(layout) or status
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="citus_cluster.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start", help="init if needed, start 3 nodes, prepare the database")
    p.add_argument("--db", default=ep.DEFAULT_DB)
    p = sub.add_parser("createdb", help="create a Citus database on every node")
    p.add_argument("name")
    for name in ("stop", "status", "destroy"):
        sub.add_parser(name)
    sub.add_parser("available", help="exit 0 if Citus is installed, else say so and exit 2")
    args = parser.parse_args(argv)
    project = ROOT
    try:
        if args.command == "start":
            return cmd_start(project, args.db)
        if args.command == "available":
            require_citus()
            return 0
        if args.command == "createdb":
            return cmd_createdb(project, args.name)
        command = {"stop": ep.cmd_stop, "status": ep.cmd_status, "destroy": ep.cmd_destroy}[args.command]
        return cmd_each(project, command)
    except ep.PgError as e:
        print(f"citus_cluster: {e}", file=sys.stderr, flush=True)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
