"""Issue 11's and issue 19's HTTP attacks against the real agent, and its idle wakeups (issue 12, "Idle is idle").

    .venv/bin/python benchmarks/http_attacks.py                     # every attack, then idle (about 4 minutes)
    .venv/bin/python benchmarks/http_attacks.py slowloris idle --idle-seconds 20
    .venv/bin/python benchmarks/http_attacks.py --containers 1000   # a generated kubelet-shaped tree instead
    .venv/bin/python benchmarks/http_attacks.py same-address --source /tmp/old   # the agent of another tree
    # (/tmp/old: `git archive COMMIT oomwatch | tar -x -C /tmp/old`, to compare with an earlier commit)

Each attack runs against a fresh `oomwatch agent` (a subprocess) on the golden fixture tree
fixtures/golden/k8s-runc (or --containers N pods of one container, as benchmarks/run.py builds them). The agent
is scraped idle 20 times before and 20 times after the attack (the idle figure is their median); during the
attack, which runs in a process of its own, a normal client keeps scraping (a new connection and `GET /metrics`
each time, every 0.25 s). Printed per attack: the agent's peak RSS (VmHWM, which covers its whole
life), the most threads and open descriptors it had, /healthz during and after (and its median time during),
and the normal scrape's wall time during the attack against idle (median and worst). Targets (issues 11, 19):
healthy, under 128 MiB, a normal scrape within 2x its idle time.

Issue 19's attackers come from 127.0.0.2 (Linux routes 127.0.0.0/8 to the loopback), a client other than the
normal scraper's 127.0.0.1, as another pod would be; issue 11's share the scraper's address.

The attacks (the issue's figures):
- slowloris: 300 connections send a request line, then one header line a second, never the blank line;
- big-headers: 95 connections send 99 header lines of 65 KB each, without the blank line (a wave every
  second for 10 s);
- half-sent: 250 connections send a request without its blank line and close, then 250 send a complete
  request and close at once (every second for 10 s);
- idle-connections: 2,000 connections opened and left silent for 15 s;
- slow-readers: 100 connections ask for /metrics and never read the answer;
issue 19 (item 8):
- unique-accept, unique-accept-250: 100 (250) keep-alive clients, each with an Accept header of its own,
  scrape /metrics back to back for 15 s;
- unique-accept-250-10: the same 250 clients spread over 10 addresses (127.0.0.2-11): an attacker with
  several addresses;
- scrape-loop: one keep-alive connection scrapes /metrics back to back for 15 s (a single looping client);
- pipelined: every second for 10 s, 20 connections each send 1,000 pipelined `GET /metrics` (34 KB) and
  read whatever comes back;
- auth-guess, auth-guess-cost14: basic auth with a bcrypt hash of cost 12 (14); 8 clients send wrong
  passwords, a new one each time, as fast as they are answered, for 20 s; the normal client scrapes with the
  right password (its first request after the attack started, then the remembered one);
- tls-handshakes: TLS; 300 connections send the first bytes of a ClientHello and stall, while 4 clients do
  full handshakes back to back, for 15 s; the normal client scrapes over TLS (a handshake each time);
- never-read-300: 300 connections (over the cap of 256) ask for /metrics and never read;
- ipv6-idle: the agent listens on [::]:PORT; 2,000 silent connections over ::1 for 15 s (the normal client
  on 127.0.0.1, through the dual stack).
issue 31 (item 4):
- same-address, same-address-250: 100 (250) keep-alive clients from the normal client's own address
  (127.0.0.1: a node-local proxy, a NAT, hostNetwork) scrape /metrics back to back for 15 s. Here the normal
  client scrapes as Prometheus does, on one keep-alive connection it keeps (its idle figure too).

idle: a fresh agent, scraped once, then left alone: voluntary and involuntary context switches of each thread
(/proc/PID/task/*/status) over --idle-seconds with no connection, then as long again with one keep-alive
connection held open as Prometheus holds it (target: 0 for the HTTP thread, `oomwatch-http`).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import multiprocessing
import os
import resource
import selectors
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import make_tree  # noqa: E402 (benchmarks/run.py: the same kubelet-shaped tree)

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "fixtures" / "golden" / "k8s-runc"
MIB = 1024 * 1024
SOURCE: str | None = None  # --source: the directory the agent's `oomwatch` package is imported from


# --- the agent ----------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Setup:
    """How the agent listens, and how the normal client reaches it."""

    listen_host: str = "127.0.0.1"
    web_config: Path | None = None
    context: ssl.SSLContext | None = None  # the normal client's, with TLS
    authorization: str | None = None  # the normal client's, with basic auth
    fresh_authorization: str | None = None  # another user's, checked for the first time during the attack


class Agent:
    def __init__(self, tree: Path | None, setup: Setup = Setup()) -> None:
        self.port = free_port()
        self.setup = setup
        oomwatch = [str(Path(sys.executable).with_name("oomwatch"))]
        if SOURCE is not None:  # ahead of the editable install's finder, which would give this tree's package
            oomwatch = [sys.executable, "-c", "import sys; sys.meta_path[:] = [f for f in sys.meta_path if "
                        "'editable' not in repr(f)]; sys.path.insert(0, sys.argv.pop(1)); "
                        "from oomwatch.cli import main; sys.exit(main())", SOURCE]
        listen = f"[{setup.listen_host}]" if ":" in setup.listen_host else setup.listen_host
        args = [*oomwatch, "agent", "--listen", f"{listen}:{self.port}", "--kube-api", "off",
                "--log-level", "warning", "--boot-time", "2026-11-22T20:40:00Z",
                "--kmsg", str(GOLDEN / "kmsg"), "--kubelet-config", str(GOLDEN / "kubelet" / "config.yaml")]
        if setup.web_config is not None:
            args += ["--web-config-file", str(setup.web_config)]
        if tree is None:
            args += ["--cgroup-root", str(GOLDEN / "cgroup"), "--proc", str(GOLDEN / "proc"),
                     "--run-root", str(GOLDEN / "run")]
        else:
            args += ["--cgroup-root", str(tree), "--proc", str(GOLDEN / "proc"), "--run-root", str(tree.parent)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited {self.proc.returncode}: {self.proc.stderr.read()}")
            try:
                if self.get("/healthz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("agent not healthy after 60 s")

    def get(self, path: str, timeout: float = 30.0, authorization: str | None = None) -> tuple[int, bytes]:
        if self.setup.context is not None:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                "127.0.0.1", self.port, timeout=timeout, context=self.setup.context)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        authorization = authorization or self.setup.authorization
        headers = {"Authorization": authorization} if authorization else {}
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def status(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def threads(self) -> dict[int, tuple[str, int, int]]:
        """tid → (name, voluntary, involuntary context switches)."""
        out = {}
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                comm = (task / "comm").read_text().strip()
                fields = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
            except OSError:
                continue
            out[int(task.name)] = (comm, int(fields["voluntary_ctxt_switches"]),
                                   int(fields["nonvoluntary_ctxt_switches"]))
        return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def timed_scrape(agent: Agent, path: str = "/metrics") -> float:
    started = time.perf_counter()
    status, body = agent.get(path)
    if status != 200 or not body:
        raise RuntimeError(f"normal {path} failed: {status}")
    return time.perf_counter() - started


class KeptScraper:
    """The normal client as Prometheus scrapes: one keep-alive connection, kept (opened again only if lost)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.conn: http.client.HTTPConnection | None = None

    def __call__(self, agent: Agent, path: str = "/metrics") -> float:
        started = time.perf_counter()
        try:
            self.conn = self.conn or http.client.HTTPConnection("127.0.0.1", agent.port, timeout=30)
            self.conn.request("GET", path)
            response = self.conn.getresponse()
            status, body = response.status, response.read()
        except (OSError, http.client.HTTPException):
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            raise
        if status != 200 or not body:
            raise RuntimeError(f"normal {path} failed: {status}")
        return time.perf_counter() - started


