"""The benchmarks' HTTP target: a no-op aiohttp server on uvloop, in its own process.

    .venv/bin/python bench/noop_server.py --port 8765 [--record]

Every method and path answers 200 "ok" after reading the body, except paths under
`/fail-twice`: those answer 503 to the first two requests of each `Idempotency-Key`, so a
run needs three attempts (bench/storage.py measures such a run's row). With --record it also
keeps, per request, the wall-clock arrival time and the X-Scheduled-At header the
executor sends (runs/execution/targets.run_headers), so bench/lag.py can compute arrival -
scheduled_at; `GET /__arrivals` returns them as JSON, `GET /__count` how many, and `POST /__reset`
forgets them.
Recording is two list appends: parsing the header waits until the numbers are read.

`NoopServer` starts and stops it from another script; the same process serves both
Cronyard's executors and bench/raw_http.py, so the two are measured against one server.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import time

ARRIVALS_PATH = "/__arrivals"
COUNT_PATH = "/__count"
RESET_PATH = "/__reset"
FAIL_TWICE_PATH = "/fail-twice"


def serve(port: int, record: bool) -> None:
    from aiohttp import web

    arrivals: list[float] = []
    scheduled: list[str] = []

    failures: dict[str, int] = {}

    async def ok(request: web.Request) -> web.Response:
        if request.path.startswith(FAIL_TWICE_PATH):
            key = request.headers.get("Idempotency-Key", "")
            failures[key] = failures.get(key, 0) + 1
            if failures[key] <= 2:
                await request.read()
                return web.Response(status=503, text="try again")
        if record:
            arrivals.append(time.time())
            scheduled.append(request.headers.get("X-Scheduled-At", ""))
        await request.read()
        return web.Response(text="ok")

    async def dump(request: web.Request) -> web.Response:
        return web.Response(text=json.dumps({"arrivals": arrivals, "scheduled_at": scheduled}))

    async def count(request: web.Request) -> web.Response:
        return web.Response(text=str(len(arrivals)))

    async def reset(request: web.Request) -> web.Response:
        arrivals.clear()
        scheduled.clear()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get(ARRIVALS_PATH, dump)
    app.router.add_get(COUNT_PATH, count)
    app.router.add_post(RESET_PATH, reset)
    app.router.add_route("*", "/{tail:.*}", ok)
    import uvloop

    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=1024)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"no-op HTTP server did not start on port {port}")


class NoopServer:
    """The server in a child process: `with NoopServer(record=True) as server: server.url`."""

    def __init__(self, *, record: bool = False) -> None:
        self.port = free_port()
        self.record = record
        self._process: multiprocessing.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/noop"

    def cpu_seconds(self) -> float:
        """The server process's CPU so far: what answering costs, beside each client's."""
        from bench import cpu

        return cpu.cpu_seconds(self._process.pid) if self._process is not None else 0.0

    def __enter__(self) -> NoopServer:
        # spawn: a fork of a Django process would carry its connections along.
        ctx = multiprocessing.get_context("spawn")
        self._process = ctx.Process(target=serve, args=(self.port, self.record), daemon=True)
        self._process.start()
        wait_port(self.port)
        return self

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.join(timeout=10)
            self._process = None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--record", action="store_true", help="keep arrival times (bench/lag.py)")
    args = parser.parse_args()
    serve(args.port, args.record)


if __name__ == "__main__":
    main()
