"""A small HTTP/1.1 server for a node agent: one thread on one selector, one worker thread for scrapes (and,
with basic auth, one for password checks), and a bound on everything a client controls.

Why not `http.server`: its ThreadingHTTPServer runs a thread per connection with no timeouts and no cap (2,000
idle connections were 2,003 threads), and `serve_forever` wakes every 0.5 s to poll for shutdown. Why not a
server from PyPI (measured, benchmarks/RESULTS.md): waitress 3.0 runs 5 threads, wakes once a second and, at
its connection limit, stops accepting, so idle connections lock a scraper out; cheroot 11 runs 12 threads and
wakes about twice a second. What Prometheus needs is GET, keep-alive and streaming: this is 2 threads, never
woken while idle.

What a client can make this server do, at most:
- with TLS, start at most `tls_handshakes_per_client` handshakes a second (after a burst of twice as many):
  a new connection beyond is closed before its handshake costs any CPU.
- hold `max_connections` sockets, each with at most `max_header_bytes` of unparsed request. At the cap a new
  connection replaces one of the client that holds the most connections (a client is an IPv4 address or an
  IPv6 /64): the one of them that has waited longest without a complete request, else its oldest. A flood
  of idle, slow or never-reading connections from one client replaces its own, not a scraper's.
- take `header_timeout` seconds to send a request head or finish a TLS handshake (from accept, or from the
  first byte of a keep-alive request), `idle_timeout` between keep-alive requests and `write_timeout` to
  receive a response.
- be sent, per turn of the loop, a share of SEND_PER_CLIENT by the connections its client holds: many
  connections of one client get the bandwidth of one, and a turn (a /healthz waiting behind it) stays short.
- have at most `max_pipelined` requests answered from what it sent before reading an answer (pipelining):
  beyond, the connection is closed. Buffered requests are answered from the loop, one per connection per turn,
  never by recursion.
- start at most one scrape at a time, and scrapes that take at most `scrape_cpu_share` of a core in all (the
  next starts no sooner than the last one's CPU time allows: the pacing window), so a flood of scrapers cannot
  take the CPU that the agent's kernel-log reading needs. A scrape wanted by a client that was served none
  in the last `paced_within` seconds (Prometheus, every 15-60 s) starts without waiting for the window: a
  client scraping back to back cannot make a scraper on another address wait for it, and each address can
  add at most one such scrape a second (a client is an address, which a peer cannot make up without end).
  Requests that want the same scrape (same key: the
  route makes keys from a small set, never from a raw header) share it: a request joins the running scrape
  while its body is whole, else takes the body of the scrape that ended within the pacing window if its client
  was not served that body, else waits for the next scrape, which all that wait share. A request whose client
  has gone before its scrape starts costs nothing. At most `max_bodies` finished scrape bodies stay in memory
  for slow readers; the slowest are dropped beyond.
- have at most `scrapes_per_client` of its requests served from scrapes at a time (Prometheus sends one per
  target, an HA pair behind one address two). Its further requests wait their turn, parsed but unanswered and
  taking no part in any scrape, so another client's request never waits behind them: a flood of connections
  from one address is served two at a time while a scraper on another address joins the scrape that runs.
  A client's connections, however many, also share one client's bandwidth (above).
- make a keep-alive connection of its own address wait for the scrape that runs, no more (fairness per
  connection, not only per address: behind a node-local proxy, a NAT or hostNetwork a flood and Prometheus
  share an address). A client's waiting requests take their turns by how long each connection left the server
  alone before asking (its idle gap: since its last response ended; none for a connection's first request):
  those idle `patient_gap` or more first, longest first, then the others in the order they asked (so none of
  them starves). A keep-alive scraper that asks every 15 s is next in its address's turns, before connections
  asking back to back and before new ones, whatever their number; as a finished body is taken once per
  connection (not once per address), it takes the body of the scrape that runs as it ends instead of waiting
  for the pacing window. At the connection cap, a connection that never had a response is replaced
  before an idle keep-alive one that had.
- keep a body whole only while scrapes are wanted concurrently (a second request shares it, or it was asked
  for while another ran), and then until the pacing window after it ends: a newcomer joins such a body from
  its start or takes it just after, never waiting for the scrape after it. A lone scraper's body (Prometheus,
  or one client scraping back to back) is dropped as it is sent, as before: its memory. A body
  taken just after its scrape is at most the pacing window old (the scrape's own CPU time, at the default
  share): Prometheus stamps samples with the time it asked, and values read that much earlier are what a
  scrape that started that much earlier would have given (the body itself is read over a scrape's whole
  duration); no fresher body could be made before the window ends anyway.
- wait for a slow check the route asks for (`Check`: a bcrypt password check) on the check thread, one check
  at a time, at most one waiting per client and `max_checks_waiting` in all (beyond, the route's `busy`
  answer). The client whose last check is oldest goes first; one who never had one goes at once, the others
  when the checks so far have taken no more than `check_cpu_share` of a core, so a guesser neither burns the
  CPU nor delays a scraper's first check by more than the one running. The loop keeps answering meanwhile.
- no request bodies: a request with one is answered 400 and the connection closed.
- log: at most one line per kind of misbehaviour every 10 s (with how many were left out), never a traceback
  per connection.

A scrape that fails (the producer raises, or it is still running after `write_timeout`) is counted in
`failed_scrapes`, with `last_scrape_error` and `last_scrape_failed` (until the next scrape succeeds), so the
agent's health can include it.

When nothing happens the loop blocks in the selector with no timeout (no connection holds a deadline): an
idle agent is not woken by this server.
"""

from __future__ import annotations

import bisect
import logging
import os
import queue
import selectors
import socket
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union

