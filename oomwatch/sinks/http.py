"""HTTP: `/metrics` (Prometheus text, or OpenMetrics when asked), `/healthz`, `/incidents` (JSON array, newest
last), served by the bounded single-thread server in httpserver.py, with the optional TLS and auth of
webconfig.py on every route but `/healthz` (the kubelet's probes carry no credentials)."""

from __future__ import annotations

import json
import logging
import ssl
from typing import Any, Callable, Iterable, Optional, Union

from prometheus_client import CollectorRegistry

from oomwatch.sinks.httpserver import DEFAULT_LIMITS, HttpServer, Limits, Request, Response, Scrape
from oomwatch.sinks.webconfig import BasicAuth, WebSettings, san_allowed
from oomwatch.store import Store

log = logging.getLogger(__name__)

Health = Callable[[], tuple[bool, dict[str, Any]]]
# The Accept header → (content type, body chunks). Called, and its chunks iterated, on the scrape thread.
MetricsBody = Callable[[str], tuple[str, Iterable[bytes]]]

_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` or `[v6]:PORT` → (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen wants HOST:PORT, got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def metrics_from_registry(registry: CollectorRegistry) -> MetricsBody:
    """A MetricsBody over prometheus_client's own exposition, with its content negotiation (OpenMetrics when
    the scraper offers it, else the text format)."""
    from prometheus_client.exposition import choose_encoder

    def body(accept: str) -> tuple[str, Iterable[bytes]]:
        encoder, content_type = choose_encoder(accept)
        return content_type, (encoder(registry),)

    return body


class HttpSink:
    """The agent's port.

    HttpSink(listen, metrics, store, health, *, web=None, tls=None, limits=Limits())
      listen   "HOST:PORT" (parse_listen); bound here, so a taken port fails construction with OSError
      metrics  a MetricsBody, or a CollectorRegistry (wrapped by metrics_from_registry)
      store    Store: /incidents serves store.snapshot().incidents
      health   () → (ok, detail): /healthz answers 200 or 503 with the detail as JSON
      web      WebSettings from webconfig.load_web_config: basic auth users, client-certificate rule, headers
      tls      what load_web_config returned with it: an SSLContext, or a callable giving the one to use for
               each new connection (RotatingTls: certificates rotated in place); None: plain HTTP
      limits   timeouts and caps (httpserver.Limits)
    """

    metrics_from_registry = staticmethod(metrics_from_registry)

    def __init__(self, listen: str, metrics: Union[MetricsBody, CollectorRegistry], store: Store, health: Health,
                 *, web: Optional[WebSettings] = None,
                 tls: Union[ssl.SSLContext, Callable[[], ssl.SSLContext], None] = None,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        if isinstance(metrics, CollectorRegistry):
            metrics = metrics_from_registry(metrics)
        self._store, self._health = store, health
        self._web = web or WebSettings()
        self._basic = BasicAuth(self._web.basic_auth_users) if self._web.basic_auth_users else None
        if self._web.require_client_cert and tls is None:
            raise ValueError("client certificates need a TLS context")
        self.server = HttpServer(parse_listen(listen), self._route, metrics, limits=limits, tls=tls)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def _route(self, request: Request) -> Union[Response, Scrape]:
        extra = self._web.headers
        if request.path == "/healthz":
            ok, detail = self._health()
            return Response(200 if ok else 503, _JSON, json.dumps(detail).encode() + b"\n", extra)
        denied = self._authorize(request)
        if denied is not None:
            return denied
        if request.path == "/metrics":
            return Scrape(request.headers.get("accept", ""), extra)
        if request.path == "/incidents":
            return Response(200, _JSON, json.dumps(list(self._store.snapshot().incidents)).encode() + b"\n", extra)
        if request.path == "/":
            return Response(200, _TEXT, b"oomwatch: /metrics /healthz /incidents\n", extra)
        return Response(404, _TEXT, b"not found\n", extra)

    def _authorize(self, request: Request) -> Optional[Response]:
        tls = self._web.tls
        if self._web.require_client_cert and not san_allowed(request.peer_cert, tls.client_allowed_sans):
            return Response(403, _TEXT, b"a client certificate signed by client_ca_file is required\n",
                            self._web.headers)
        if self._basic is not None:
            outcome = self._basic.check(request.headers.get("authorization"))
            if outcome == "busy":
                return Response(429, _TEXT, b"too many new credentials; retry\n",
                                (("Retry-After", "1"),) + self._web.headers)
            if outcome != "ok":
                return Response(401, _TEXT, b"unauthorized\n",
                                (("WWW-Authenticate", 'Basic realm="oomwatch"'),) + self._web.headers)
        return None
