"""HTTP: `/metrics` (Prometheus text, or OpenMetrics when asked), `/healthz` (readiness), `/livez` (liveness),
`/incidents` (JSON array, newest last), served by the bounded single-thread server in httpserver.py, with the
optional TLS and auth of webconfig.py on every route but the probes' (the kubelet's probes carry no credentials)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union

from oomwatch.sinks.httpserver import DEFAULT_LIMITS, Answer, Check, HttpServer, Limits, Request, Response, Scrape

if TYPE_CHECKING:
    import ssl  # only with TLS (5 MiB of RSS): the web config brings it

    from prometheus_client import CollectorRegistry

    from oomwatch.sinks.webconfig import BasicAuth, WebSettings

log = logging.getLogger(__name__)

Health = Callable[[], tuple[bool, dict[str, Any]]]
# The Accept header → (content type, body chunks). Called, and its chunks iterated, on the scrape thread.
# HttpSink calls it with "" (one format for every client, so every client shares the running scrape).
MetricsBody = Callable[[str], tuple[str, Iterable[bytes]]]

# What a CollectorRegistry's scrape is keyed by: one of two formats, never the raw header (100 clients with
# 100 different Accept headers were 100 scrapes in a row, and a normal one waited behind them all).
_OPENMETRICS_ACCEPT = "application/openmetrics-text; version=1.0.0"

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


def registry_scrape_key(accept: str) -> str:
    """The format a CollectorRegistry's scrape is served in for this Accept header, as an Accept header
    choose_encoder reads: OpenMetrics 1.0.0 when offered, else the text format ("")."""
    for offer in accept.split(","):
        if offer.split(";")[0].strip().lower() == "application/openmetrics-text":
            return _OPENMETRICS_ACCEPT
    return ""


def client_cert_allowed(peer_cert: Optional[dict], allowed_sans: frozenset[str]) -> bool:
    """A client certificate the handshake verified, carrying one of the allowed subject alternative names
    (any, when none are listed). Names as Python's ssl gives them: ("DNS", …), ("IP Address", …), …"""
    if peer_cert is None:
        return False
    if not allowed_sans:
        return True
    return any(kind in ("DNS", "IP Address", "email", "URI") and value in allowed_sans
               for kind, value in peer_cert.get("subjectAltName", ()))


class IncidentsBody:
    """/incidents' body, encoded once for a given list of incidents and shared by every response until the list
    changes (the store appends each incident's JSON once and never changes it, so the same objects in the same
    order give the same text). 8 clients looping on /incidents after 90 group kills of 3,000 processes were 8
    copies of a 3 MB body and of the text it was encoded from at once: 136-144 MiB of RSS."""

    def __init__(self) -> None:
        self._incidents: tuple[Any, ...] = ()
        self._body: Optional[bytes] = None

    def of(self, incidents: tuple[Any, ...]) -> bytes:
        if self._body is None or len(incidents) != len(self._incidents) or \
                any(a is not b for a, b in zip(incidents, self._incidents)):
            self._body = None  # the old body goes before the new one is made
            self._body = json.dumps(list(incidents)).encode() + b"\n"
            self._incidents = incidents
        return self._body


