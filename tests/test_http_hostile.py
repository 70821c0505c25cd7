"""The agent's HTTP server against the clients of issues 11 and 19: slow headers, huge headers, half-sent
requests, thousands of idle connections, clients that never read, unique Accept headers, pipelined bursts,
password guessing, slow bcrypt checks, failing scrapes. Small limits keep each test under a few seconds; the
same attacks against the real agent, with RSS and latency figures, are in benchmarks/http_attacks.py."""

from __future__ import annotations

import base64
import http.client
import logging
import resource
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from oomwatch.sinks.http import HttpSink, registry_scrape_key
from oomwatch.sinks.httpserver import (Check, HeadError, HttpServer, Limits, Response, Throttled, client_key,
                                       parse_head, send_share)
from oomwatch.sinks.webconfig import WebSettings
from tests.conftest import wait_for

LIMITS = Limits(max_connections=64, header_timeout=0.5, idle_timeout=0.5, write_timeout=2.0)
BODY = b"# TYPE x gauge\nx 1.0\n"


class Metrics:
    """A MetricsBody that counts its scrapes and can be made slow, blocked or failing."""

    def __init__(self, seconds: float = 0.0, body: bytes = BODY, chunks: int = 1) -> None:
        self.seconds, self.body, self.chunks = seconds, body, chunks
        self.calls = 0
        self.chunks_made = 0
        self.release = threading.Event()
        self.release.set()
        self.fail = False
        self.closed = False  # the body was closed before its end (a scrape stopped)

    def __call__(self, accept: str):
        self.calls += 1

        def chunks():
            self.release.wait()
            time.sleep(self.seconds)
            if self.fail:
                raise RuntimeError("scrape broke")
            try:
                for _ in range(self.chunks):
                    self.chunks_made += 1
                    yield self.body
                    time.sleep(self.seconds / self.chunks)
            except GeneratorExit:
                self.closed = True
                raise

        return "text/plain; version=0.0.4; charset=utf-8", chunks()


class Store:
    def snapshot(self):
        class Snapshot:
            incidents = ({"kind": "group"},)

        return Snapshot()


@contextmanager
def serving(metrics: Metrics, limits: Limits = LIMITS, **kwargs) -> Iterator[HttpSink]:
    sink = HttpSink("127.0.0.1:0", metrics, Store(), lambda: (True, {"kmsg": "ok"}), limits=limits, **kwargs)
    sink.start()
    try:
        yield sink
    finally:
        sink.stop()


def get(sink: HttpSink, path: str = "/metrics", timeout: float = 5.0,
        source: str = "127.0.0.1") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*sink.address, timeout=timeout, source_address=(source, 0))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# Another client on the loopback (Linux routes 127.0.0.0/8 there): an attacker other than the test's scraper.
OTHER_CLIENT = "127.0.0.2"