if TYPE_CHECKING:
    import ssl  # imported when TLS is configured: it costs 5 MiB of RSS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    max_connections: int = 256
    header_timeout: float = 10.0  # accept (or a keep-alive request's first byte) → end of the request head
    idle_timeout: float = 90.0  # between keep-alive requests; above Prometheus' usual 30-60 s interval
    write_timeout: float = 60.0  # request complete → response sent (the scrape's own time included)
    max_header_bytes: int = 16 * 1024  # request line + headers; Prometheus sends under 1 KiB
    max_header_lines: int = 64
    max_bodies: int = 3  # finished scrape bodies kept for clients still reading them
    max_pipelined: int = 16  # requests answered from one burst before the client reads (Prometheus sends 1)
    max_checks_waiting: int = 64  # clients waiting for a password check
    check_cpu_share: float = 0.25  # of one core, at most, for checks: after one of c CPU seconds, c × 3 without
    scrape_cpu_share: float = 0.5  # of one core, at most, for scrapes: after one of c CPU seconds, c without
    scrapes_per_client: int = 2  # a client's requests served from scrapes at once; its others wait their turn
    paced_within: float = 1.0  # a client served a scrape this recently waits for the pacing window
    patient_gap: float = 0.1  # a connection idle this long before asking takes its client's turns before those
    # that ask back to back (longest idle first): a keep-alive scraper among a flood of its own address
    tls_handshakes_per_client: float = 20.0  # a second, after a burst of twice as many: beyond, closed unread


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query string
    version: str  # "HTTP/1.0" or "HTTP/1.1"
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    peer_cert: Optional[dict]  # the client certificate the TLS handshake verified, else None
    client: str = ""  # client_key() of the peer: what per-client limits count by


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    hold: float = 0.0  # seconds the server waits before sending it: a client told to retry later (429) cannot
    # make it answer faster, so a flood of refused requests costs a timer, not a loop turn each


@dataclass(frozen=True)
class Scrape:
    """A route's answer whose body the scrape worker computes: requests with the same key share one run.
    Keys must come from a small set (a format name), never from a raw header: each distinct key waiting is a
    scrape run after the other."""

    key: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Check:
    """A route's answer that needs slow work first (a bcrypt check): `work` runs on the check thread, then
    `then(result)` on the loop gives the answer. `busy` is answered instead when this client already has a
    check waiting or `max_checks_waiting` clients do."""

    client: str
    work: Callable[[], Any]
    then: Callable[[Any], Union[Response, Scrape]]
    busy: Response


Answer = Union[Response, Scrape, Check]


@dataclass(frozen=True)
class ScrapeState:
    """One scrape as HttpServer.state() shows it."""

    key: str
    serial: int  # the how-manieth scrape started (as `scrapes` counts); 0: waiting to start
    readers: tuple[tuple[str, int], ...]  # peers (host, port) served from it now
    kept_whole: bool  # no chunk dropped as sent: a newcomer can join it from the start
    chunks_dropped: int  # chunks every reader had, released
    chunks_held: int  # chunks in memory now
    done: bool
    reuse_until: float  # (monotonic) a finished body kept whole: newcomers take it until then


@dataclass(frozen=True)
class ConnectionState:
    """One connection as HttpServer.state() shows it."""

    peer: tuple[str, int]  # (host, port) as accept() gave it: the client's getsockname()
    client: str  # client_key(peer): what per-client limits count by
    state: str  # handshake | idle | head | checking | holding | queued | waiting | writing
    scrape: int  # the serial of the scrape it is served from; 0: none, or one not started yet
    chunks_sent: int  # chunks of that scrape's body handed to its socket so far
    gap: float  # seconds it left the server alone before its current request (its turn's order)


@dataclass(frozen=True)
class ServerState:
    """What the server holds between two turns of its loop (HttpServer.state()): for tests, benchmarks and
    debugging."""

    connections: tuple[ConnectionState, ...]
    running: Optional[ScrapeState]
    pending: tuple[ScrapeState, ...]  # scrapes waiting to start, oldest first
    last: Optional[ScrapeState]  # the last finished body, kept whole for newcomers within the pacing window
    finished: tuple[ScrapeState, ...]  # finished bodies still being read (at most max_bodies)
    scraping: dict[str, int]  # client → its connections served from scrapes now
    queued: dict[str, tuple[tuple[str, int], ...]]  # client → the peers of its requests waiting, in turn order
    checks_waiting: tuple[str, ...]  # clients with a check waiting (not the one running)

    def connection(self, peer: tuple[str, int]) -> Optional[ConnectionState]:
        return next((c for c in self.connections if c.peer == peer), None)
Handler = Callable[[Request], Answer]
# Scrape key → (content type, body chunks); called and iterated on the worker thread.
Producer = Callable[[str], tuple[str, Iterable[bytes]]]

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_WOULD_BLOCK = (BlockingIOError, InterruptedError)
SEND_PER_CLIENT = 1 << 20  # bytes a turn of the loop sends to one client, shared by its connections
SEND_MIN = 16 << 10  # and to one connection at least