def make_setup(kind: str, tmp: Path) -> Setup:
    """plain | ipv6 | tls | basic-auth-12 | basic-auth-14: the agent's port for an attack, made in `tmp`."""
    if kind == "plain":
        return Setup()
    if kind == "ipv6":
        return Setup(listen_host="::")
    config = tmp / f"web-{kind}.yml"
    if kind == "tls":
        if not (tmp / "server.crt").exists():
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                            "-nodes", "-keyout", "server.key", "-out", "server.crt", "-days", "2", "-subj",
                            "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                           cwd=tmp, check=True, capture_output=True)
        config.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
        return Setup(web_config=config, context=ssl.create_default_context(cafile=str(tmp / "server.crt")))
    import bcrypt

    cost = int(kind.rsplit("-", 1)[1])
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(cost)).decode()
    config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n  second: '{hashed}'\n")
    return Setup(web_config=config, authorization=basic("prometheus", "s3cret"),
                 fresh_authorization=basic("second", "s3cret"))


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# --- the attacks: each in its own process (the normal client's timing must not wait on its GIL) ------------------------------------------

def open_many(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.setblocking(False)
        socks.append(s)
    return socks


def closed(sock: socket.socket) -> bool:
    """Whether the server closed this connection (it never sends the attacker anything else)."""
    try:
        while sock.recv(65536):
            pass  # an answer (431, 503) before the close
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def slowloris(port: int, stop: Event, notes: dict) -> None:
    socks = open_many(port, 300)
    for s in socks:
        s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    alive = set(socks)
    started = time.monotonic()
    while not stop.wait(1.0):
        for s in list(alive):
            try:
                s.send(b"X-Slow: 1\r\n")
            except OSError:
                alive.discard(s)
        alive = {s for s in alive if not closed(s)}
        if time.monotonic() - started > 15:
            break
    notes["closed_by_agent"] = f"{300 - len(alive)}/300 after {time.monotonic() - started:.0f} s"
    for s in socks:
        s.close()


def big_headers(port: int, stop: Event, notes: dict) -> None:
    """A wave of 95 connections every second, for 10 s."""
    payload = memoryview(b"GET /metrics HTTP/1.1\r\n" + (b"X-Big: " + b"a" * 65_000 + b"\r\n") * 99)
    started, waves, refused, left_open = time.monotonic(), 0, 0, 0
    while time.monotonic() - started < 10 and not stop.is_set():
        answers, still_open = _big_headers_wave(port, payload, stop)
        waves, refused, left_open = waves + 1, refused + answers, left_open + still_open
        stop.wait(max(0.0, started + waves - time.monotonic()))
    notes["refused_431"] = f"{refused}/{95 * waves} in {waves} waves, {left_open} left open by the agent"


def _big_headers_wave(port: int, payload: memoryview, stop: Event) -> tuple[int, int]:
    socks = open_many(port, 95)
    sent = {s: 0 for s in socks}
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_WRITE)
    answers = 0
    started = time.monotonic()
    while sent and not stop.is_set() and time.monotonic() - started < 20:
        for key, _ in sel.select(0.5):
            s = key.fileobj
            try:
                n = s.send(payload[sent[s]:sent[s] + 262144])
                sent[s] += n
                if sent[s] >= len(payload):
                    raise BrokenPipeError
            except BlockingIOError:
                pass
            except OSError:
                sel.unregister(s)
                del sent[s]
                try:
                    s.setblocking(True)
                    s.settimeout(2)
                    answers += s.recv(100).startswith(b"HTTP/1.1 431")
                except OSError:
                    pass
    for s in socks:
        s.close()
    return answers, len(sent)