def connect(sink: HttpSink, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(sink.address, timeout=5, source_address=(source, 0))


def closed_by_server(sock: socket.socket, timeout: float = 3.0) -> bytes:
    """Everything the server sent until it closed the connection (fails the test if it never does)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def voluntary_switches(native_id: int) -> int:
    for line in Path(f"/proc/self/task/{native_id}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


def test_slow_header_clients_are_cut_off_while_a_scrape_is_served() -> None:
    metrics = Metrics()
    with serving(metrics) as sink:
        slow = [connect(sink) for _ in range(40)]
        for sock in slow:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        for _ in range(3):  # a header line every 0.1 s: never finishes within header_timeout
            time.sleep(0.1)
            for sock in slow:
                sock.sendall(b"X-Slow: 1\r\n")
        assert get(sink) == (200, BODY)
        for sock in slow:
            assert closed_by_server(sock) == b""
            sock.close()
        assert wait_for(lambda: sink.server.connections == 0, timeout=2)
        assert metrics.calls == 1  # only the normal scrape's


def test_huge_header_lines_without_the_blank_line_get_431_and_cost_no_scrape() -> None:
    metrics = Metrics()
    with serving(metrics) as sink:
        socks = [connect(sink) for _ in range(20)]
        line = b"X-Big: " + b"a" * 65_000 + b"\r\n"

        def attack(sock: socket.socket) -> None:
            try:
                sock.sendall(b"GET /metrics HTTP/1.1\r\n" + line * 99)
            except OSError:
                pass  # the server stopped reading and closed: what we want

        threads = [threading.Thread(target=attack, args=(s,)) for s in socks]
        for t in threads:
            t.start()
        for sock in socks:
            assert closed_by_server(sock).startswith(b"HTTP/1.1 431 ")
        for t in threads:
            t.join(timeout=5)
        assert get(sink) == (200, BODY)
        assert metrics.calls == 1


def test_many_headers_are_refused() -> None:
    with serving(Metrics()) as sink:
        sock = connect(sink)
        sock.sendall(b"GET / HTTP/1.1\r\n" + b"X-A: 1\r\n" * 100 + b"\r\n")
        assert closed_by_server(sock).startswith(b"HTTP/1.1 431 ")


def test_half_sent_and_abandoned_requests_do_not_each_cost_a_scrape() -> None:
    metrics = Metrics(seconds=0.2)
    with serving(metrics) as sink:
        for _ in range(300):  # request line and headers, never the blank line
            sock = connect(sink)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            sock.close()
        half_sent_calls = metrics.calls
        started = time.monotonic()
        for _ in range(200):  # complete requests whose clients leave at once
            sock = connect(sink)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.close()
        elapsed = time.monotonic() - started
        assert wait_for(lambda: sink.server.connections == 0, timeout=3)
        assert half_sent_calls == 0
        # At most one scrape at a time (each takes 0.2 s here), never one per request.
        assert metrics.calls <= elapsed / 0.2 + 2, (metrics.calls, elapsed)
        assert get(sink) == (200, BODY)


def test_two_thousand_idle_connections_keep_threads_bounded_and_are_closed_after_the_timeout() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4500:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4500), hard))
    limits = Limits(max_connections=256, header_timeout=1.0, idle_timeout=1.0)
    threads_before = threading.active_count()
    with serving(Metrics(), limits) as sink:
        assert threading.active_count() == threads_before + 2  # the loop and the scrape worker
        idle = [connect(sink) for _ in range(2000)]
        assert threading.active_count() == threads_before + 2
        assert sink.server.connections <= 256
        assert get(sink) == (200, BODY)  # replaces the longest-waiting idle connection
        assert wait_for(lambda: sink.server.connections == 0, timeout=3)
        for sock in idle[-50:]:
            assert closed_by_server(sock) == b""
        for sock in idle:
            sock.close()


def test_at_the_cap_the_client_holding_the_most_connections_gives_one_up() -> None:
    """Connections busy with a scrape (here: one that blocks) from one client fill the cap; another client is
    still served, in place of one of the crowding client's connections."""
    metrics = Metrics()
    metrics.release.clear()  # the scrape blocks: the crowding client's connections are busy, not idle
    with serving(metrics, Limits(max_connections=4, header_timeout=2, write_timeout=5)) as sink:
        busy = [connect(sink, OTHER_CLIENT) for _ in range(4)]
        for sock in busy:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert wait_for(lambda: metrics.calls == 1)
        assert wait_for(lambda: sink.server.connections == 4)
        scraper = connect(sink)
        scraper.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert scraper.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert closed_by_server(busy[0], timeout=1) == b""  # its oldest connection made room
        metrics.release.set()
        for sock in busy[1:]:
            sock.settimeout(5)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        for sock in busy + [scraper]:
            sock.close()
        # Of the three left, two (scrapes_per_client) shared the scrape; the third waited its turn: it took
        # that body if it came within the pacing window (kept whole: it was shared), else the next scrape's.
        assert metrics.calls <= 2


def test_a_flood_of_idle_connections_from_one_client_leaves_a_scrapers_keep_alive_alone() -> None:
    with serving(Metrics(), Limits(max_connections=8, header_timeout=5, idle_timeout=30)) as sink:
        scraper = http.client.HTTPConnection(*sink.address, timeout=5)
        scraper.request("GET", "/metrics")
        assert scraper.getresponse().read() == BODY  # now idle, the longest-waiting connection of all
        flood = [connect(sink, OTHER_CLIENT) for _ in range(40)]
        assert wait_for(lambda: sink.server.connections == 8)
        scraper.request("GET", "/metrics")  # on the same connection: it was not the one replaced
        assert scraper.getresponse().read() == BODY
        scraper.close()
        for sock in flood:
            sock.close()


def test_concurrent_scrapes_share_one() -> None:
    """20 clients (addresses) at once share one scrape. (Many connections of one address are served
    `scrapes_per_client` at a time: tests/test_http_fairness.py.)"""
    metrics = Metrics(seconds=0.3)
    with serving(metrics) as sink:
        results: list[tuple[int, bytes]] = []
        threads = [threading.Thread(target=lambda n=n: results.append(get(sink, source=f"127.0.0.{10 + n}")))
                   for n in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert results == [(200, BODY)] * 20
        assert metrics.calls <= 2  # a request arriving after the first scrape ended starts a second


def test_keep_alive_serves_many_requests_on_one_connection() -> None:
    metrics = Metrics(body=b"x 1\n" * 1000, chunks=3)
    with serving(metrics, Limits(idle_timeout=30)) as sink:
        conn = http.client.HTTPConnection(*sink.address, timeout=5)
        for path in ("/metrics", "/healthz", "/incidents", "/metrics", "/"):
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
            assert response.status == 200
            assert not response.will_close
        assert body == b"oomwatch: /metrics /healthz /incidents\n"
        assert sink.server.connections == 1
        conn.close()


def test_streamed_body_is_chunked_and_complete() -> None:
    metrics = Metrics(seconds=0.2, body=b"y 2\n" * 5000, chunks=4)
    with serving(metrics) as sink:
        conn = http.client.HTTPConnection(*sink.address, timeout=5)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.getheader("Transfer-Encoding") == "chunked"
        assert response.read() == b"y 2\n" * 20000


def test_pipelined_requests_are_answered_in_order() -> None:
    with serving(Metrics()) as sink:
        sock = connect(sink)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n"
                     b"Connection: close\r\n\r\n")
        data = closed_by_server(sock)
        assert data.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"{\"kmsg\": \"ok\"}\nHTTP/1.1 404 Not Found\r\n" in data


def test_request_bodies_and_other_methods_are_refused() -> None:
    with serving(Metrics()) as sink:
        sock = connect(sink)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
        assert closed_by_server(sock).startswith(b"HTTP/1.1 400 ")
        sock = connect(sink)
        sock.sendall(b"POST /metrics HTTP/1.1\r\n\r\n")
        assert closed_by_server(sock).startswith(b"HTTP/1.1 405 ")
        sock = connect(sink)
        sock.sendall(b"GET / HTTP/2.0\r\n\r\n")
        assert closed_by_server(sock).startswith(b"HTTP/1.1 505 ")


def test_a_failing_scrape_answers_500_and_the_next_one_works() -> None:
    metrics = Metrics()
    metrics.fail = True
    with serving(metrics) as sink:
        assert get(sink)[0] == 500
        metrics.fail = False
        assert get(sink) == (200, BODY)


def test_a_client_that_never_reads_is_dropped_after_the_write_timeout() -> None:
    metrics = Metrics(body=b"z" * (1 << 20), chunks=16)
    with serving(metrics, Limits(write_timeout=0.5)) as sink:
        sock = socket.create_connection(sink.address)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert wait_for(lambda: sink.server.connections == 1)
        assert wait_for(lambda: sink.server.connections == 0, timeout=3)
        assert get(sink)[0] == 200
        sock.close()


def test_slow_readers_hold_at_most_max_bodies_scrapes() -> None:
    metrics = Metrics(body=b"z" * (1 << 20), chunks=8)
    with serving(metrics, Limits(write_timeout=30, max_bodies=2)) as sink:
        readers = []
        for n in range(1, 5):  # each, a client of its own, asks after the previous scrape ended; never reads
            sock = socket.create_connection(sink.address, source_address=(f"127.0.0.{10 + n}", 0))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            readers.append(sock)
            assert wait_for(lambda: metrics.calls == n and sink.server.state().running is None)  # noqa: B023
        assert wait_for(lambda: sink.server.connections == 2)
        assert len(sink.server.state().finished) == 2
        for sock in readers:
            sock.close()


def test_a_client_that_leaves_stops_its_scrape() -> None:
    metrics = Metrics(seconds=1.0, chunks=10)
    with serving(metrics) as sink:
        sock = connect(sink)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert wait_for(lambda: metrics.chunks_made >= 1, timeout=3)
        sock.close()
        assert wait_for(lambda: metrics.closed, timeout=5)  # the server closed the body it no longer sends
        assert metrics.chunks_made < 10


def test_an_idle_server_is_never_woken() -> None:
    """No connection: the loop blocks in epoll_wait without a timeout. An idle keep-alive connection holds a
    deadline (idle_timeout), and nothing else wakes the loop before it."""
    with serving(Metrics(), Limits(idle_timeout=60)) as sink:
        assert wait_for(lambda: {t.name for t in threading.enumerate() if t.name.startswith("http")}
                        == {"http", "http-scrape"})
        threads = {t.name: t.native_id for t in threading.enumerate() if t.name.startswith("http")}

        def comm() -> dict[str, str]:
            return {name: Path(f"/proc/self/task/{tid}/comm").read_text().strip() for name, tid in threads.items()}

        # named for top -H (each thread names itself as it starts)
        assert wait_for(lambda: comm() == {"http": "oomwatch-http", "http-scrape": "oomwatch-scrape"}), comm()
        server = sink.server
        assert server.next_deadline() is None  # idle: epoll_wait without a timeout
        conn = http.client.HTTPConnection(*sink.address, timeout=5)
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        # An idle keep-alive connection: its idle deadline, nothing sooner (measured over time in
        # benchmarks/run.py idle and benchmarks/http_attacks.py, not here).
        assert wait_for(lambda: server.next_deadline() is not None)
        assert server.next_deadline() - time.monotonic() > 50
        conn.close()


@pytest.mark.parametrize("head, status", [
    (b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 20000, 431),
    (b"GET /\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\n folded\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nBad Name: 1\r\n\r\n", 400),
    (b"G\x00T / HTTP/1.1\r\n\r\n", 400),
    (b"GET / FTP/1.0\r\n\r\n", 400),
])
def test_parse_head_refuses(head: bytes, status: int) -> None:
    with pytest.raises(HeadError) as raised:
        parse_head(head, Limits())
    assert raised.value.status == status


def test_parse_head_reads_a_prometheus_request() -> None:
    head = (b"GET /metrics?x=1 HTTP/1.1\r\nHost: node:9717\r\nUser-Agent: Prometheus/2.53.0\r\n"
            b"Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1\r\nAccept-Encoding: gzip\r\n"
            b"X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\nGET")
    request, size = parse_head(head, Limits())
    assert (request.method, request.path, request.version) == ("GET", "/metrics", "HTTP/1.1")
    assert request.headers["accept"] == "text/plain;version=0.0.4;q=1,*/*;q=0.1"
    assert head[size:] == b"GET"
    assert parse_head(head[:40], Limits()) is None


def test_a_streamed_body_is_dropped_as_it_is_sent() -> None:
    """A scrape streamed to a reading client does not pile up: chunks every joined client has taken are
    released while the worker is still producing."""
    held: list[int] = []

    def metrics(accept: str):
        def chunks():
            for _ in range(40):
                running = sink.server.state().running
                held.append(running.chunks_held if running is not None else 0)
                yield b"m 1\n" * 16384  # 64 KiB
                time.sleep(0.01)

        return "text/plain; version=0.0.4; charset=utf-8", chunks()

    with serving(metrics) as sink:  # the producer looks at sink.server
        status, body = get(sink)
    assert status == 200 and body == b"m 1\n" * 16384 * 40
    assert len(held) == 40 and max(held) <= 4, held


def test_parse_head_at_every_split_point_and_on_garbage() -> None:
    import random

    head = b"GET /metrics HTTP/1.1\r\nHost: n:9717\r\nAccept: */*\r\n\r\n"
    for cut in range(len(head)):
        assert parse_head(head[:cut], Limits()) is None  # incomplete, never an error
    assert parse_head(head, Limits())[1] == len(head)
    rng = random.Random(11)
    for _ in range(2000):
        garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) + b"\r\n\r\n"
        try:
            parse_head(garbage, Limits())
        except HeadError:
            pass  # the only failure a client can cause


