"""Issue 11's HTTP attacks against the real agent, and its idle wakeups (issue 12, "Idle is idle").

    .venv/bin/python benchmarks/http_attacks.py                     # every attack, then idle (about 4 minutes)
    .venv/bin/python benchmarks/http_attacks.py slowloris idle --idle-seconds 20
    .venv/bin/python benchmarks/http_attacks.py --containers 1000   # a generated kubelet-shaped tree instead

Each attack runs against a fresh `oomwatch agent` (a subprocess) on the golden fixture tree
fixtures/golden/k8s-runc (or --containers N pods of one container, as benchmarks/run.py builds them). The agent
is scraped idle 20 times before and 20 times after the attack (the idle figure is their median); during the
attack, which runs in a process of its own, a normal client keeps scraping (a new connection and `GET /metrics`
each time, every 0.25 s). Printed per attack: the agent's peak RSS (VmHWM, which covers its whole
life), the most threads and open descriptors it had, /healthz during and after, and the normal scrape's wall
time during the attack against idle (median and worst). Targets (issue 11): healthy, under 128 MiB, a normal
scrape within 2x its idle time.

The attacks (the issue's figures):
- slowloris: 300 connections send a request line, then one header line a second, never the blank line;
- big-headers: 95 connections send 99 header lines of 65 KB each, without the blank line (a wave every
  second for 10 s);
- half-sent: 250 connections send a request without its blank line and close, then 250 send a complete
  request and close at once (every second for 10 s);
- idle-connections: 2,000 connections opened and left silent for 15 s;
- slow-readers: 100 connections ask for /metrics and never read the answer.

idle: a fresh agent, scraped once, then left alone: voluntary and involuntary context switches of each thread
(/proc/PID/task/*/status) over --idle-seconds with no connection, then as long again with one keep-alive
connection held open as Prometheus holds it (target: 0 for the HTTP thread, `oomwatch-http`).
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import resource
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import make_tree  # noqa: E402 (benchmarks/run.py: the same kubelet-shaped tree)

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "fixtures" / "golden" / "k8s-runc"
MIB = 1024 * 1024


# --- the agent ----------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Agent:
    def __init__(self, tree: Path | None) -> None:
        self.port = free_port()
        oomwatch = Path(sys.executable).with_name("oomwatch")
        args = [str(oomwatch), "agent", "--listen", f"127.0.0.1:{self.port}", "--kube-api", "off",
                "--log-level", "warning", "--boot-time", "2026-11-22T20:40:00Z",
                "--kmsg", str(GOLDEN / "kmsg"), "--kubelet-config", str(GOLDEN / "kubelet" / "config.yaml")]
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

    def get(self, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path)
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


def timed_scrape(agent: Agent) -> float:
    started = time.perf_counter()
    status, body = agent.get("/metrics")
    if status != 200 or not body:
        raise RuntimeError(f"normal scrape failed: {status}")
    return time.perf_counter() - started


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


ATTACKS = {"slowloris": slowloris, "big-headers": big_headers, "half-sent": half_sent,
           "idle-connections": idle_connections, "slow-readers": slow_readers}


def _attack_process(name: str, port: int, stop: Event, results: multiprocessing.Queue) -> None:
    notes: dict = {}
    ATTACKS[name](port, stop, notes)
    results.put(notes)


def run_attack(name: str, tree: Path | None, idle_scrapes: int = 20) -> dict:
    agent = Agent(tree)
    try:
        for _ in range(3):
            timed_scrape(agent)  # warm: the kernel log replayed, the first scrape's imports done
        idle = [timed_scrape(agent) for _ in range(idle_scrapes)]  # and as many after the attack
        rss_idle = agent.status("VmRSS")
        context = multiprocessing.get_context("fork")
        stop, results = context.Event(), context.Queue()
        peak = {"threads": 0, "fds": 0}
        attacker = context.Process(target=_attack_process, args=(name, agent.port, stop, results), daemon=True)
        cpu_before, started = agent.cpu_seconds(), time.monotonic()
        attacker.start()
        during, health, notes = [], set(), {}
        while attacker.is_alive():
            peak["threads"] = max(peak["threads"], agent.status("Threads"))
            peak["fds"] = max(peak["fds"], agent.fds())
            try:
                during.append(timed_scrape(agent))
                health.add(agent.get("/healthz")[0])
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
        idle += [timed_scrape(agent) for _ in range(idle_scrapes)]
        row = {
            "attack": name,
            "peak_rss_mib": round(agent.status("VmHWM") / 1024, 1),
            "idle_rss_mib": round(rss_idle / 1024, 1),
            "max_threads": peak["threads"],
            "max_fds": peak["fds"],
            "healthz": "/".join(str(h) for h in sorted(health)) + f", after {after}",
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
    args = parser.parse_args(argv)
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
              f"{f'{args.containers} containers' if tree else 'golden k8s-runc'}", flush=True)
        rows = []
        for name in which:
            if name == "idle":
                continue
            row = run_attack(name, tree)
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