class HttpSink:
    """The agent's port.

    HttpSink(listen, metrics, store, health, *, web=None, tls=None, limits=Limits())
      listen   "HOST:PORT" (parse_listen); bound here, so a taken port fails construction with OSError
      metrics  a MetricsBody (one format, whatever the scraper's Accept: called with ""), or a
               CollectorRegistry (OpenMetrics when the scraper offers it, else the text format)
      store    anything with .snapshot(): /incidents serves its .incidents
      health   () → (ok, detail): /healthz answers 200 or 503 with the detail as JSON
      web      WebSettings from webconfig.load_web_config: basic auth users, client-certificate rule, headers
      tls      what load_web_config returned with it: an SSLContext, or a callable giving the one to use for
               each new connection (RotatingTls: certificates rotated in place); None: plain HTTP
      limits   timeouts and caps (httpserver.Limits)

    Scrapes that failed (the body raised, or ran past the write timeout) are counted, for the agent's health:
    `failed_scrapes`, `last_scrape_error` (text, kept) and `last_scrape_failed` (the latest scrape failed).
    """

    metrics_from_registry = staticmethod(metrics_from_registry)

    def __init__(self, listen: str, metrics: Union[MetricsBody, CollectorRegistry], store: Any, health: Health,
                 *, web: Optional[WebSettings] = None,
                 tls: Union[ssl.SSLContext, Callable[[], ssl.SSLContext], None] = None,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self._scrape_key: Callable[[str], str] = lambda accept: ""
        if not callable(metrics):  # a CollectorRegistry
            metrics = metrics_from_registry(metrics)
            self._scrape_key = registry_scrape_key
        self._store, self._health = store, health
        self._incidents = IncidentsBody()
        self._headers: tuple[tuple[str, str], ...] = web.headers if web else ()
        self._client_sans = None  # with RequireAndVerifyClientCert: the allowed SANs (empty: any)
        self._basic: Optional[BasicAuth] = None
        if web is not None:
            from oomwatch.sinks.webconfig import BasicAuth

            if web.basic_auth_users:
                self._basic = BasicAuth(web.basic_auth_users)
            if web.require_client_cert:
                if tls is None:
                    raise ValueError("client certificates need a TLS context")
                self._client_sans = web.tls.client_allowed_sans
        self.server = HttpServer(parse_listen(listen), self._route, metrics, limits=limits, tls=tls)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    @property
    def basic_auth(self) -> Optional[BasicAuth]:
        """The web config's basic-auth users, whose verify() a new credential's check calls; None: no basic auth."""
        return self._basic

    @property
    def failed_scrapes(self) -> int:
        return self.server.failed_scrapes

    @property
    def last_scrape_error(self) -> Optional[str]:
        return self.server.last_scrape_error

    @property
    def last_scrape_failed(self) -> bool:
        return self.server.last_scrape_failed

    def health(self) -> dict[str, str]:
        """A failed scrape, until one succeeds again (the server's thread sets both)."""
        error = self.server.last_scrape_error
        return {"scrape": f"the last scrape failed: {error}"} if self.server.last_scrape_failed else {}

    def _route(self, request: Request) -> Answer:
        if request.path == "/healthz":
            ok, detail = self._health()
            return Response(200 if ok else 503, _JSON, json.dumps(detail).encode() + b"\n", self._headers)
        if request.path == "/livez":  # the liveness probe's: answered while the process serves, whatever /healthz
            # says (starting, over the cap, blind: a restart mends none of those)
            return Response(200, _JSON, b'{"live": "ok"}\n', self._headers)
        if self._client_sans is not None and not client_cert_allowed(request.peer_cert, self._client_sans):
            return Response(403, _TEXT, b"a client certificate signed by client_ca_file is required\n",
                            self._headers)
        if self._basic is not None:
            header = request.headers.get("authorization")
            known = self._basic.known(header)
            if known == "denied":
                return self._unauthorized()
            if known is None:  # new credentials: a bcrypt check, off the loop, paced per client
                busy = Response(429, _TEXT, b"too many new credentials; retry\n",
                                (("Retry-After", "1"),) + self._headers, hold=1.0)
                if not self._basic.admit(request.client):
                    return busy
                basic = self._basic
                return Check(request.client, lambda: basic.verify(header or ""),
                             lambda ok: self._authorized(request) if ok else self._unauthorized(), busy)
        return self._authorized(request)

    def _unauthorized(self) -> Response:
        return Response(401, _TEXT, b"unauthorized\n",
                        (("WWW-Authenticate", 'Basic realm="oomwatch"'),) + self._headers)

    def _authorized(self, request: Request) -> Union[Response, Scrape]:
        extra = self._headers
        if request.path == "/metrics":
            return Scrape(self._scrape_key(request.headers.get("accept", "")), extra)
        if request.path == "/incidents":
            return Response(200, _JSON, self._incidents.of(tuple(self._store.snapshot().incidents)), extra)
        if request.path == "/":
            return Response(200, _TEXT, b"oomwatch: /metrics /healthz /incidents\n", extra)
        return Response(404, _TEXT, b"not found\n", extra)