def test_a_tls_client_that_never_finishes_its_handshake_is_cut_off() -> None:
    """The header timeout covers the TLS handshake (no certificate is needed: nothing is sent)."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # never reached: the client says nothing
    with serving(Metrics(), LIMITS, tls=context) as sink:
        sock = connect(sink)
        started = time.monotonic()
        assert closed_by_server(sock) == b""
        assert LIMITS.header_timeout - 0.1 < time.monotonic() - started < 3
        assert wait_for(lambda: sink.server.connections == 0)


# --- issue 19, item 8 -------------------------------------------------------------------------------------


def test_requests_with_different_accept_headers_share_one_scrape() -> None:
    """The agent serves one format: 30 clients with 30 different Accept headers were 30 scrapes in a row."""
    metrics = Metrics()
    metrics.release.clear()
    with serving(metrics, Limits(write_timeout=10)) as sink:
        socks = [connect(sink, f"127.0.0.{10 + n}") for n in range(30)]  # 30 clients (addresses)
        for n, sock in enumerate(socks):
            sock.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain;q=0.{n}\r\n\r\n".encode())
        assert wait_for(lambda: metrics.calls == 1)
        assert wait_for(lambda: sum(c.state == "waiting" for c in sink.server.state().connections) == 30)
        metrics.release.set()
        for sock in socks:
            sock.settimeout(5)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            sock.close()
        assert metrics.calls == 1


def test_a_registry_scrape_is_keyed_by_format_not_by_header() -> None:
    prometheus = ("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;"
                  "q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
    assert registry_scrape_key(prometheus) == registry_scrape_key("application/openmetrics-text; version=9")
    assert registry_scrape_key(prometheus) != ""
    assert {registry_scrape_key(a) for a in ("", "text/plain", "text/plain;version=0.0.4;q=0.1", "*/*")} == {""}


def test_a_pipelined_burst_is_answered_in_a_loop_up_to_the_cap(caplog: pytest.LogCaptureFixture) -> None:
    """1,000 pipelined requests: a RecursionError after 247 and a 2,271-line traceback per connection before;
    now the first `max_pipelined` are answered, the connection is closed, and one line is logged."""
    caplog.set_level(logging.INFO, logger="oomwatch.sinks.httpserver")
    metrics = Metrics()
    with serving(metrics) as sink:
        sock = connect(sink)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 300)  # 10 KB: the server reads it all
        assert closed_by_server(sock).count(b"HTTP/1.1 200 OK\r\n") == LIMITS.max_pipelined
        assert metrics.calls <= LIMITS.max_pipelined
        sock = connect(sink)
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        sender = threading.Thread(target=lambda: _send_ignoring_close(sock, request * 1000))  # 37 KB
        sender.start()
        # Closed with part of the burst unread: the kernel answers with a reset, which may overtake answers.
        assert closed_by_server(sock).count(b"HTTP/1.1 200 OK\r\n") <= LIMITS.max_pipelined
        sender.join(timeout=5)
        assert get(sink, "/healthz")[0] == 200
    lines = [r for r in caplog.records if r.name == "oomwatch.sinks.httpserver"]
    assert len(lines) == 1 and "without reading the answers" in lines[0].getMessage()
    assert lines[0].exc_info is None


def _send_ignoring_close(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass  # the server closed it before taking it all: what we want


def test_a_client_that_waits_for_each_answer_is_never_cut_off() -> None:
    with serving(Metrics()) as sink:
        conn = http.client.HTTPConnection(*sink.address, timeout=5)
        for n in range(3 * LIMITS.max_pipelined):
            conn.request("GET", "/metrics" if n % 2 else "/healthz")
            response = conn.getresponse()
            response.read()
            assert response.status == 200 and not response.will_close
        conn.close()


def test_many_connections_each_with_a_pipelined_burst_are_answered_two_at_a_time() -> None:
    """20 connections of one client, each with 100 pipelined requests: each answers 16 (max_pipelined), the
    client's connections served two at a time (scrapes_per_client) in turn, and a normal scrape from another
    client is answered meanwhile."""
    metrics = Metrics(seconds=0.01)
    with serving(metrics) as sink:
        socks = [connect(sink, OTHER_CLIENT) for _ in range(20)]
        for sock in socks:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 100)
        started = time.monotonic()
        assert get(sink) == (200, BODY)
        normal = time.monotonic() - started
        answers = [closed_by_server(sock, timeout=10).count(b"HTTP/1.1 200 OK\r\n") for sock in socks]
        assert answers == [LIMITS.max_pipelined] * 20
        # 20 x 16 answers, each scrape shared by the two of the flood that joined it (and the normal client).
        assert metrics.calls <= 20 * LIMITS.max_pipelined // LIMITS.scrapes_per_client + 2, metrics.calls
        assert normal < 2.0


def basic_auth_sink(metrics: Metrics, **limits) -> tuple[HttpSink, threading.Event, list[str]]:
    """A sink with basic auth whose bcrypt check blocks until the returned event is set."""
    bcrypt = pytest.importorskip("bcrypt", reason="basic_auth_users needs bcrypt (pyproject dependency)")
    web = WebSettings(basic_auth_users={"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4))})
    sink = HttpSink("127.0.0.1:0", metrics, Store(), lambda: (True, {"kmsg": "ok"}), web=web,
                    limits=Limits(**limits) if limits else LIMITS)
    checked = threading.Event()
    checked.set()
    calls: list[str] = []  # the credentials checked (base64), in order
    basic = sink.basic_auth
    real = basic.verify

    def slow_verify(authorization: str) -> bool:
        calls.append(authorization.split()[-1])
        checked.wait()
        return real(authorization)

    basic.verify = slow_verify  # type: ignore[method-assign]
    return sink, checked, calls


def authorization(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def get_as(sink: HttpSink, header: str, path: str = "/metrics", source: str = "127.0.0.1") -> int:
    conn = http.client.HTTPConnection(*sink.address, timeout=5, source_address=(source, 0))
    try:
        conn.request("GET", path, headers={"Authorization": header})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_a_password_guesser_does_not_lock_the_scraper_out() -> None:
    """Before: 4 checks a second for everyone and failures cached, so a guesser made the scraper's first
    request 429 (59 of 59 in 30 s)."""
    sink, _, calls = basic_auth_sink(Metrics())
    sink.start()
    try:
        guesses = [get_as(sink, authorization("prometheus", f"guess{n}"), source=OTHER_CLIENT) for n in range(5)]
        assert guesses == [401] * 4 + [429]  # its burst, then refused
        assert get_as(sink, authorization("prometheus", "s3cret")) == 200  # another client: checked at once
        checks = len(calls)
        assert get_as(sink, authorization("prometheus", "s3cret")) == 200
        assert len(calls) == checks  # remembered
        wrong = authorization("prometheus", "wrong")
        assert get_as(sink, wrong) == 401
        assert get_as(sink, wrong) == 401
        assert len(calls) == checks + 2  # a failure is checked each time, not remembered
    finally:
        sink.stop()


def test_healthz_is_answered_while_a_password_check_runs() -> None:
    """Before: the bcrypt check ran on the server's thread (cost 12-14: /healthz took 1.7 s)."""
    metrics = Metrics()
    sink, checked, calls = basic_auth_sink(metrics)
    checked.clear()
    sink.start()
    try:
        results: list[int] = []
        waiting = threading.Thread(target=lambda: results.append(get_as(sink, authorization("prometheus", "s3cret"))))
        waiting.start()
        assert wait_for(lambda: len(calls) == 1)  # the check is running, and blocked
        started = time.monotonic()
        assert get(sink, "/healthz", timeout=2) == (200, b'{"kmsg": "ok"}\n')
        assert time.monotonic() - started < 1.0
        checked.set()
        waiting.join(timeout=5)
        assert results == [200]
    finally:
        checked.set()
        sink.stop()


