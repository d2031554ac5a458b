"""A real HTTP server on 127.0.0.1 for executor tests: records every request and
answers from a per-path script (status codes, delays, headers)."""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    method: str
    headers: dict[str, str]
    body: bytes
    at: float
    # Every header line as sent, in order (`headers` keeps one value per name).
    header_lines: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Reply:
    status: int = 200
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        # A SIGKILLed executor resets its connections: expected in chaos runs, not news.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class HttpTarget:
    def __init__(self, *, keep_requests: bool = True) -> None:
        # A chaos run makes ~10^5 requests: it keeps only (idempotency key, attempt).
        self.keep_requests = keep_requests
        self.requests: list[Received] = []
        self.keys: set[tuple[str, str]] = set()
        # Idempotency-Key -> time.time() of its first request: when each (job, slot)
        # reached the target, for the chaos driver's rates and lateness.
        self.first_seen: dict[str, float] = {}
        self.count = 0
        self._scripts: dict[str, list[Reply]] = {}
        self._default: dict[str, Reply] = {}
        self._outages: dict[str, tuple[float, Reply]] = {}
        self._lock = threading.Lock()
        target = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?")[0]
                with target._lock:
                    target.count += 1
                    key = self.headers.get("Idempotency-Key")
                    if key is not None:
                        target.keys.add((key, self.headers.get("X-Run-Attempt", "")))
                        target.first_seen.setdefault(key, time.time())
                    if target.keep_requests:
                        target.requests.append(
                            Received(
                                path,
                                self.command,
                                {k.lower(): v for k, v in self.headers.items()},
                                body,
                                time.time(),
                                list(self.headers.items()),
                            )
                        )
                    script = target._scripts.get(path)
                    reply = script.pop(0) if script else target._default.get(path, Reply())
                    outage = target._outages.get(path)
                    if outage is not None and time.time() < outage[0]:
                        reply = outage[1]
                if reply.delay:
                    time.sleep(reply.delay)
                try:
                    self.send_response(reply.status)
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *replies: Reply, then: Reply | None = None) -> None:
        """Answer the next requests to `path` with `replies` in order, then `then` forever."""
        with self._lock:
            self._scripts[path] = list(replies)
            if then is not None:
                self._default[path] = then

    def outage(self, path: str, seconds: float, reply: Reply | None = None) -> float:
        """Answer `reply` (503) to every request to `path` for the next `seconds`; returns its end."""
        until = time.time() + seconds
        with self._lock:
            self._outages[path] = (until, reply or Reply(503, body=b"down"))
        return until

    def received(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if path is None or r.path == path]

    def json_bodies(self, path: str) -> list:
        return [json.loads(r.body or b"null") for r in self.received(path)]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
