"""A small HTTP/1.1 server for a node agent: one thread on one selector, one worker thread for scrapes, and a
bound on everything a client controls.

Why not `http.server`: its ThreadingHTTPServer runs a thread per connection with no timeouts and no cap (2,000
idle connections were 2,003 threads), and `serve_forever` wakes every 0.5 s to poll for shutdown. Why not a
server from PyPI (measured, benchmarks/RESULTS.md): waitress 3.0 runs 5 threads, wakes once a second and, at
its connection limit, stops accepting, so idle connections lock a scraper out; cheroot 11 runs 12 threads and
wakes about twice a second. What Prometheus needs is GET, keep-alive and streaming: this is 2 threads, never
woken while idle.

What a client can make this server do, at most:
- hold `max_connections` sockets, each with at most `max_header_bytes` of unparsed request. At the cap a new
  connection replaces the one that has waited longest without a complete request (a flood of idle or slow
  clients cannot lock a scraper out); when every connection is busy with a response, it is refused at once.
- take `header_timeout` seconds to send a request head (from accept, or from the first byte of a keep-alive
  request), `idle_timeout` between keep-alive requests and `write_timeout` to receive a response.
- start at most one scrape at a time. Requests that want the same scrape (same key) while it runs share it
  (single flight); a request whose client has gone before its scrape starts costs nothing. At most
  `max_bodies` finished scrape bodies stay in memory for slow readers; the slowest are dropped beyond.
- no request bodies: a request with one is answered 400 and the connection closed.

When nothing happens the loop blocks in the selector with no timeout (no connection holds a deadline): an
idle agent is not woken by this server.
"""

from __future__ import annotations

import logging
import os
import queue
import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Union

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


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query string
    version: str  # "HTTP/1.0" or "HTTP/1.1"
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    peer_cert: Optional[dict]  # the client certificate the TLS handshake verified, else None


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Scrape:
    """A route's answer whose body the scrape worker computes: requests with the same key share one run."""

    key: str
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], Union[Response, Scrape]]
# Scrape key (the Accept header) → (content type, body chunks); called and iterated on the worker thread.
Producer = Callable[[str], tuple[str, Iterable[bytes]]]

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}
_REFUSED = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_WOULD_BLOCK = (BlockingIOError, InterruptedError)