def test_one_check_waits_per_client_and_the_least_recently_checked_goes_first() -> None:
    metrics = Metrics()
    sink, checked, calls = basic_auth_sink(metrics, max_checks_waiting=2)
    checked.clear()
    sink.start()
    try:
        statuses: dict[str, list[int]] = {}

        def ask(source: str, password: str) -> None:
            statuses.setdefault(source, []).append(get_as(sink, authorization("prometheus", password), source=source))

        threads = []

        def start(source: str, password: str) -> None:
            threads.append(threading.Thread(target=ask, args=(source, password)))
            threads[-1].start()

        start("127.0.0.2", "a")
        assert wait_for(lambda: len(calls) == 1)  # 127.0.0.2's first check runs (and blocks)
        start("127.0.0.2", "b")
        assert wait_for(lambda: len(sink.server.state().checks_waiting) == 1)
        start("127.0.0.2", "c")  # 127.0.0.2 has a check running and one waiting: refused
        assert wait_for(lambda: statuses.get("127.0.0.2") == [429])
        start("127.0.0.3", "d")
        assert wait_for(lambda: len(sink.server.state().checks_waiting) == 2)
        # and a new client beyond max_checks_waiting is refused too
        assert get_as(sink, authorization("prometheus", "s3cret")) == 429
        checked.set()
        for t in threads:
            t.join(timeout=5)
        assert statuses["127.0.0.2"] == [429, 401, 401] and statuses["127.0.0.3"] == [401]
        # 127.0.0.3 never had a check: it goes before 127.0.0.2's second, which waited longer.
        assert [base64.b64decode(c).decode()[-1] for c in calls] == ["a", "d", "b"]
        assert get_as(sink, authorization("prometheus", "s3cret")) == 200
    finally:
        checked.set()
        sink.stop()