def half_sent(port: int, stop: Event, notes: dict) -> None:
    """Each second for 10 s: 250 requests without their blank line and 250 complete ones, each closed at once
    (the issue's 500 half-sent requests, every two seconds)."""
    started, sent, bursts = time.monotonic(), 0, 0
    while time.monotonic() - started < 10 and not stop.is_set():
        for request in (b"GET /metrics HTTP/1.1\r\nHost: x\r\n", b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"):
            for _ in range(250):
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                s.sendall(request)
                s.close()
                sent += 1
        bursts += 1
        stop.wait(max(0.0, started + bursts - time.monotonic()))
    notes["requests"] = f"{sent:,} sent and closed in {time.monotonic() - started:.0f} s"


def idle_connections(port: int, stop: Event, notes: dict) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    socks = open_many(port, 2000)
    stop.wait(15)
    notes["closed_by_agent"] = f"{sum(closed(s) for s in socks)}/2000 after 15 s"
    for s in socks:
        s.close()


def slow_readers(port: int, stop: Event, notes: dict) -> None:
    socks = []
    for _ in range(100):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        s.setblocking(False)
        socks.append(s)
    stop.wait(15)
    notes["closed_by_agent"] = f"{sum(closed(s) for s in socks)}/100 after 15 s"
    for s in socks:
        s.close()


# --- issue 19's attackers: from another client address ------------------------------------------------------

ATTACKER = "127.0.0.2"


def attacker_connection(port: int, timeout: float = 30, source: str = ATTACKER) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))


