"""Issue 31 item 3: what the port holds for clients that loop on /incidents is bounded by one body, not one per
client. Measured as the peak of what Python allocates (tracemalloc, every thread: the server's loop included)
on a fixed workload, never as a time."""

from __future__ import annotations

import socket
import tracemalloc

from oomwatch.sinks.http import HttpSink
from tests.conftest import wait_for

READERS = 8


class Store:
    """100 incidents of about 40 kB (a group kill's killed list): /incidents is about 4 MB."""

    def __init__(self) -> None:
        self.incidents = tuple({"kernel_seq": n, "killed": [{"pid": 10_000 + i, "comm": f"worker-{i}"}
                                                             for i in range(1000)]} for n in range(100))

    def snapshot(self):
        store = self

        class Snapshot:
            incidents = store.incidents

        return Snapshot()


def test_clients_that_do_not_read_their_incidents_share_one_body() -> None:
    """8 clients ask for /incidents and read nothing, so each answer waits in the server: it holds one body
    for them all. (Before, each answer was its own JSON text, its bytes and those bytes joined to the head:
    the peak was over 8 bodies.)"""
    sink = HttpSink("127.0.0.1:0", lambda accept: ("text/plain", [b""]), Store(), lambda: (True, {}))
    sink.start()
    readers: list[socket.socket] = []
    try:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(READERS):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(sink.address)
                sock.sendall(b"GET /incidents HTTP/1.1\r\nHost: x\r\n\r\n")
                readers.append(sock)
            # (a wide margin: the server under tracemalloc on a loaded machine; before, 8 encodings took seconds)
            assert wait_for(lambda: [c.state for c in sink.server.state(timeout=60).connections]
                            == ["writing"] * READERS, timeout=60)
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
        head = readers[0].recv(4096)
        body = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        assert body > 3_000_000
        # One body, the text it was encoded from while it was made, and the server's bookkeeping.
        assert peak < 2.5 * body, (peak, body)
    finally:
        for sock in readers:
            sock.close()
        sink.stop()