def test_a_failed_scrape_is_counted_with_its_error() -> None:
    metrics = Metrics()
    metrics.fail = True
    with serving(metrics) as sink:
        assert (sink.failed_scrapes, sink.last_scrape_error, sink.last_scrape_failed) == (0, None, False)
        assert sink.health() == {}
        assert get(sink)[0] == 500
        assert wait_for(lambda: sink.failed_scrapes == 1)
        assert sink.last_scrape_error == "RuntimeError: scrape broke" and sink.last_scrape_failed
        assert sink.health() == {"scrape": "the last scrape failed: RuntimeError: scrape broke"}  # (/healthz: 503)
        metrics.fail = False
        assert get(sink) == (200, BODY)
        assert wait_for(lambda: not sink.last_scrape_failed)
        assert sink.health() == {}
        assert sink.failed_scrapes == 1 and sink.last_scrape_error == "RuntimeError: scrape broke"


def test_a_scrape_still_running_after_the_write_timeout_is_a_failed_one() -> None:
    metrics = Metrics()
    metrics.release.clear()
    with serving(metrics, Limits(write_timeout=0.3)) as sink:
        sock = connect(sink)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert closed_by_server(sock) == b""  # its client was cut off at the write timeout
        assert wait_for(lambda: sink.failed_scrapes == 1, timeout=3)
        assert "write_timeout" in sink.last_scrape_error and sink.last_scrape_failed
        metrics.release.set()
        assert get(sink) == (200, BODY)
        assert sink.failed_scrapes == 1  # the overdue one is not counted twice when it ends