def in_threads(n: int, target, seconds: float, stop: Event) -> None:
    """Run target(i, until) in n threads until `seconds` have passed or `stop` is set."""
    until = time.monotonic() + seconds
    threads = [threading.Thread(target=target, args=(i, until), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) and not stop.wait(0.2):
        pass
    for t in threads:
        t.join(timeout=40)


def _unique_accept(port: int, stop: Event, notes: dict, clients: int, addresses: int = 1, first: int = 2) -> None:
    answered, errors = [0] * clients, [0]

    def client(i: int, until: float) -> None:
        conn = None
        accept = f"text/plain;version=0.0.4;q=0.{i:03d},application/x-attacker-{i};q=0.1"
        source = f"127.0.0.{first + i % addresses}"
        while time.monotonic() < until and not stop.is_set():
            try:
                conn = conn or attacker_connection(port, source=source)
                conn.request("GET", "/metrics", headers={"Accept": accept})
                conn.getresponse().read()
                answered[i] += 1
            except (OSError, http.client.HTTPException):
                errors[0] += 1
                if conn is not None:
                    conn.close()
                conn = None

    in_threads(clients, client, 15, stop)
    notes["requests"] = (f"{sum(answered):,} answered to {clients} clients"
                         f"{f' from {addresses} addresses' if addresses > 1 else ''}, {errors[0]} errors")


def unique_accept(port: int, stop: Event, notes: dict) -> None:
    _unique_accept(port, stop, notes, 100)


def unique_accept_250(port: int, stop: Event, notes: dict) -> None:
    _unique_accept(port, stop, notes, 250)


def unique_accept_250_10(port: int, stop: Event, notes: dict) -> None:
    _unique_accept(port, stop, notes, 250, addresses=10)


def same_address(port: int, stop: Event, notes: dict) -> None:
    _unique_accept(port, stop, notes, 100, first=1)


def same_address_250(port: int, stop: Event, notes: dict) -> None:
    _unique_accept(port, stop, notes, 250, first=1)


def scrape_loop(port: int, stop: Event, notes: dict) -> None:
    _unique_accept(port, stop, notes, 1)


def pipelined(port: int, stop: Event, notes: dict) -> None:
    burst = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 1000  # 34 KB
    answers: list[int] = []
    received = [0]

    def one(i: int, until: float) -> None:
        data = b""
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(ATTACKER, 0))
            s.sendall(burst)
            while chunk := s.recv(1 << 20):
                data += chunk
            s.close()
        except OSError:
            pass
        answers.append(data.count(b"HTTP/1.1 200 OK\r\n"))
        received[0] += len(data)

    started, waves = time.monotonic(), 0
    while time.monotonic() - started < 10 and not stop.is_set():
        in_threads(20, one, 30, stop)
        waves += 1
        stop.wait(max(0.0, started + waves - time.monotonic()))
    notes["answers"] = (f"{sum(answers):,} to {len(answers)} bursts of 1,000 (at most {max(answers, default=0)} "
                        f"each), {received[0] / MIB:.1f} MiB in {waves} waves")


def _auth_guess(port: int, stop: Event, notes: dict) -> None:
    statuses: dict[int, int] = {}

    def guesser(i: int, until: float) -> None:
        conn, n = None, 0
        while time.monotonic() < until and not stop.is_set():
            n += 1
            try:
                conn = conn or attacker_connection(port)
                conn.request("GET", "/metrics", headers={"Authorization": basic("prometheus", f"guess-{i}-{n}")})
                response = conn.getresponse()
                response.read()
                statuses[response.status] = statuses.get(response.status, 0) + 1
                if response.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                statuses[0] = statuses.get(0, 0) + 1
                if conn is not None:
                    conn.close()
                conn = None

    in_threads(8, guesser, 20, stop)
    notes["guesses"] = ", ".join(f"{k or 'error'}: {v:,}" for k, v in sorted(statuses.items()))


def tls_handshakes(port: int, stop: Event, notes: dict) -> None:
    stalled = [socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(ATTACKER, 0))
               for _ in range(300)]
    for s in stalled:  # a TLS record header and the start of a ClientHello, then nothing
        s.sendall(bytes.fromhex("160301020001000200fc0303"))
        s.setblocking(False)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    done = [0]

    def handshaker(i: int, until: float) -> None:
        while time.monotonic() < until and not stop.is_set():
            try:
                raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(ATTACKER, 0))
                context.wrap_socket(raw).close()
                done[0] += 1
            except OSError:
                pass

    in_threads(4, handshaker, 15, stop)
    notes["handshakes"] = f"{done[0]:,} full, {sum(closed(s) for s in stalled)}/300 stalled closed by the agent"
    for s in stalled:
        s.close()