def name_os_thread(name: str) -> None:
    """Name the calling thread in /proc/PID/task/TID/comm (top -H, benchmarks); Python before 3.14 does not."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(name[:15])
    except OSError:
        pass  # no /proc: a nicety, not a need


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

    __slots__ = ("key", "content_type", "chunks", "base", "done", "error", "conns", "abandoned")

    def __init__(self, key: str) -> None:
        self.key = key
        self.content_type: Optional[str] = None
        self.chunks: list[bytes] = []  # the worker appends; the loop deletes from the front
        self.base = 0  # how many chunks were dropped from the front (a connection's chunk index is absolute)
        self.done = False
        self.error: Optional[BaseException] = None
        self.conns: set[_Conn] = set()
        self.abandoned = False  # every client left: the worker stops producing


class _Conn:
    __slots__ = ("sock", "tls", "state", "inbuf", "out", "deadline", "since", "events", "keep_alive",
                 "flight", "extra_headers", "chunk", "chunked", "headers_sent", "terminated", "peer_cert",
                 "closed")

    def __init__(self, sock: socket.socket, tls: bool, now: float, header_timeout: float) -> None:
        self.sock = sock
        self.tls = tls
        self.state = "handshake" if tls else "head"  # handshake | idle | head | waiting | writing
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

    @property
    def evictable(self) -> bool:
        return self.state in ("handshake", "idle", "head")


class HttpServer:
    """Serves `handler` on `address` from one thread; `producer` runs scrapes on a second one."""

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
        self._work: queue.SimpleQueue[Optional[_Flight]] = queue.SimpleQueue()
        self.scrapes = 0  # scrapes started, for tests and benchmarks
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)
        self._worker = threading.Thread(target=self._scrape_worker, name="http-scrape", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        return self._listener.getsockname()[:2]

    @property
    def connections(self) -> int:
        return len(self._conns)

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

    def _serve(self) -> None:
        name_os_thread("oomwatch-http")
        while not self._stopping:
            now = time.monotonic()
            deadlines = [c.deadline for c in self._conns if c.deadline is not None]
            timeout = max(0.0, min(deadlines) - now) if deadlines else None  # None: block until an event
            for key, mask in self._sel.select(timeout):
                try:
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        self._on_wake()
                    else:
                        self._on_event(key.data, mask)
                except Exception:  # a bug here must not take the server down with it
                    log.exception("http: unexpected error")
                    if isinstance(key.data, _Conn):
                        self._close(key.data)
            self._expire(time.monotonic())

    def _accept(self) -> None:
        for _ in range(64):  # then let the others have a turn
            try:
                sock, _addr = self._listener.accept()
            except _WOULD_BLOCK:
                return
            except OSError as exc:  # EMFILE and friends: stop accepting until a connection closes
                log.warning("http: cannot accept: %s", exc)
                self._pause_accepting()
                return
            now = time.monotonic()
            if len(self._conns) >= self.limits.max_connections and not self._evict_one():
                self._refuse(sock)
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                try:
                    sock = self._tls_now().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    sock.close()
                    continue
            conn = _Conn(sock, self._tls is not None, now, self.limits.header_timeout)
            self._conns.add(conn)
            self._interest(conn, selectors.EVENT_READ)

    def _refuse(self, sock: socket.socket) -> None:
        if self._tls is None:
            try:
                sock.setblocking(False)
                sock.send(_REFUSED)
            except OSError:
                pass
        sock.close()

    def _evict_one(self) -> bool:
        candidates = [c for c in self._conns if c.evictable]
        if not candidates:
            return False
        self._close(min(candidates, key=lambda c: c.since))
        return True

    def _pause_accepting(self) -> None:
        if self._accepting:
            self._sel.unregister(self._listener)
            self._accepting = False

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns if c.deadline is not None and c.deadline <= now]:
            self._close(conn)

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
        self._leave_flight(conn)
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
                break
            except OSError:
                return self._close(conn)
            if not data:  # the client left (a half-sent request, or one that will not wait for its answer)
                return self._close(conn)
            conn.inbuf += data
            room -= len(data)
        if room <= 0 and conn.state in ("waiting", "writing"):
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
        request = Request(request.method, request.path, request.version, request.headers, conn.peer_cert)
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
        except Exception:
            log.exception("http: %s %s failed", request.method, request.path)
            answer = Response(500, "text/plain; charset=utf-8", b"internal error\n")
        if isinstance(answer, Scrape):
            self._join_flight(conn, answer)
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
        head = self._head(conn, response.status, response.content_type, len(response.body), response.headers)
        conn.out.append(memoryview(head + response.body))
        conn.deadline = time.monotonic() + self.limits.write_timeout
        conn.state = "writing"
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        while conn.out or self._refill(conn):
            try:
                if conn.tls:
                    sent = conn.sock.send(conn.out[0][:65536])
                else:
                    sent = conn.sock.sendmsg(list(conn.out)[:16])
            except self._would_block:
                return self._interest(conn, selectors.EVENT_WRITE)
            except OSError:
                return self._close(conn)
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
            if sent_by_all > flight.base:  # the connections' out queues still hold what they have not sent
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
        conn.chunked = conn.headers_sent = conn.terminated = False
        conn.chunk = 0
        self._interest(conn, selectors.EVENT_READ)
        if conn.inbuf:
            self._next_request(conn)  # a pipelined request
        elif conn.tls:
            self._read(conn)  # TLS may hold decrypted bytes the selector cannot see

    # --- single-flight scrapes --------------------------------------------------------------------

    def _join_flight(self, conn: _Conn, scrape: Scrape) -> None:
        running = self._running
        if running is not None and running.key == scrape.key and not running.abandoned and not running.base:
            # (once a chunk was dropped a newcomer could not have the whole body: it waits for the next run)
            flight = running
        else:
            flight = self._pending.get(scrape.key)
            if flight is None:
                flight = _Flight(scrape.key)
                if running is None:
                    self._start(flight)
                else:
                    self._pending[scrape.key] = flight
        conn.flight, conn.extra_headers, conn.state = flight, scrape.headers, "waiting"
        flight.conns.add(conn)
        self._interest(conn, selectors.EVENT_READ)  # to notice a client that leaves while it waits
        if flight is self._running:
            self._advance(conn)

    def _start(self, flight: _Flight) -> None:
        self._running = flight
        self.scrapes += 1
        self._work.put(flight)

    def _leave_flight(self, conn: _Conn) -> None:
        flight = conn.flight
        if flight is None:
            return
        conn.flight = None
        flight.conns.discard(conn)
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
                conn.flight = None
                flight.conns.discard(conn)
                return self._respond(conn, Response(500, "text/plain; charset=utf-8", b"scrape failed\n"))
            length = sum(map(len, flight.chunks)) if flight.done else None
            conn.out.append(memoryview(self._head(conn, 200, flight.content_type, length, conn.extra_headers)))
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
        flight = self._running
        if flight is None:
            return
        for conn in list(flight.conns):
            if conn.state == "waiting":
                self._advance(conn)
        if flight.done:
            self._running = None
            if flight.conns:
                self._finished.append(flight)
                while len(self._finished) > self.limits.max_bodies:
                    for slow in list(self._finished.popleft().conns):
                        log.debug("http: dropping a client too slow to read its scrape")
                        self._close(slow)
            while self._pending:
                key = next(iter(self._pending))
                nxt = self._pending.pop(key)
                if nxt.conns:
                    self._start(nxt)
                    break

    def _scrape_worker(self) -> None:
        name_os_thread("oomwatch-scrape")
        while True:
            flight = self._work.get()  # blocks without a timeout: no wakeups while idle
            if flight is None:
                return
            try:
                content_type, body = self._producer(flight.key)
                flight.content_type = content_type
                for chunk in body:
                    if flight.abandoned:
                        break
                    if chunk:
                        flight.chunks.append(bytes(chunk))
                        self._wake()
            except Exception as exc:  # reported to the waiting clients as a 500, and logged
                log.exception("http: scrape failed")
                flight.error = exc
            flight.done = True
            self._wake()