def test_failing_requests_log_one_line_not_one_traceback_each(caplog: pytest.LogCaptureFixture) -> None:
    def broken_health():
        raise RuntimeError("health broke")

    caplog.set_level(logging.INFO, logger="oomwatch.sinks.httpserver")
    sink = HttpSink("127.0.0.1:0", Metrics(), Store(), broken_health, limits=LIMITS)
    sink.start()
    try:
        assert [get(sink, "/healthz")[0] for _ in range(20)] == [500] * 20
    finally:
        sink.stop()
    lines = [r for r in caplog.records if r.name == "oomwatch.sinks.httpserver"]
    assert len(lines) == 1 and "health broke" in lines[0].getMessage()


def test_throttled_says_how_many_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    throttled = Throttled(every=10, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="oomwatch.sinks.httpserver")
    assert throttled.log("x", logging.WARNING, "bad client %s", "a")
    assert not throttled.log("x", logging.WARNING, "bad client %s", "b")
    assert throttled.log("y", logging.WARNING, "other kind")
    now[0] = 10.0
    assert throttled.log("x", logging.WARNING, "bad client %s", "c")
    assert [r.getMessage() for r in caplog.records] == [
        "bad client a", "other kind", "bad client c (1 more like it since the last one logged)"]


@pytest.mark.parametrize("address, key", [
    (("10.1.2.3", 5555), "10.1.2.3"),
    (("2001:db8:1:2:aaaa::1", 5555, 0, 0), "2001:db8:1:2::/64"),
    (("2001:db8:1:2:bbbb::7", 1, 0, 0), "2001:db8:1:2::/64"),  # one host's /64: one client
    (("2001:db8:1:3::1", 1, 0, 0), "2001:db8:1:3::/64"),
    (("::ffff:10.1.2.3", 5555, 0, 0), "10.1.2.3"),  # through a dual-stack listener
    (("fe80::1%eth0", 1, 0, 2), "fe80::/64"),
])
def test_client_key(address: tuple, key: str) -> None:
    assert client_key(address) == key