def never_read_300(port: int, stop: Event, notes: dict) -> None:
    socks = []
    for _ in range(300):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.bind((ATTACKER, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        s.setblocking(False)
        socks.append(s)
    stop.wait(15)
    notes["closed_by_agent"] = f"{sum(closed(s) for s in socks)}/300 after 15 s"
    for s in socks:
        s.close()


def ipv6_idle(port: int, stop: Event, notes: dict) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    socks = [socket.create_connection(("::1", port), timeout=10) for _ in range(2000)]
    for s in socks:
        s.setblocking(False)
    stop.wait(15)
    notes["closed_by_agent"] = f"{sum(closed(s) for s in socks)}/2000 after 15 s"
    for s in socks:
        s.close()


ATTACKS = {"slowloris": slowloris, "big-headers": big_headers, "half-sent": half_sent,
           "idle-connections": idle_connections, "slow-readers": slow_readers,
           "unique-accept": unique_accept, "unique-accept-250": unique_accept_250,
           "unique-accept-250-10": unique_accept_250_10, "scrape-loop": scrape_loop, "pipelined": pipelined,
           "auth-guess": _auth_guess, "auth-guess-cost14": _auth_guess, "tls-handshakes": tls_handshakes,
           "never-read-300": never_read_300, "ipv6-idle": ipv6_idle,
           "same-address": same_address, "same-address-250": same_address_250}
SETUPS = {"auth-guess": "basic-auth-12", "auth-guess-cost14": "basic-auth-14", "tls-handshakes": "tls",
          "ipv6-idle": "ipv6"}  # the others: plain
KEEP_ALIVE_NORMAL = {"same-address", "same-address-250"}  # the normal client keeps one connection (Prometheus)


def _attack_process(name: str, port: int, stop: Event, results: multiprocessing.Queue) -> None:
    notes: dict = {}
    ATTACKS[name](port, stop, notes)
    results.put(notes)


def run_attack(name: str, tree: Path | None, tmp: Path, idle_scrapes: int = 20) -> dict:
    agent = Agent(tree, make_setup(SETUPS.get(name, "plain"), tmp))
    scrape = KeptScraper(agent) if name in KEEP_ALIVE_NORMAL else timed_scrape
    try:
        for _ in range(3):
            scrape(agent)  # warm: the kernel log replayed, the first scrape's imports done
        idle = [scrape(agent) for _ in range(idle_scrapes)]  # and as many after the attack
        rss_idle = agent.status("VmRSS")
        context = multiprocessing.get_context("fork")
        stop, results = context.Event(), context.Queue()
        peak = {"threads": 0, "fds": 0}
        attacker = context.Process(target=_attack_process, args=(name, agent.port, stop, results), daemon=True)
        cpu_before, started = agent.cpu_seconds(), time.monotonic()
        attacker.start()
        during, health, health_times, notes = [], set(), [], {}
        while attacker.is_alive():
            if agent.setup.fresh_authorization and "fresh_credential" not in notes and \
                    time.monotonic() - started > 3:
                fresh_started = time.perf_counter()
                status = agent.get("/metrics", authorization=agent.setup.fresh_authorization)[0]
                notes["fresh_credential"] = f"{status} in {(time.perf_counter() - fresh_started) * 1000:.0f} ms"
            peak["threads"] = max(peak["threads"], agent.status("Threads"))
            peak["fds"] = max(peak["fds"], agent.fds())
            try:
                during.append(scrape(agent))
                started_health = time.perf_counter()
                health.add(agent.get("/healthz")[0])
                health_times.append(time.perf_counter() - started_health)
            except (OSError, RuntimeError) as exc:
                during.append(float("inf"))
                notes.setdefault("failed_scrapes", 0)
                notes["failed_scrapes"] += 1
                notes["last_error"] = str(exc)
            attacker.join(0.25)
        stop.set()
        notes.update(results.get(timeout=30))
        cpu = agent.cpu_seconds() - cpu_before  # the normal client's scrapes included
        elapsed = time.monotonic() - started
        time.sleep(0.5)
        after = agent.get("/healthz")[0]
        idle += [scrape(agent) for _ in range(idle_scrapes)]
        row = {
            "attack": name,
            "peak_rss_mib": round(agent.status("VmHWM") / 1024, 1),
            "idle_rss_mib": round(rss_idle / 1024, 1),
            "max_threads": peak["threads"],
            "max_fds": peak["fds"],
            "healthz": "/".join(str(h) for h in sorted(health)) + f", after {after}" + (
                f", median {statistics.median(health_times) * 1000:.1f} ms" if health_times else ""),
            "idle_scrape_ms": round(statistics.median(idle) * 1000, 1),
            "attack_scrape_ms": round(statistics.median(during) * 1000, 1) if during else None,
            "attack_worst_ms": round(max(during) * 1000, 1) if during else None,
            "scrapes_during": len(during),
            "agent_cpu": f"{cpu:.2f} s in {elapsed:.0f} s",
        }
        row["ratio"] = round(row["attack_scrape_ms"] / row["idle_scrape_ms"], 2) if during else None
        row.update(notes)
        return row
    finally:
        agent.stop()


def run_idle(tree: Path | None, seconds: float) -> list[dict]:
    agent = Agent(tree)
    try:
        timed_scrape(agent)
        time.sleep(3)  # the saved kernel log replayed, the scrape done
        phases = []
        for phase in ("no connection", "one keep-alive connection open"):
            conn = None
            if phase != "no connection":
                conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=10)
                conn.request("GET", "/metrics")
                conn.getresponse().read()  # the connection stays open, as Prometheus keeps it
                time.sleep(0.5)
            before = agent.threads()
            time.sleep(seconds)
            after = agent.threads()
            for tid, (comm, vol, invol) in sorted(after.items()):
                if tid in before:
                    phases.append({"phase": phase, "seconds": seconds, "tid": tid, "thread": comm,
                                   "voluntary": vol - before[tid][1], "involuntary": invol - before[tid][2]})
            if conn is not None:
                conn.close()
        return phases
    finally:
        agent.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("which", nargs="*", help=f"{', '.join(ATTACKS)}, idle (default: all)")
    parser.add_argument("--containers", type=int, default=0, help="a generated tree of N pods (default: golden)")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--source", help="run the agent from this tree's oomwatch package (another commit)")
    args = parser.parse_args(argv)
    global SOURCE
    SOURCE = args.source
    which = args.which or [*ATTACKS, "idle"]
    tmp = Path(tempfile.mkdtemp(prefix="oomwatch-http-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        tree = None
        if args.containers:
            tree = tmp / "cgroup"
            make_tree(tree, args.containers)
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "unknown")
        print(f"# {model}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, tree: "
              f"{f'{args.containers} containers' if tree else 'golden k8s-runc'}"
              f"{f', agent from {SOURCE}' if SOURCE else ''}", flush=True)
        rows = []
        for name in which:
            if name == "idle":
                continue
            row = run_attack(name, tree, tmp)
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        if rows:
            print("\n| attack | peak RSS MiB (idle) | max threads | max fds | /healthz | normal scrape ms, idle → "
                  "attack median (worst) | ratio | agent CPU | notes |")
            print("|---|---|---|---|---|---|---|---|---|")
            for r in rows:
                notes = "; ".join(f"{k}: {v}" for k, v in r.items() if k not in {
                    "attack", "peak_rss_mib", "idle_rss_mib", "max_threads", "max_fds", "healthz", "idle_scrape_ms",
                    "attack_scrape_ms", "attack_worst_ms", "ratio", "scrapes_during", "agent_cpu"})
                print(f"| {r['attack']} | {r['peak_rss_mib']} ({r['idle_rss_mib']}) | {r['max_threads']} | "
                      f"{r['max_fds']} | {r['healthz']} | {r['idle_scrape_ms']} → {r['attack_scrape_ms']} "
                      f"({r['attack_worst_ms']}), n={r['scrapes_during']} | {r['ratio']} | {r['agent_cpu']} | {notes} |")
        if "idle" in which:
            phases = run_idle(tree, args.idle_seconds)
            print(f"\n| idle {args.idle_seconds:.0f} s | thread (tid) | voluntary | involuntary |")
            print("|---|---|---|---|")
            for p in phases:
                print(f"| {p['phase']} | {p['thread']} ({p['tid']}) | {p['voluntary']} | {p['involuntary']} |")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
