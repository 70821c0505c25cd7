"""HTTP: `/metrics` (Prometheus text), `/healthz`, `/incidents` (JSON array, newest last)."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from oomwatch.store import Store

log = logging.getLogger(__name__)

Health = Callable[[], tuple[bool, dict[str, Any]]]


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` or `[v6]:PORT` → (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen wants HOST:PORT, got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class HttpSink:
    def __init__(self, listen: str, registry: CollectorRegistry, store: Store, health: Health) -> None:
        host, port = parse_listen(listen)
        self._registry, self._store, self._health = registry, store, health
        sink = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "oomwatch"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        self._send(200, CONTENT_TYPE_LATEST, generate_latest(sink._registry))
                    elif path == "/healthz":
                        ok, detail = sink._health()
                        self._send(200 if ok else 503, "application/json", json.dumps(detail).encode() + b"\n")
                    elif path == "/incidents":
                        body = json.dumps(list(sink._store.snapshot().incidents)).encode() + b"\n"
                        self._send(200, "application/json", body)
                    elif path == "/":
                        self._send(200, "text/plain; charset=utf-8",
                                   b"oomwatch: /metrics /healthz /incidents\n")
                    else:
                        self._send(404, "text/plain; charset=utf-8", b"not found\n")
                except BrokenPipeError:
                    pass

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http: " + fmt, *args)

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.server_address[:2]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