def test_a_scrape_that_ends_while_its_last_chunk_is_sent_is_finished_for_its_clients() -> None:
    """The worker may end a scrape between the loop sending the last chunk (the client goes back to waiting)
    and the loop looking whether it ended: the client must not be left waiting (under 20 pipelined bursts this
    left most of them hanging until the write timeout). Here the producer ends only once the loop has sent its
    last chunk and gone back to waiting."""
    def metrics(accept: str):
        def chunks():
            for _ in range(3):
                yield BODY
            assert wait_for(lambda: (s := sink.server.state()).running is not None and any(
                c.chunks_sent == 3 and c.state == "waiting" for c in s.connections), timeout=5)

        return "text/plain; version=0.0.4; charset=utf-8", chunks()

    with serving(metrics) as sink:  # the producer looks at sink.server
        assert get(sink, timeout=3) == (200, BODY * 3)


def test_checks_take_at_most_their_share_of_a_core_and_a_first_one_is_not_kept_waiting() -> None:
    """Checks of 0.1 s of CPU with check_cpu_share 0.25: a client's next check starts at least 0.3 s after the
    last one ended; a client that never had one goes first, and at once."""
    runs: list[tuple[str, float, float]] = []

    def handler(request):
        def burn() -> None:
            started, cpu = time.monotonic(), time.thread_time()
            while time.thread_time() - cpu < 0.1:
                pass
            runs.append((request.client, started, time.monotonic()))

        return Check(request.client, burn, lambda _: Response(200, "text/plain", b"ok\n"),
                     Response(429, "text/plain", b"busy\n"))

    server = HttpServer(("127.0.0.1", 0), handler, lambda key: ("text/plain", [b""]),
                        limits=Limits(check_cpu_share=0.25))
    server.start()
    try:
        guesser = socket.create_connection(server.address, timeout=5, source_address=(OTHER_CLIENT, 0))
        for _ in range(2):
            guesser.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert guesser.recv(65536).startswith(b"HTTP/1.1 200 ")
        guesser.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # waits for its turn on the CPU
        assert wait_for(lambda: len(server.state().checks_waiting) == 1)
        scraper = socket.create_connection(server.address, timeout=5)
        scraper.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert scraper.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert guesser.recv(65536).startswith(b"HTTP/1.1 200 ")
        guesser.close()
        scraper.close()
    finally:
        server.stop()
    assert [client for client, _, _ in runs] == [OTHER_CLIENT, OTHER_CLIENT, "127.0.0.1", OTHER_CLIENT]
    assert runs[1][1] - runs[0][2] >= 0.3 - 0.01, runs  # paced
    assert runs[3][1] - runs[2][2] >= 0.3 - 0.01, runs  # paced after the scraper's too