def send_share(connections: int) -> int:
    """Bytes one turn of the loop sends to a connection whose client holds `connections`: a share of
    SEND_PER_CLIENT, SEND_MIN at least."""
    return max(SEND_MIN, SEND_PER_CLIENT // max(1, connections))


def name_os_thread(name: str) -> None:
    """Name the calling thread in /proc/PID/task/TID/comm (top -H, benchmarks); Python before 3.14 does not."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(name[:15])
    except OSError:
        pass  # no /proc: a nicety, not a need


def client_key(address: Any) -> str:
    """What per-client limits count by, from a peer address as accept() gives it: the IPv4 address, or the
    IPv6 /64 (one host is routinely given a whole /64, so its addresses are one client); an IPv4-mapped IPv6
    address (a dual-stack listener) is its IPv4 address."""
    import ipaddress  # at the first client, not at the start (which needs no more than the port)

    host = address[0] if isinstance(address, tuple) and address else str(address)
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class PerClientRate:
    """A token bucket per client: `admit(client)` at most `per_second` times a second after a burst of `burst`.
    The least recently seen of more than `max_clients` clients is forgotten (it starts afresh if it returns)."""

    def __init__(self, per_second: float, burst: float, clock: Callable[[], float] = time.monotonic,
                 max_clients: int = 4096) -> None:
        self.per_second, self.burst, self._clock, self._max = per_second, burst, clock, max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client → (tokens, when)

    def admit(self, client: str) -> bool:
        now = self._clock()
        tokens, at = self._buckets.pop(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.per_second)
        allowed = tokens >= 1
        self._buckets[client] = (tokens - 1 if allowed else tokens, now)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        return allowed


class Throttled:
    """Logs one kind of message at most once per `every` seconds, saying how many were left out in between:
    a client can make the server misbehave once per connection, and must not fill the log doing it."""

    def __init__(self, every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self._clock = every, clock
        self._last: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def log(self, kind: str, level: int, message: str, *args: Any, exc_info: Any = None) -> bool:
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.every:
            self._left_out[kind] = self._left_out.get(kind, 0) + 1
            return False
        self._last[kind] = now
        left_out = self._left_out.pop(kind, 0)
        if left_out:
            message += f" ({left_out} more like it since the last one logged)"
        log.log(level, message, *args, exc_info=exc_info)
        return True


class HeadError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def parse_head(buffer: bytes | bytearray, limits: Limits) -> Optional[tuple[Request, int]]:
    """The request head at the start of `buffer` and its length, or None while it is incomplete.
    Raises HeadError when it is malformed or over the limits (complete or not)."""
    end = buffer.find(b"\r\n\r\n")
    size = end + 4
    if end < 0:
        end = buffer.find(b"\n\n")
        size = end + 2
    if end < 0 or end > limits.max_header_bytes:
        if len(buffer) > limits.max_header_bytes:
            raise HeadError(431, "request head too large")
        if buffer.count(b"\n") > limits.max_header_lines:
            raise HeadError(431, "too many header lines")
        return None
    lines = bytes(buffer[:end]).split(b"\n")
    if len(lines) > limits.max_header_lines + 1:
        raise HeadError(431, "too many header lines")
    parts = lines[0].rstrip(b"\r").split(b" ")
    if len(parts) != 3 or not parts[0] or not set(parts[0]) <= _TOKEN or not parts[1]:
        raise HeadError(400, "malformed request line")
    version = parts[2].decode("ascii", "replace")
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise HeadError(505 if version.startswith("HTTP/") else 400, "unsupported HTTP version")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        line = line.rstrip(b"\r")
        name, sep, value = line.partition(b":")
        if not sep or not name or not set(name) <= _TOKEN:  # also refuses obsolete line folding
            raise HeadError(400, "malformed header line")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    target = parts[1].decode("latin-1")
    return Request(parts[0].decode("ascii"), target.split("?", 1)[0], version, headers, None), size


class _Flight:
    """One scrape: the worker appends chunks, the loop sends them to every connection that joined and drops
    each chunk once all of them have it, so a streamed body does not pile up in memory."""

    __slots__ = ("key", "content_type", "chunks", "base", "done", "error", "conns", "abandoned", "started",
                 "overdue", "cpu", "keep", "clients", "reuse_until", "serial")

    def __init__(self, key: str) -> None:
        self.key = key
        self.serial = 0  # the how-manieth scrape started (HttpServer.scrapes when it started); 0: not yet
        self.started = 0.0  # when the worker was given it (monotonic)
        self.overdue = False  # still running after write_timeout: counted as failed once
        self.cpu = 0.0  # CPU seconds the worker spent on it (set when done)
        self.content_type: Optional[str] = None
        self.chunks: list[bytes] = []  # the worker appends; the loop deletes from the front
        self.base = 0  # how many chunks were dropped from the front (a connection's chunk index is absolute)
        self.done = False
        self.error: Optional[BaseException] = None
        self.conns: set[_Conn] = set()
        self.abandoned = False  # every client left: the worker stops producing
        self.keep = False  # drop no chunk: a newcomer can still have the whole body (scrapes back to back)
        self.clients: set[str] = set()  # the clients served from it (a client takes a finished body once)
        self.reuse_until = 0.0  # (monotonic) finished and kept: newcomers take it until then (pacing window)


class _Conn:
    __slots__ = ("sock", "tls", "state", "inbuf", "out", "deadline", "since", "events", "keep_alive",
                 "flight", "extra_headers", "chunk", "chunked", "headers_sent", "terminated", "peer_cert",
                 "closed", "client", "burst", "check", "held", "release_at", "scrape", "idle_since", "gap",
                 "served", "last_serial", "peer")

    def __init__(self, sock: socket.socket, tls: bool, now: float, header_timeout: float, client: str,
                 peer: tuple[str, int] = ("", 0)) -> None:
        self.sock = sock
        self.peer = peer
        self.tls = tls
        self.client = client
        # handshake | idle | head | checking | holding | queued | waiting | writing
        self.state = "handshake" if tls else "head"
        self.inbuf = bytearray()
        self.out: deque[memoryview] = deque()
        self.deadline: Optional[float] = now + header_timeout
        self.since = now  # when it last started waiting for a request (eviction order)
        self.events = 0
        self.keep_alive = True
        self.flight: Optional[_Flight] = None
        self.extra_headers: tuple[tuple[str, str], ...] = ()
        self.chunk = 0
        self.chunked = False
        self.headers_sent = False
        self.terminated = False
        self.peer_cert: Optional[dict] = None
        self.closed = False
        self.burst = 0  # requests parsed since the client's input was last found empty (pipelining)
        self.check: Optional[Check] = None  # the password check it waits for
        self.held: Optional[Response] = None  # a response it waits for (Response.hold), until release_at
        self.release_at = 0.0
        self.scrape: Optional[Scrape] = None  # the scrape it waits to join (queued: its client has its share)
        self.idle_since = now  # when its last response ended
        self.gap = 0.0  # seconds it left the server alone before its current request (its turn's order)
        self.served = False  # a response of it ended (an idle keep-alive one is replaced after the others)
        self.last_serial = 0  # the scrape whose body it was last served (a connection takes a body once)

    @property
    def evictable(self) -> bool:
        return self.state in ("handshake", "idle", "head")


class HttpServer:
    """Serves `handler` on `address` from one thread; `producer` runs scrapes on a second one, and the
    handler's `Check`s run on a third, started at the first.

    Read from other threads (the agent's health): `scrapes` started, `failed_scrapes`, `last_scrape_error`
    (text of the latest failure, kept), `last_scrape_failed` (the latest scrape that ended failed); `state()`:
    what it holds (connections, scrapes, turns), as its loop sees it between two turns."""

    def __init__(self, address: tuple[str, int], handler: Handler, producer: Producer, *,
                 limits: Limits = DEFAULT_LIMITS,
                 tls: Union[ssl.SSLContext, Callable[[], ssl.SSLContext], None] = None) -> None:
        self.limits, self._handler, self._producer, self._tls = limits, handler, producer, tls
        # A callable gives the context to use for each new connection (certificates rotated in place).
        self._tls_now = tls if callable(tls) else (lambda: tls)
        self._would_block: tuple[type[BaseException], ...] = _WOULD_BLOCK
        if tls is not None:
            import ssl

            self._would_block += (ssl.SSLWantReadError, ssl.SSLWantWriteError)
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and host == "::":
                self._listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual stack
            self._listener.bind((host, port))
            self._listener.listen(128)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            raise
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._wake_pending = False
        self._stopping = False
        self._conns: set[_Conn] = set()
        self._accepting = True
        self._running: Optional[_Flight] = None
        self._pending: dict[str, _Flight] = {}
        self._finished: deque[_Flight] = deque()  # done flights whose body someone is still reading
        self._last: Optional[_Flight] = None  # the last finished body, kept whole: newcomers take it
        self._served_at: OrderedDict[str, float] = OrderedDict()  # client → when its last scrape ended
        self._scraping: dict[str, int] = {}  # client → its connections in a scrape (joined to a flight)
        self._queued: dict[str, list[_Conn]] = {}  # client → its connections waiting, in turn order (_turn)
        self._freed: deque[str] = deque()  # clients with a scrape just ended: their next queued one joins
        self._work: queue.SimpleQueue[Optional[_Flight]] = queue.SimpleQueue()
        self.scrapes = 0  # scrapes started
        self.failed_scrapes = 0  # the producer raised, or ran past write_timeout
        self.last_scrape_error: Optional[str] = None
        self.last_scrape_failed = False
        self._scrape_next_at = 0.0  # (monotonic) no scrape starts before: scrape_cpu_share
        self._held: set[_Conn] = set()  # connections waiting for a held response (Response.hold)
        self._held_by: dict[str, int] = {}  # client → how many connections it holds
        self._ready: deque[_Conn] = deque()  # responses done: the next (pipelined) request is looked at from here
        self._checks_waiting: dict[str, _Conn] = {}  # client → its connection waiting for a check, in order
        self._check_running: Optional[_Conn] = None
        self._check_next_at = 0.0  # (monotonic) no check starts before: check_cpu_share
        self._check_last: OrderedDict[str, float] = OrderedDict()  # client → when its last check ended
        self._check_work: queue.SimpleQueue[Optional[tuple[_Conn, Check]]] = queue.SimpleQueue()
        self._check_done: queue.SimpleQueue[tuple[_Conn, Check, Any, Optional[BaseException], float]] = \
            queue.SimpleQueue()
        self._checker: Optional[threading.Thread] = None
        self._throttled = Throttled()
        self._state_wanted: deque[tuple[list[ServerState], threading.Event]] = deque()  # state(), from threads
        self._handshakes = PerClientRate(limits.tls_handshakes_per_client, 2 * limits.tls_handshakes_per_client)
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)
        self._worker = threading.Thread(target=self._scrape_worker, name="http-scrape", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        return self._listener.getsockname()[:2]

    @property
    def connections(self) -> int:
        return len(self._conns)

    def state(self, timeout: float = 5.0) -> ServerState:
        """What the server holds now, made by its loop between two turns, so the view is consistent (it costs
        the loop one wakeup); before start() or after stop(), made here."""
        if not self._thread.is_alive():
            return self._describe()
        box: list[ServerState] = []
        done = threading.Event()
        self._state_wanted.append((box, done))
        self._wake()
        if not done.wait(timeout):
            raise TimeoutError("the HTTP loop did not describe its state")
        return box[0]

    def _describe(self) -> ServerState:
        def scrape(flight: Optional[_Flight]) -> Optional[ScrapeState]:
            if flight is None:
                return None
            return ScrapeState(flight.key, flight.serial, tuple(sorted(c.peer for c in flight.conns)),
                               flight.keep, flight.base, len(flight.chunks), flight.done, flight.reuse_until)

        connections = tuple(ConnectionState(c.peer, c.client, c.state, c.flight.serial if c.flight else 0,
                                            c.chunk, c.gap) for c in self._conns)
        return ServerState(connections, scrape(self._running),
                           tuple(scrape(f) for f in self._pending.values()),  # type: ignore[misc]
                           scrape(self._last), tuple(scrape(f) for f in self._finished),  # type: ignore[misc]
                           dict(self._scraping), {k: tuple(c.peer for c in v) for k, v in self._queued.items()},
                           tuple(self._checks_waiting))

    def start(self) -> None:
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._worker.start()
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._work.put(None)
        if self._worker.is_alive():
            self._worker.join(timeout=5)  # a scrape in progress finishes first (it reads files, no waits)
        if self._checker is not None:
            self._check_work.put(None)
            self._checker.join(timeout=5)
        for conn in list(self._conns):
            self._close(conn)
        self._sel.close()
        self._listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # --- the loop ---------------------------------------------------------------------------------

    def _wake(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            try:
                os.write(self._wake_w, b"\0")
            except (BlockingIOError, OSError):
                pass  # a byte is already waiting, or we are stopping

    def next_deadline(self) -> Optional[float]:
        """When the loop must wake without an event (monotonic); None: not before an event (an idle server)."""
        deadlines = [c.deadline for c in self._conns if c.deadline is not None]
        running = self._running
        if running is not None and not running.overdue:
            deadlines.append(running.started + self.limits.write_timeout)
        if self._checks_waiting and self._check_running is None:
            deadlines.append(self._check_next_at)
        if self._pending and running is None:
            deadlines.append(self._scrape_next_at)
        if self._last is not None:
            deadlines.append(self._last.reuse_until)  # then its memory goes
        deadlines.extend(c.release_at for c in self._held)
        return min(deadlines) if deadlines else None

    def _serve(self) -> None:
        name_os_thread("oomwatch-http")
        while not self._stopping:
            deadline = self.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())  # None: until an event
            for key, mask in self._sel.select(0 if self._ready or self._freed else timeout):
                if key.data is None:
                    self._guarded(self._accept)
                elif key.data == "wake":
                    self._guarded(self._on_wake)
                else:
                    self._guarded(self._on_event, key.data, mask)
            # One turn for each connection whose response is done: answer its next buffered request, if any.
            # (From here, not from where the response ended: a pipelined burst is a loop, not a recursion.)
            for _ in range(len(self._ready)):
                conn = self._ready.popleft()
                if not conn.closed and conn.state == "idle":
                    self._guarded(self._read, conn)
            # And for each client whose scrape ended: its next queued request joins one (from here too, not
            # from where the scrape ended: a queue served from a kept body is a loop, not a recursion).
            for _ in range(len(self._freed)):
                self._guarded(self._dequeue, self._freed.popleft())
            self._expire(time.monotonic())
            self._guarded(self._next_check)  # one waiting for its turn on the CPU
            self._guarded(self._start_pending)  # likewise
            while self._state_wanted:
                box, done = self._state_wanted.popleft()
                box.append(self._describe())
                done.set()

    def _guarded(self, call: Callable[..., None], *args: Any) -> None:
        try:
            call(*args)
        except Exception as exc:  # a bug here must not take the server down with it, nor fill the log
            self._throttled.log("unexpected", logging.ERROR, "http: unexpected error: %r", exc, exc_info=True)
            for arg in args:
                if isinstance(arg, _Conn):
                    self._close(arg)

    def _accept(self) -> None:
        for _ in range(64):  # then let the others have a turn
            try:
                sock, _addr = self._listener.accept()
            except _WOULD_BLOCK:
                return
            except OSError as exc:  # EMFILE and friends: stop accepting until a connection closes
                self._throttled.log("accept", logging.WARNING, "http: cannot accept: %s", exc)
                self._pause_accepting()
                return
            now = time.monotonic()
            client = client_key(_addr)
            if self._tls is not None and not self._handshakes.admit(client):
                self._throttled.log("handshakes", logging.WARNING, "http: client %s starts more than %g TLS "
                                    "handshakes a second: connection closed", client,
                                    self.limits.tls_handshakes_per_client)
                sock.close()
                continue
            if len(self._conns) >= self.limits.max_connections:
                self._evict_one()
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                try:
                    sock = self._tls_now().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    sock.close()
                    continue
            conn = _Conn(sock, self._tls is not None, now, self.limits.header_timeout, client, tuple(_addr[:2]))
            self._conns.add(conn)
            self._held_by[conn.client] = self._held_by.get(conn.client, 0) + 1
            self._interest(conn, selectors.EVENT_READ)

    def _evict_one(self) -> None:
        """Make room: the client holding the most connections gives one up, the one that has waited longest
        without a complete request, one that never had a response first (a flood's new connections go before
        a scraper's kept keep-alive one), else its oldest (ties between clients: the same order)."""
        if not self._conns:
            return
        held = self._held_by
        most = max(held.values())
        crowded = [c for c in self._conns if held[c.client] == most]
        self._close(min(crowded, key=lambda c: (not c.evictable, c.served, c.since)))

    def _pause_accepting(self) -> None:
        if self._accepting:
            self._sel.unregister(self._listener)
            self._accepting = False

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns if c.deadline is not None and c.deadline <= now]:
            self._close(conn)
        for conn in [c for c in self._held if c.release_at <= now]:
            self._held.discard(conn)
            response, conn.held = conn.held, None
            if response is not None:
                self._guarded(self._respond, conn, Response(response.status, response.content_type, response.body,
                                                            response.headers))
        last = self._last
        if last is not None and last.reuse_until <= now:
            self._last, last.keep = None, False  # a fresh scrape may start now: this body goes
        running = self._running
        if running is not None and not running.overdue and now - running.started >= self.limits.write_timeout:
            running.overdue = True  # its clients have given up on it: a failed scrape, whatever it does next
            self._scrape_failed(f"scrape still running after {self.limits.write_timeout:g} s (write_timeout)")

    def _interest(self, conn: _Conn, events: int) -> None:
        if conn.closed or events == conn.events:
            return
        if not events:
            self._sel.unregister(conn.sock)
        elif not conn.events:
            self._sel.register(conn.sock, events, conn)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        self._interest(conn, 0)
        conn.closed = True
        self._conns.discard(conn)
        self._held.discard(conn)
        left = self._held_by.pop(conn.client, 1) - 1
        if left:
            self._held_by[conn.client] = left
        self._leave_flight(conn)
        if conn.state == "queued":
            waiting = self._queued.get(conn.client)
            if waiting is not None and conn in waiting:
                waiting.remove(conn)
                if not waiting:
                    del self._queued[conn.client]
        if conn.check is not None and self._checks_waiting.get(conn.check.client) is conn:
            del self._checks_waiting[conn.check.client]
        try:
            conn.sock.close()
        except OSError:
            pass
        if not self._accepting and not self._stopping:
            self._sel.register(self._listener, selectors.EVENT_READ, None)
            self._accepting = True

    def _on_event(self, conn: _Conn, mask: int) -> None:
        if conn.state == "handshake":
            self._handshake(conn)
        elif conn.state == "writing":
            self._flush(conn)
        else:
            self._read(conn)

    def _handshake(self, conn: _Conn) -> None:
        import ssl

        try:
            conn.sock.do_handshake()  # type: ignore[attr-defined]
        except ssl.SSLWantReadError:
            return self._interest(conn, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            return self._interest(conn, selectors.EVENT_WRITE)
        except (ssl.SSLError, OSError) as exc:
            log.debug("http: TLS handshake failed: %s", exc)
            return self._close(conn)
        conn.peer_cert = conn.sock.getpeercert() or None  # type: ignore[attr-defined]
        conn.state = "head"
        self._interest(conn, selectors.EVENT_READ)
        self._read(conn)  # the request may already sit decrypted in the TLS buffer

    def _read(self, conn: _Conn) -> None:
        room = self.limits.max_header_bytes + 1 - len(conn.inbuf)
        while room > 0:
            try:
                data = conn.sock.recv(min(room, 65536))
            except self._would_block:
                if not conn.inbuf:
                    conn.burst = 0  # it sent nothing more than what was answered: not a pipelined burst
                break
            except OSError:
                return self._close(conn)
            if not data:  # the client left (a half-sent request, or one that will not wait for its answer)
                return self._close(conn)
            conn.inbuf += data
            room -= len(data)
        if room <= 0 and conn.state in ("checking", "holding", "queued", "waiting", "writing"):
            self._interest(conn, 0)  # pipelined requests wait in the buffer until this response is done
        if conn.state in ("idle", "head"):
            self._next_request(conn)

    def _next_request(self, conn: _Conn) -> None:
        if not conn.inbuf:
            return
        now = time.monotonic()
        if conn.state == "idle":
            conn.state = "head"
            conn.deadline = now + self.limits.header_timeout
        try:
            parsed = parse_head(conn.inbuf, self.limits)
        except HeadError as exc:
            conn.keep_alive = False
            return self._respond(conn, Response(exc.status, "text/plain; charset=utf-8", f"{exc}\n".encode()))
        if parsed is None:
            return
        request, size = parsed
        del conn.inbuf[:size]
        conn.gap = now - conn.idle_since if conn.served else 0.0  # a new connection earns no turn by waiting
        conn.burst += 1
        if conn.burst > self.limits.max_pipelined:
            self._throttled.log("pipelined", logging.WARNING, "http: client %s sent more than %d requests "
                                "without reading the answers: connection closed", conn.client,
                                self.limits.max_pipelined)
            return self._close(conn)
        request = Request(request.method, request.path, request.version, request.headers, conn.peer_cert,
                          conn.client)
        connection = request.headers.get("connection", "").lower()
        conn.keep_alive = request.version == "HTTP/1.1" and "close" not in connection
        conn.deadline = now + self.limits.write_timeout
        if request.method != "GET":
            conn.keep_alive = False
            return self._respond(conn, Response(405, "text/plain; charset=utf-8", b"only GET\n",
                                                (("Allow", "GET"),)))
        if request.headers.get("content-length", "0").strip() not in ("", "0") or \
                "transfer-encoding" in request.headers:
            conn.keep_alive = False
            return self._respond(conn, Response(400, "text/plain; charset=utf-8", b"no request body here\n"))
        try:
            answer = self._handler(request)
        except Exception as exc:
            self._throttled.log("handler", logging.ERROR, "http: %s %s failed: %r", request.method, request.path,
                                exc, exc_info=True)
            answer = Response(500, "text/plain; charset=utf-8", b"internal error\n")
        self._answer(conn, answer)

    def _answer(self, conn: _Conn, answer: Answer) -> None:
        if isinstance(answer, Scrape):
            self._join_flight(conn, answer)
        elif isinstance(answer, Check):
            self._queue_check(conn, answer)
        else:
            self._respond(conn, answer)

    # --- responses --------------------------------------------------------------------------------

    def _head(self, conn: _Conn, status: int, content_type: str, length: Optional[int],
              headers: tuple[tuple[str, str], ...]) -> bytes:
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}", f"Content-Type: {content_type}"]
        if length is not None:
            lines.append(f"Content-Length: {length}")
        elif conn.keep_alive:
            conn.chunked = True
            lines.append("Transfer-Encoding: chunked")
        lines.extend(f"{k}: {v}" for k, v in headers)
        if not conn.keep_alive:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _respond(self, conn: _Conn, response: Response) -> None:
        if response.hold > 0:
            conn.held, conn.release_at, conn.state = response, time.monotonic() + response.hold, "holding"
            self._held.add(conn)
            return self._interest(conn, selectors.EVENT_READ)  # to notice a client that leaves meanwhile
        head = self._head(conn, response.status, response.content_type, len(response.body), response.headers)
        conn.out.append(memoryview(head))
        if response.body:
            conn.out.append(memoryview(response.body))  # not copied: a body shared by many (/incidents) stays one
        conn.deadline = time.monotonic() + self.limits.write_timeout
        conn.state = "writing"
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        # What one turn may send to this connection: a share of SEND_PER_CLIENT by how many connections its
        # client holds, so 250 connections of one client pulling scrapes get the bandwidth of one, and a
        # turn of the loop (a /healthz waiting behind it) stays short.
        budget = send_share(self._held_by.get(conn.client, 1))
        while conn.out or self._refill(conn):
            if budget <= 0:
                return self._interest(conn, selectors.EVENT_WRITE)  # the rest at its next turn
            try:
                if conn.tls:
                    sent = conn.sock.send(conn.out[0][:min(65536, budget)])
                else:
                    views, room = [], budget
                    for view in conn.out:
                        views.append(view[:room])
                        room -= len(views[-1])
                        if room <= 0 or len(views) == 16:
                            break
                    sent = conn.sock.sendmsg(views)
            except self._would_block:
                return self._interest(conn, selectors.EVENT_WRITE)
            except OSError:
                return self._close(conn)
            budget -= sent
            while sent:
                first = conn.out[0]
                if sent >= len(first):
                    sent -= len(first)
                    conn.out.popleft()
                else:
                    conn.out[0] = first[sent:]
                    sent = 0
        flight = conn.flight
        if flight is not None and not conn.terminated:
            # Streaming and caught up with the worker: wait for its next chunk (watch for the client leaving).
            conn.state = "waiting"
            room = len(conn.inbuf) <= self.limits.max_header_bytes
            return self._interest(conn, selectors.EVENT_READ if room else 0)
        self._response_done(conn)

    def _refill(self, conn: _Conn) -> bool:
        flight = conn.flight
        if flight is None or conn.terminated or not conn.headers_sent:
            return False
        if conn.chunk - flight.base < len(flight.chunks):
            chunk = flight.chunks[conn.chunk - flight.base]
            conn.chunk += 1
            if conn.chunked:
                conn.out.extend((memoryview(b"%x\r\n" % len(chunk)), memoryview(chunk), memoryview(b"\r\n")))
            else:
                conn.out.append(memoryview(chunk))
            sent_by_all = min(c.chunk for c in flight.conns)
            if sent_by_all > flight.base and not flight.keep:  # (out queues hold what they have not sent)
                del flight.chunks[:sent_by_all - flight.base]
                flight.base = sent_by_all
            return True
        if flight.done and conn.chunk - flight.base == len(flight.chunks):
            conn.terminated = True
            if flight.error is not None:  # the status line went out: cut the body short, so the client
                self._close(conn)  # sees a failed scrape rather than a partial one
                return False
            if conn.chunked:
                conn.out.append(memoryview(b"0\r\n\r\n"))
                return True
        return False

    def _response_done(self, conn: _Conn) -> None:
        if conn.closed:
            return
        self._leave_flight(conn)
        if not conn.keep_alive:
            return self._close(conn)
        now = time.monotonic()
        conn.state, conn.deadline, conn.since = "idle", now + self.limits.idle_timeout, now
        conn.idle_since, conn.served = now, True
        conn.chunked = conn.headers_sent = conn.terminated = False
        conn.chunk = 0
        self._interest(conn, selectors.EVENT_READ)
        # A pipelined request may wait in its buffer, or decrypted in TLS's where the selector cannot see it:
        # the loop looks (_serve), so that a burst of requests is answered in turns, not by recursion.
        self._ready.append(conn)

    # --- single-flight scrapes --------------------------------------------------------------------

    def _join_flight(self, conn: _Conn, scrape: Scrape, its_turn: bool = False) -> None:
        client = conn.client
        if self._scraping.get(client, 0) >= self.limits.scrapes_per_client or \
                (client in self._queued and not its_turn):
            # Its client has its share of scrapes in progress, or requests waiting before this one: this
            # request waits its turn (_dequeue), and no other client's request waits behind it.
            conn.scrape, conn.state = scrape, "queued"
            bisect.insort(self._queued.setdefault(client, []), conn, key=self._turn)  # after equals: in order
            return self._interest(conn, selectors.EVENT_READ)  # to notice a client that leaves while it waits
        flight = self._flight_for(scrape.key, conn)
        conn.flight, conn.extra_headers, conn.state = flight, scrape.headers, "waiting"
        flight.conns.add(conn)
        flight.clients.add(client)
        self._scraping[client] = self._scraping.get(client, 0) + 1
        self._interest(conn, selectors.EVENT_READ)  # to notice a client that leaves while it waits
        if flight.done and flight is not self._running and flight not in self._finished:  # the last body
            self._finished.append(flight)
            self._drop_slowest()
        self._start_pending()
        if flight is self._running or flight.done:
            self._advance(conn)

    def _turn(self, conn: _Conn) -> float:
        """A waiting request's place among its client's: the longest idle of those idle patient_gap or more
        first; the others (0) in the order they asked."""
        return -conn.gap if conn.gap >= self.limits.patient_gap else 0.0

    def _flight_for(self, key: str, conn: _Conn) -> _Flight:
        """The running scrape while its body is whole; else the one that just ended, kept whole, if this
        connection was not served from it (the pacing window forbids a fresher one); else the next, which all
        share."""
        running = self._running
        if running is not None and running.key == key and not running.abandoned and not running.base and \
                (not running.done or conn.last_serial != running.serial):
            # (once a chunk was dropped a newcomer could not have the whole body: it waits for the next run;
            # one that ended, its end not yet seen by the loop, is as the last body: a connection takes it once)
            if running.conns:
                running.keep = True  # shared: more may come, so it is kept whole for them
            return running
        last = self._last
        if last is not None and last.key == key and conn.last_serial != last.serial and not last.base and \
                time.monotonic() < last.reuse_until:
            return last
        flight = self._pending.get(key)
        if flight is None:
            flight = self._pending[key] = _Flight(key)
            # Asked for while another runs (a flood, or a scraper beside another): kept whole, so that a
            # newcomer joins it at any point. A lone scraper's body is dropped as it is sent.
            flight.keep = running is not None and not running.done
        return flight

    def _dequeue(self, client: str) -> None:
        """The client's queued requests join scrapes, oldest first, while it has fewer than its share."""
        waiting = self._queued.get(client)
        while waiting and self._scraping.get(client, 0) < self.limits.scrapes_per_client:
            conn = waiting.pop(0)
            scrape, conn.scrape = conn.scrape, None
            if not waiting and self._queued.get(client) is waiting:
                del self._queued[client]
            if not conn.closed and conn.state == "queued" and scrape is not None:
                self._join_flight(conn, scrape, its_turn=True)

    def _start(self, flight: _Flight) -> None:
        self._running = flight
        flight.started = time.monotonic()
        flight.keep = flight.keep or len(flight.conns) > 1  # (shared from its start)
        self.scrapes += 1
        flight.serial = self.scrapes
        self._work.put(flight)

    def _drop_slowest(self) -> None:
        while len(self._finished) > self.limits.max_bodies:
            for slow in list(self._finished.popleft().conns):
                log.debug("http: dropping a client too slow to read its scrape")
                self._close(slow)

    def _scrape_failed(self, error: str, exc: Optional[BaseException] = None) -> None:
        self.failed_scrapes += 1
        self.last_scrape_error = error
        self.last_scrape_failed = True
        self._throttled.log("scrape", logging.ERROR, "http: scrape failed: %s", error, exc_info=exc)

    def _scrape_ended(self, flight: _Flight) -> None:
        if flight.error is not None:
            if not flight.overdue:  # (counted already)
                self._scrape_failed(f"{type(flight.error).__name__}: {flight.error}", flight.error)
        elif not flight.abandoned and not flight.overdue:
            self.last_scrape_failed = False

    def _leave_flight(self, conn: _Conn) -> None:
        flight = conn.flight
        if flight is None:
            return
        conn.flight = None
        flight.conns.discard(conn)
        left = self._scraping.pop(conn.client, 1) - 1
        if left:
            self._scraping[conn.client] = left
        if conn.client in self._queued:
            self._freed.append(conn.client)  # its next request's turn (the loop joins it: _dequeue)
        if flight.conns:
            return
        if flight is self._running and not flight.done:
            flight.abandoned = True
        elif self._pending.get(flight.key) is flight:
            del self._pending[flight.key]
        elif flight in self._finished:
            self._finished.remove(flight)

    def _advance(self, conn: _Conn) -> None:
        """Send what the flight has for this connection: the status line once its first chunk (or its end)
        is there, then the chunks as they come."""
        flight = conn.flight
        if flight is None or conn.closed:
            return
        if not conn.headers_sent:
            if not (flight.done or flight.chunks):
                return
            if flight.error is not None or flight.content_type is None:
                self._leave_flight(conn)
                return self._respond(conn, Response(500, "text/plain; charset=utf-8", b"scrape failed\n"))
            length = sum(map(len, flight.chunks)) if flight.done else None
            conn.out.append(memoryview(self._head(conn, 200, flight.content_type, length, conn.extra_headers)))
            conn.last_serial = flight.serial
            conn.headers_sent = True  # HTTP/1.0 and no length yet: the body ends when the connection closes
        conn.state = "writing"
        self._flush(conn)

    def _on_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        # Cleared after draining (a byte written in between is not lost) and before reading the flight's
        # state (what the worker adds from here on comes with a new byte).
        self._wake_pending = False
        self._checks_finished()
        flight = self._running
        if flight is None:
            return
        # Whether it was done before its clients are advanced: if the worker ends it while they are, they may
        # have gone back to waiting for more, and the byte it writes for the end will bring them here again.
        done = flight.done
        for conn in list(flight.conns):
            if conn.state == "waiting":
                self._advance(conn)
        if done:
            now = time.monotonic()
            self._running = None
            self._scrape_next_at = now + flight.cpu * (1 / self.limits.scrape_cpu_share - 1)
            for client in flight.clients:
                self._served_at[client] = now
                self._served_at.move_to_end(client)
            while len(self._served_at) > 4096:
                self._served_at.popitem(last=False)
            self._scrape_ended(flight)
            self._keep_last(flight, now)
            if flight.conns and flight not in self._finished:
                self._finished.append(flight)
                self._drop_slowest()
            self._start_pending()

    def _keep_last(self, flight: _Flight, now: float) -> None:
        """A kept body that ended well stays for newcomers until the next scrape may start; any other goes."""
        previous = self._last
        if flight.keep and flight.error is None and not flight.abandoned and not flight.overdue and \
                not flight.base and now < self._scrape_next_at:
            flight.reuse_until = self._scrape_next_at
            self._last = flight
        else:
            flight.keep = False
            self._last = None
        if previous is not None and previous is not self._last:
            previous.keep = False  # its readers drop what they have all sent again

    def _start_pending(self) -> None:
        """Start the scrape that waited longest, when none runs and scrape_cpu_share allows, or at once when a
        client of it was served no scrape within paced_within."""
        if self._running is not None or not self._pending:
            return
        now = time.monotonic()
        while self._pending:
            key = next(iter(self._pending))
            nxt = self._pending[key]
            if nxt.conns and now < self._scrape_next_at and all(
                    now - self._served_at.get(client, float("-inf")) < self.limits.paced_within
                    for client in nxt.clients):
                return  # (the loop's select wakes at _scrape_next_at)
            del self._pending[key]
            if nxt.conns:
                return self._start(nxt)

    def _scrape_worker(self) -> None:
        name_os_thread("oomwatch-scrape")
        while True:
            flight = self._work.get()  # blocks without a timeout: no wakeups while idle
            if flight is None:
                return
            cpu = time.thread_time()
            try:
                content_type, body = self._producer(flight.key)
                flight.content_type = content_type
                try:
                    for chunk in body:
                        if flight.abandoned:
                            break
                        if chunk:
                            flight.chunks.append(bytes(chunk))
                            self._wake()
                finally:
                    close = getattr(body, "close", None)
                    if close is not None:
                        close()  # a body left unread is closed now: what it holds goes at once
            except Exception as exc:  # reported to the waiting clients as a 500; counted and logged by the loop
                flight.error = exc
            flight.cpu = time.thread_time() - cpu
            flight.done = True
            self._wake()

    # --- checks (bcrypt) on their own thread --------------------------------------------------------

    def _queue_check(self, conn: _Conn, check: Check) -> None:
        if check.client in self._checks_waiting or len(self._checks_waiting) >= self.limits.max_checks_waiting:
            return self._respond(conn, check.busy)
        conn.check, conn.state = check, "checking"
        self._checks_waiting[check.client] = conn
        self._interest(conn, selectors.EVENT_READ)  # to notice a client that leaves while it waits
        self._next_check()

    def _next_check(self) -> None:
        """Hand the check thread the check of the waiting client whose last check is oldest (never: first),
        one at a time, when check_cpu_share allows."""
        if self._check_running is not None or not self._checks_waiting:
            return
        client = min(self._checks_waiting, key=lambda c: self._check_last.get(c, -1.0))
        if client in self._check_last and time.monotonic() < self._check_next_at:
            return  # the loop's select wakes at _check_next_at
        # (a client's first check is not paced: a scraper's first after a restart is not kept waiting by a
        # guesser's; a client is an address, which a peer cannot make up without end)
        conn = self._checks_waiting.pop(client)
        self._check_running = conn
        if self._checker is None:  # started at the first check: no thread without basic auth
            self._checker = threading.Thread(target=self._check_worker, name="http-check", daemon=True)
            self._checker.start()
        self._check_work.put((conn, conn.check))  # type: ignore[arg-type]

    def _check_worker(self) -> None:
        name_os_thread("oomwatch-check")
        while True:
            item = self._check_work.get()
            if item is None:
                return
            conn, check = item
            cpu = time.thread_time()
            try:
                result, error = check.work(), None
            except Exception as exc:
                result, error = None, exc
            self._check_done.put((conn, check, result, error, time.thread_time() - cpu))
            self._wake()

    def _checks_finished(self) -> None:
        while True:
            try:
                conn, check, result, error, cpu = self._check_done.get_nowait()
            except queue.Empty:
                break
            self._check_running = None
            now = time.monotonic()
            self._check_next_at = now + cpu * (1 / self.limits.check_cpu_share - 1)
            self._check_last[check.client] = now
            self._check_last.move_to_end(check.client)
            while len(self._check_last) > 4096:
                self._check_last.popitem(last=False)
            if conn.closed or conn.check is not check:
                continue  # the client left while it was checked
            conn.check = None
            answer: Answer
            try:
                if error is not None:
                    raise error
                answer = check.then(result)
            except Exception as exc:
                self._throttled.log("check", logging.ERROR, "http: check failed: %r", exc, exc_info=exc)
                answer = Response(500, "text/plain; charset=utf-8", b"internal error\n")
            self._answer(conn, answer)
        self._next_check()
