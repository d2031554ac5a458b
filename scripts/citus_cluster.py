#!/usr/bin/env python3
"""A local Citus cluster for `make test-citus`: a coordinator and two workers.

Usage (``start`` and ``createdb`` need the project's virtualenv, for psycopg; the
other commands run with the system ``python3`` too)::

    .venv/bin/python scripts/citus_cluster.py start [--db NAME]
    .venv/bin/python scripts/citus_cluster.py stop
    .venv/bin/python scripts/citus_cluster.py status
    .venv/bin/python scripts/citus_cluster.py createdb NAME
    .venv/bin/python scripts/citus_cluster.py destroy
    .venv/bin/python scripts/citus_cluster.py stop-node worker1 [--immediate]
    .venv/bin/python scripts/citus_cluster.py start-node worker1
    .venv/bin/python scripts/citus_cluster.py add-worker [--db NAME]
    python3 scripts/citus_cluster.py available     # exit 0 when citus.so is installed

Every command takes ``--base DIR`` (default ``var/citus``): a cluster of one's own for
a run that stops and restarts nodes (make chaos-citus), beside the shared one.
``stop-node``/``start-node`` take one node down and bring it back on the same port
(``--immediate`` is a crash: ``pg_ctl stop -m immediate``). ``add-worker`` starts one
more worker (worker3, worker4, ...), makes the database a Citus database there and
registers it with the coordinator (``citus_add_node``); it holds no shard until a
rebalance moves some there. It prints the node's ``host:port``.

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
    # Online shard moves and rebalancing (shard_transfer_mode 'force_logical', and
    # 'auto' for tables with a replica identity) copy the shard by logical replication.
    "wal_level = logical",
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


def layouts(project: str, base: str | None = None) -> list[NodeLayout]:
    """The coordinator first, then every worker under `base` (default var/citus): the
    two of NODES and any added by add-worker."""
    base = base or os.path.join(project, "var", "citus")
    added = (
        sorted(
            (name for name in os.listdir(base) if name.startswith("worker") and name not in NODES),
            key=lambda name: int(name[len("worker") :] or 0),
        )
        if os.path.isdir(base)
        else []
    )
    return [NodeLayout(os.path.join(base, name)) for name in (*NODES, *added)]


def reserve_port(layout: NodeLayout) -> None:
    """A random free port for a node's first start, kept for its life: not embedded_pg's
    preferred port, which another cluster could take while this node is stopped (a
    worker that came back on another port would be a different node to Citus)."""
    os.makedirs(layout.link, exist_ok=True)
    # As root the server runs as an unprivileged user, who must traverse every folder;
    # otherwise embedded_pg relocates the node and this port file with it is dropped.
    for path in (os.path.dirname(layout.link), layout.link):
        os.chmod(path, 0o755)
    if ep.stored_port(layout) is None:
        ep.write_port(layout, ep.pick_port(avoid={ep.PREFERRED_PORT}))


def start_node(layout: NodeLayout) -> int:
    """Start (initialising on first use) one node with Citus loaded; return its port."""
    if not layout.initialized():
        reserve_port(layout)
    return ep.start_server(layout, fast=True, dbs=[], settings=CITUS_SETTINGS)


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


def cmd_start(project: str, db: str, base: str | None = None) -> int:
    from scheduler_project.citus import prepare_database

    require_citus()
    ports = [start_node(layout) for layout in layouts(project, base)]
    coordinator, workers = node(ports[0]), [node(p) for p in ports[1:]]
    prepare_database(coordinator=coordinator, workers=workers, db=db)
    print(f"DATABASE_URL={ep.make_url(ports[0], db)}")
    print(f"CRONYARD_CITUS_WORKERS={','.join(workers)}", flush=True)
    return 0


def cmd_createdb(project: str, db: str, base: str | None = None) -> int:
    from scheduler_project.citus import prepare_database

    ports = [ep.server_state(layout).port for layout in layouts(project, base)]
    if not all(ports):
        raise ep.PgError("the Citus cluster is not running (citus_cluster.py start)")
    prepare_database(coordinator=node(ports[0]), workers=[node(p) for p in ports[1:]], db=db)
    return 0


def cmd_each(project: str, command, base: str | None = None) -> int:
    """stop / status / destroy: embedded_pg's own command, node by node (workers last)."""
    status = 0
    for layout in layouts(project, base):
        name = os.path.basename(layout.link)
        print(f"== {name}", file=sys.stderr if command is not ep.cmd_status else sys.stdout, flush=True)
        status = command(layout) or status
    return status


def named(project: str, base: str | None, name: str) -> NodeLayout:
    for layout in layouts(project, base):
        if os.path.basename(layout.link) == name:
            return layout
    raise ep.PgError(f"no node {name!r} in this cluster")


def cmd_add_worker(project: str, db: str, base: str | None = None) -> int:
    from scheduler_project.citus import prepare_database

    require_citus()
    existing = layouts(project, base)
    coordinator = ep.server_state(existing[0]).port
    if not coordinator:
        raise ep.PgError("the Citus cluster is not running (citus_cluster.py start)")
    name = f"worker{len(existing)}"
    layout = NodeLayout(os.path.join(os.path.dirname(existing[0].link), name))
    worker = node(start_node(layout))
    prepare_database(coordinator=node(coordinator), workers=[worker], db=db)
    print(worker, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="citus_cluster.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--base", help="the cluster's folder (default: var/citus)")
    p = sub.add_parser(
        "start", parents=[common], help="init if needed, start the nodes, prepare the database"
    )
    p.add_argument("--db", default=ep.DEFAULT_DB)
    p = sub.add_parser("createdb", parents=[common], help="create a Citus database on every node")
    p.add_argument("name")
    for name in ("stop", "status", "destroy"):
        sub.add_parser(name, parents=[common])
    p = sub.add_parser("stop-node", parents=[common], help="stop one node (coordinator, worker1, ...)")
    p.add_argument("name")
    p.add_argument("--immediate", action="store_true", help="pg_ctl stop -m immediate: a crash")
    p = sub.add_parser("start-node", parents=[common], help="start one node again, on its own port")
    p.add_argument("name")
    p = sub.add_parser("add-worker", parents=[common], help="start one more worker and citus_add_node it")
    p.add_argument("--db", default=ep.DEFAULT_DB)
    sub.add_parser("available", help="exit 0 if Citus is installed, else say so and exit 2")
    args = parser.parse_args(argv)
    project = ROOT
    base = os.path.abspath(args.base) if getattr(args, "base", None) else None
    try:
        if args.command == "start":
            return cmd_start(project, args.db, base)
        if args.command == "available":
            require_citus()
            return 0
        if args.command == "createdb":
            return cmd_createdb(project, args.name, base)
        if args.command == "add-worker":
            return cmd_add_worker(project, args.db, base)
        if args.command == "stop-node":
            return ep.cmd_stop(
                named(project, base, args.name), mode="immediate" if args.immediate else "fast"
            )
        if args.command == "start-node":
            print(node(start_node(named(project, base, args.name))), flush=True)
            return 0
        command = {"stop": ep.cmd_stop, "status": ep.cmd_status, "destroy": ep.cmd_destroy}[args.command]
        return cmd_each(project, command, base)
    except ep.PgError as e:
        print(f"citus_cluster: {e}", file=sys.stderr, flush=True)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