def test_a_refused_guess_is_answered_after_its_retry_after() -> None:
    """A guesser on a keep-alive connection gets its 429 a second later (Retry-After: 1): it cannot make the
    server answer refusals as fast as it asks; others are answered meanwhile."""
    sink, _, _ = basic_auth_sink(Metrics())
    sink.start()
    try:
        guesser = http.client.HTTPConnection(*sink.address, timeout=5, source_address=(OTHER_CLIENT, 0))
        for n in range(4):  # its burst of checks
            guesser.request("GET", "/metrics", headers={"Authorization": authorization("prometheus", f"g{n}")})
            assert guesser.getresponse().read() == b"unauthorized\n"
        started = time.monotonic()
        guesser.request("GET", "/metrics", headers={"Authorization": authorization("prometheus", "g5")})
        assert get(sink, "/healthz", timeout=1) == (200, b'{"kmsg": "ok"}\n')  # while the 429 is held
        response = guesser.getresponse()
        assert response.status == 429 and response.getheader("Retry-After") == "1"
        response.read()
        assert 0.9 < time.monotonic() - started < 3
        guesser.close()
    finally:
        sink.stop()


@pytest.mark.parametrize("connections, expected", [(1, 1 << 20), (50, (1 << 20) // 50), (200, 16 << 10)])
def test_a_turn_sends_a_client_one_share_of_its_bandwidth(connections: int, expected: int) -> None:
    """250 connections of one client pulling scrapes back to back made every turn of the loop send megabytes
    to each (/healthz took 646 ms, a normal scrape 47x its time); a turn now sends a client's connection a
    1 MiB share by the connections it holds (16 KiB at least)."""
    assert send_share(connections) == expected


def test_scrapes_take_at_most_their_share_of_a_core() -> None:
    """Scrapes of 0.1 s of CPU asked for back to back, with scrape_cpu_share 0.5: each starts at least 0.1 s
    after the previous one ended, however many clients ask (100 clients scraping back to back kept a core
    busy)."""
    runs: list[tuple[float, float]] = []

    def metrics(accept: str):
        def chunks():
            started, cpu = time.monotonic(), time.thread_time()
            while time.thread_time() - cpu < 0.1:
                pass
            runs.append((started, time.monotonic()))
            yield BODY

        return "text/plain; version=0.0.4; charset=utf-8", chunks()

    with serving(metrics, Limits(scrape_cpu_share=0.5)) as sink:
        for _ in range(3):
            assert get(sink) == (200, BODY)
    assert len(runs) == 3
    for (_, ended), (started, _) in zip(runs, runs[1:]):
        assert started - ended >= 0.1 - 0.01, runs
