"""oomwatch benchmarks, side by side with a C program and node_exporter reading the same files.

    .venv/bin/python benchmarks/run.py                       # everything (about 15 minutes on 2 cores)
    .venv/bin/python benchmarks/run.py pipeline scrape       # some: pipeline, scrape, rss, idle
    .venv/bin/python benchmarks/run.py scrape --sizes 250,1000 --busy

What it measures (never in timed unit tests; figures go to benchmarks/RESULTS.md):
- pipeline: kernel-log records/s through parse + correlate on the real storm capture
  (fixtures/kmsg/linux-6.1-storm-ratelimited.kmsg; target 200,000/s), median and best of 7 runs: in one thread
  with every record parsed, in one thread behind the bytes pre-filter, and split into the agent's two
  processes (the reader's read + pre-filter + parse + pickle, the agent's unpickle + correlate);
- scrape, at 250 / 1,000 / 4,000 / 10,000 containers (N pods of 1 container: 2N workload cgroups, 10N files):
  - `oomwatch agent` (a real process): CPU per /metrics scrape (from /proc/PID/stat, in batches because
    the kernel counts in 10 ms ticks; median of the batches), series count, and exec to its saved kernel
    log (a FIFO) opened and to /healthz 200;
  - the scrape path alone, in this process: OomwatchCollector over StatCache (CPU per scrape, median);
  - benchmarks/floor.c, built here with gcc: open + read + parse of the same 10N files (median CPU);
  - node_exporter (Debian's prometheus-node-exporter, installed with apt-get if missing): its textfile
    collector over 10N .prom files holding the same series;
  - ratios to the C floor and growth per container (target: agent <= 3x the floor, linear);
- start: the agent on the live /dev/kmsg under strace: exec to its first record read, and to /healthz 200;
- rss: the agent's RSS at 2,000 containers after 1,000 scrapes (target 40 MiB), on the live /dev/kmsg with a
  state directory as on a node, with its kernel-log reader process's RSS and PSS beside it;
- idle: the agent's wakeups (voluntary + involuntary context switches of all its threads, from
  /proc/PID/task/*/status) over 60 s without a scrape (target 0).
`--busy` keeps the other core busy with a spinning process for the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STORM = REPO / "fixtures" / "kmsg" / "linux-6.1-storm-ratelimited.kmsg"
FLOOR_C = REPO / "benchmarks" / "floor.c"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
FILES = ("memory.events", "memory.max", "memory.current", "memory.oom.group", "memory.peak")
TICK = os.sysconf("SC_CLK_TCK")
# node_exporter's textfile collector grows faster than linearly with the number of files (4x the files cost it
# 15-18x the CPU here, and at 4,000 containers, 40,000 files, one scrape did not end within 120 s), so it is
# measured up to this size.
NODE_EXPORTER_MAX_CONTAINERS = 1000


# --- pipeline ---------------------------------------------------------------------------------------

def _raw_records(path: Path) -> list[bytes]:
    """A saved raw /dev/kmsg dump split back into the records one read() returned (continuation lines belong
    to the record before them). Here, not imported from the tests: a benchmark runs without the test extras."""
    records: list[bytes] = []
    for line in Path(path).read_bytes().splitlines(keepends=True):
        if line.startswith(b" ") and records:
            records[-1] += line
        elif line.strip() and not line.startswith(b"#"):
            records.append(line)
    return records


def _storm_rounds(rounds: int) -> list[bytes]:
    """The storm capture `rounds` times over, renumbered so that the sequence numbers keep rising (the reader
    drops a record it has seen, as after a restart)."""
    raws = _raw_records(STORM)
    out, seq = [], 0
    for _ in range(rounds):
        for raw in raws:
            priority, _, rest = raw.split(b",", 2)
            out.append(b"%s,%d,%s" % (priority, seq, rest))
            seq += 1
    return out


def _correlator():
    from oomwatch.correlator import BlindView, Correlator
    from oomwatch.explain import explain
    from oomwatch.workloads import WorkloadResolver

    resolver = WorkloadResolver()
    return Correlator(boot_id="bench", boot_time=0.0, resolve_workload=resolver.resolve,
                      scope_of=resolver.layout.scope_of, explain=lambda incident: explain(incident, "false"),
                      view=BlindView(), detected_clock=time.time, live=True,
                      page_size=os.sysconf("SC_PAGE_SIZE"), tmpfs_mounts=resolver.tmpfs_mounts)


def _one_thread(records: list[bytes], prefilter: bool) -> tuple[float, int]:
    """Every stage in one thread, as the issue measured it: (CPU seconds, incidents)."""
    from oomwatch.parse.kmsg import parse_kmsg_record
    from oomwatch.parse.prefilter import could_be_oom

    correlator = _correlator()
    incidents = 0
    start = time.process_time()
    for raw in records:
        if prefilter and not could_be_oom(raw):
            continue
        incidents += len(correlator.feed(parse_kmsg_record(raw)))
    incidents += len(correlator.flush())
    return time.process_time() - start, incidents


def _two_stages(records: list[bytes]) -> tuple[float, float, int]:
    """The agent's own split (oomwatch/sources/kmsgproc.py): the reader process reads each record with one
    read() (here from a SOCK_SEQPACKET pair, which returns one record per read as /dev/kmsg does), pre-filters,
    parses what passes and pickles each batch; the agent process unpickles each batch and steps it through the
    pipeline as one KernelLog event (oomwatch/pipeline.py: correlator, store, deadlines), as its loop does. The
    stages run in two processes at once, so the pipeline keeps up with the slower one. Returns (reader CPU s,
    agent CPU s, incidents); the sends that stand in for the kernel's printk are not counted."""
    frames, reader_cpu = reader_frames(records)
    incidents, agent_cpu = agent_steps(frames)
    return reader_cpu, agent_cpu, incidents


def reader_frames(records: list[bytes]) -> tuple[list[bytes], float]:
    """The reader stage: each batch LiveKmsg(prefilter=True) reads of `records`, pickled; and its CPU seconds
    (the sends that fill the socket, as a burst of printk fills the ring, not counted)."""
    import pickle
    import socket

    from oomwatch.sources.kmsg import LiveKmsg

    kernel_end, reader_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    kernel_end.setblocking(False)
    reader_end.setblocking(False)
    reader = LiveKmsg("bench", prefilter=True)
    reader.fd = reader_end.fileno()
    frames: list[bytes] = []
    reader_cpu, at = 0.0, 0
    try:
        while at < len(records):
            while at < len(records):
                try:
                    kernel_end.send(records[at])
                except BlockingIOError:
                    break
                at += 1
            start = time.process_time()
            items = list(reader.read_available(limit=4096))
            frames.append(pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL))
            reader_cpu += time.process_time() - start
    finally:
        kernel_end.close()
        reader_end.close()
    return frames, reader_cpu


def agent_steps(frames: list[bytes], **settings) -> tuple[int, float]:
    """The agent stage: each frame unpickled and stepped through a new Pipeline (`settings`: more of its
    Settings); (incidents published, CPU seconds of the steps)."""
    import pickle

    from oomwatch.events import KernelLogEnded, KernelLog
    from oomwatch.pipeline import Pipeline, Settings
    from oomwatch.store import Store
    from oomwatch.workloads import WorkloadResolver

    pipeline = Pipeline(Settings(boot_id="bench", boot_time=0.0, kmsg_source="kmsg", counting=True, **settings),
                        Store(), WorkloadResolver(), now=0.0)
    incidents = 0
    start = time.process_time()
    for n, frame in enumerate(frames):
        incidents += len(pipeline.step(KernelLog(pickle.loads(frame), drained_at=None), float(n)).publish)
    incidents += len(pipeline.step(KernelLogEnded(saved=True), float(len(frames))).publish)
    return incidents, time.process_time() - start


def bench_pipeline(rounds: int = 20, repeats: int = 7) -> dict:
    """Records/s of the kernel-log pipeline on the real storm capture, median and best of `repeats` runs (this
    machine's speed varies by half from one second to the next): in one thread with every record parsed, in one
    thread behind the bytes pre-filter (oomwatch/parse/prefilter.py), and split as the agent runs it (reader
    process and agent process, each stage's rate; the pipeline's is the slower stage's). Each run must find
    the capture's 150 incidents per round."""
    records = _storm_rounds(rounds)
    n = len(records)
    expected = 150 * rounds
    rates: dict[str, list[int]] = {"all_parsed": [], "prefiltered": [], "reader_stage": [], "agent_stage": [],
                                   "two_processes": []}
    for _ in range(repeats):
        for name, prefilter in (("all_parsed", False), ("prefiltered", True)):
            cpu, incidents = _one_thread(records, prefilter)
            assert incidents == expected, (name, incidents, expected)
            rates[name].append(int(n / cpu))
        reader_cpu, agent_cpu, incidents = _two_stages(records)
        assert incidents == expected, ("two stages", incidents, expected)
        rates["reader_stage"].append(int(n / reader_cpu))
        rates["agent_stage"].append(int(n / agent_cpu))
        rates["two_processes"].append(int(n / max(reader_cpu, agent_cpu)))
    out: dict = {"records": n, "repeats": repeats, "target": 200_000, "incidents_per_run": expected}
    for name, values in rates.items():
        out[f"{name}_median"] = int(statistics.median(values))
        out[f"{name}_best"] = max(values)
    return out


# --- the tree and the programs that read it ---------------------------------------------------------

def make_tree(root: Path, pods: int) -> list[Path]:
    """N kubelet-shaped pods of one container each; returns the workload cgroup directories."""
    def cg(path: Path, limit: str, group: int, peak: bool = True) -> None:
        path.mkdir(parents=True)
        values = {"memory.max": limit, "memory.oom.group": group, "memory.current": 1 << 20,
                  "cgroup.procs": ""}
        if peak:
            values["memory.peak"] = 2 << 20
        for name, value in values.items():
            (path / name).write_text(f"{value}\n")
        events = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"
        (path / "memory.events").write_text(events)
        (path / "memory.events.local").write_text(events)

    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("memory\n")
    cg(root / "kubepods", "max", 0)
    cg(root / "kubepods" / "burstable", "max", 0)
    workloads = []
    for p in range(pods):
        pod = root / "kubepods" / "burstable" / f"pod{p:08d}-0000-4000-8000-000000000000"
        cg(pod, str(512 << 20), 0)
        container = pod / f"{p:032x}{0:032x}"
        cg(container, str(256 << 20), 1)
        workloads += [pod, container]
    return workloads


def make_textfiles(directory: Path, workloads: list[Path]) -> None:
    """node_exporter's textfile collector input: one .prom file per cgroup file, with that file's series."""
    directory.mkdir(parents=True)
    for i, cg in enumerate(workloads):
        labels = f'cgroup="{cg.name}"'
        series = {
            "memory.events": "".join(f'oomwatch_memory_events_total{{{labels},event="{e}"}} 0\n'
                                     for e in ("max", "high", "oom", "oom_kill", "oom_group_kill")),
            "memory.max": f"oomwatch_memory_limit_bytes{{{labels}}} 268435456\n",
            "memory.current": f"oomwatch_memory_usage_bytes{{{labels}}} 1048576\n",
            "memory.oom.group": f"oomwatch_memory_oom_group{{{labels}}} 1\n",
            "memory.peak": f"oomwatch_memory_peak_bytes{{{labels}}} 2097152\n",
        }
        for name, text in series.items():
            kind = "counter" if name == "memory.events" else "gauge"
            metric = text.split("{", 1)[0]
            (directory / f"{i:06d}-{name}.prom").write_text(f"# TYPE {metric} {kind}\n{text}")


def scratch_dir() -> str:
    """A fresh directory on tmpfs where there is one (files read from memory, as cgroupfs files are)."""
    return tempfile.mkdtemp(prefix="oomwatch-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


def build_floor(tmp: Path) -> Path:
    binary = tmp / "floor"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(FLOOR_C)], check=True)
    return binary


def ensure_node_exporter() -> str:
    if not os.access(NODE_EXPORTER, os.X_OK):
        print("installing Debian's prometheus-node-exporter with apt-get", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "prometheus-node-exporter"],
                       check=True, stdout=subprocess.DEVNULL)
    return NODE_EXPORTER


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread, live and exited (10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def context_switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                total += int(line.split()[1])
    return total


def fetch(url: str, timeout: float = 120.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def scrape_cpu(pid: int, url: str, samples: int, min_batch_cpu: float = 0.3) -> tuple[float, float, bytes]:
    """Median CPU seconds per scrape of process `pid` and median wall seconds, in batches big enough for
    the kernel's 10 ms ticks to be small against them."""
    c0 = cpu_seconds(pid)
    body = fetch(url)  # warm up; also the body for the series count, and the batch size
    first = max(cpu_seconds(pid) - c0, 0.005)
    batch = max(1, min(20, int(min_batch_cpu / first + 0.999)))
    cpu, wall = [], []
    for _ in range(samples):
        c0, w0 = cpu_seconds(pid), time.perf_counter()
        for _ in range(batch):
            fetch(url)
        cpu.append((cpu_seconds(pid) - c0) / batch)
        wall.append((time.perf_counter() - w0) / batch)
    return statistics.median(cpu), statistics.median(wall), body


class AgentProcess:
    """`oomwatch agent` on a tree, its kernel log a FIFO holding the storm capture (the moment it opens the
    log is when our write-end open returns), or the live /dev/kmsg under strace (`live=True`: the time of its
    first read of a record is in the trace)."""

    def __init__(self, tmp: Path, tree: Path, live: bool = False, trace: bool = True) -> None:
        self.port = free_port()
        fifo = tmp / "kmsg"
        if fifo.exists():
            fifo.unlink()
        os.mkfifo(fifo)
        for d in ("proc", "run", "pods"):
            (tmp / d).mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "oomwatch", "agent", "--cgroup-root", str(tree),
               "--proc", str(tmp / "proc"), "--kmsg", str(fifo), "--listen", f"127.0.0.1:{self.port}",
               "--kube-api", "off",
               "--kubelet-config", str(tmp / "none"), "--run-root", str(tmp / "run"),
               "--pod-log-dir", str(tmp / "pods"), "--state-dir", str(tmp / "state"), "--log-level", "warning"]
        self.opened_after = None
        self.trace = tmp / "strace.out"
        if live:
            cmd[cmd.index("--kmsg") + 1] = "/dev/kmsg"
        if live and trace:
            cmd = ["strace", "-f", "--seccomp-bpf", "-ttt", "-e", "trace=read", "-P", "/dev/kmsg",
                   "-o", str(self.trace), *cmd]
        self.exec_time = time.time()
        started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.DEVNULL)

        def feed() -> None:
            with open(fifo, "wb") as log:  # blocks until the agent opens its kernel log
                self.opened_after = time.perf_counter() - started
                log.write(STORM.read_bytes())

        if not live:
            threading.Thread(target=feed, daemon=True).start()
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(self.url("/healthz"), timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent did not become healthy (rc {self.proc.poll()})")
            time.sleep(0.01)
        self.healthy_after = time.perf_counter() - started

    def first_record_after(self) -> float:
        """Seconds from exec to the first read(2) of /dev/kmsg that returned a record (live mode)."""
        for line in self.trace.read_text().splitlines():
            parts = line.split()  # PID TIME read(FD, "...", N) = BYTES
            if len(parts) >= 3 and parts[2].startswith("read(") and not parts[-1].startswith("-"):
                try:
                    if int(parts[-1]) > 0:
                        return float(parts[1]) - self.exec_time
                except ValueError:
                    continue
        return -1.0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def in_process_scrape(tree: Path, workloads: list[Path], samples: int) -> float:
    """CPU of the scrape path alone: StatCache reads and the exposition, as the agent wires them."""
    from oomwatch.sinks.collector import NodeInfo, OomwatchCollector
    from oomwatch.sources.cgroupfs import CgroupFS
    from oomwatch.sources.statcache import StatCache
    from oomwatch.store import Store
    from oomwatch.workloads import identify

    fs = CgroupFS(str(tree))
    cache = StatCache(fs)
    store = Store()
    paths = {}
    for cg in workloads:
        path = "/" + str(cg.relative_to(tree))
        labels = identify(path).metric_labels()
        paths[path] = labels
        store.seen(labels)

    def live():
        for path, labels in paths.items():
            stats = cache.read(path)
            if stats is not None:
                yield labels, stats

    collector = OomwatchCollector(store, live, lambda: NodeInfo("6.1.0", "2", "false"),
                                  cgroup_parse_errors=lambda: fs.parse_errors)
    times = []
    for _ in range(samples + 1):
        t0 = time.process_time()
        for _chunk in collector.metrics("")[1]:
            pass
        times.append(time.process_time() - t0)
    cache.close()
    return statistics.median(times[1:])


def node_exporter_scrape(tmp: Path, workloads: list[Path], samples: int) -> float:
    textfiles = tmp / "textfiles"
    make_textfiles(textfiles, workloads)
    port = free_port()
    proc = subprocess.Popen([ensure_node_exporter(), "--collector.disable-defaults", "--collector.textfile",
                             f"--collector.textfile.directory={textfiles}",
                             f"--web.listen-address=127.0.0.1:{port}", "--web.disable-exporter-metrics"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while True:
            try:
                fetch(url)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        cpu, _, body = scrape_cpu(proc.pid, url, samples)
        assert body.count(b"oomwatch_memory_usage_bytes{") == len(workloads), "node_exporter skipped files"
        return cpu
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(textfiles, ignore_errors=True)


def bench_scrape(sizes: list[int], samples: int) -> list[dict]:
    rows = []
    for containers in sizes:
        tmp = Path(scratch_dir())
        try:
            tree = tmp / "cgroup"
            workloads = make_tree(tree, containers)
            files = tmp / "paths.txt"
            files.write_text("".join(f"{cg}/{name}\n" for cg in workloads for name in FILES))
            floor = build_floor(tmp)
            out = subprocess.run([str(floor), str(files), str(max(samples, 5))], check=True,
                                 capture_output=True, text=True).stdout.split()
            floor_cpu = int(out[0]) / 1e9
            n = samples if containers <= 4000 else max(3, samples // 2)
            agent = AgentProcess(tmp, tree)
            try:
                agent_cpu, agent_wall, body = scrape_cpu(agent.proc.pid, agent.url("/metrics"), n)
                series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
                row = {"containers": containers, "workload_cgroups": len(workloads), "files": int(out[1]),
                       "series": series, "body_mb": round(len(body) / 1e6, 2),
                       "agent_cpu_ms": round(agent_cpu * 1000, 1),
                       "agent_wall_ms": round(agent_wall * 1000, 1),
                       "start_saved_log_open_s": round(agent.opened_after or -1, 3),
                       "start_healthy_s": round(agent.healthy_after, 3),
                       "agent_rss_mib": round(status_kib(agent.proc.pid, "VmRSS") / 1024, 1)}
            finally:
                agent.stop()
            row["scrape_path_cpu_ms"] = round(in_process_scrape(tree, workloads, n) * 1000, 1)
            row["c_floor_cpu_ms"] = round(floor_cpu * 1000, 1)
            if containers <= NODE_EXPORTER_MAX_CONTAINERS:
                row["node_exporter_cpu_ms"] = round(node_exporter_scrape(tmp, workloads, n) * 1000, 1)
            for key in ("agent_cpu_ms", "scrape_path_cpu_ms", "node_exporter_cpu_ms"):
                if key in row:
                    ratio = row[key] / max(row["c_floor_cpu_ms"], 0.1)
                    row[key.replace("_cpu_ms", "_x_floor")] = round(ratio, 2)
            row["agent_us_per_container"] = round(row["agent_cpu_ms"] * 1000 / containers, 1)
            rows.append(row)
            print("scrape: " + ", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def bench_rss(containers: int = 2000, scrapes: int = 1000) -> dict:
    """The agent as it runs on a node: the live /dev/kmsg (so its reader process too) and a state directory.
    RSS of the agent process; its reader process's RSS and PSS (forked before the agent's imports, it shares
    most of its pages with it) are reported beside it."""
    tmp = Path(scratch_dir())
    try:
        tree = tmp / "cgroup"
        make_tree(tree, containers)
        agent = AgentProcess(tmp, tree, live=True, trace=False)
        try:
            pid = agent.proc.pid
            start_rss = status_kib(pid, "VmRSS")
            url = agent.url("/metrics")
            t0 = time.perf_counter()
            for _ in range(scrapes):
                fetch(url)
            elapsed = time.perf_counter() - t0
            children = [int(c) for task in os.listdir(f"/proc/{pid}/task")
                        for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            out = {"containers": containers, "scrapes": scrapes, "seconds": round(elapsed, 1),
                   "rss_at_start_mib": round(start_rss / 1024, 1),
                   "rss_after_mib": round(status_kib(pid, "VmRSS") / 1024, 1),
                   "peak_rss_mib": round(status_kib(pid, "VmHWM") / 1024, 1), "target_mib": 40,
                   "pss_after_mib": round(_pss_kib(pid) / 1024, 1)}
            if children:
                out["reader_rss_mib"] = round(status_kib(children[0], "VmRSS") / 1024, 1)
                out["reader_pss_mib"] = round(_pss_kib(children[0]) / 1024, 1)
            return out
        finally:
            agent.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_idle(containers: int = 1000, seconds: float = 60.0) -> dict:
    tmp = Path(scratch_dir())
    try:
        tree = tmp / "cgroup"
        make_tree(tree, containers)
        agent = AgentProcess(tmp, tree)
        try:
            pid = agent.proc.pid
            fetch(agent.url("/metrics"))
            time.sleep(2)  # the kernel log replayed, the scrape done
            switches, cpu = context_switches(pid), cpu_seconds(pid)
            time.sleep(seconds)
            return {"containers": containers, "seconds": seconds,
                    "wakeups": context_switches(pid) - switches,
                    "cpu_ms": round((cpu_seconds(pid) - cpu) * 1000),
                    "threads": len(os.listdir(f"/proc/{pid}/task")),
                    "target": 0}
        finally:
            agent.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_start(sizes: tuple[int, ...] = (1000, 4000)) -> list[dict]:
    """The real agent on the live /dev/kmsg (needs root or CAP_SYSLOG, and strace): exec to its first
    record read, and to /healthz 200."""
    rows = []
    for containers in sizes:
        tmp = Path(scratch_dir())
        try:
            tree = tmp / "cgroup"
            make_tree(tree, containers)
            agent = AgentProcess(tmp, tree, live=True)
            try:
                healthy = agent.healthy_after
            finally:
                agent.stop()
            rows.append({"containers": containers, "first_record_s": round(agent.first_record_after(), 3),
                         "healthy_s": round(healthy, 3)})
            print("start: " + ", ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return rows


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown")
    return {"cpu": model, "cores": os.cpu_count(), "kernel": os.uname().release,
            "python": sys.version.split()[0], "load_average": os.getloadavg()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("benches", nargs="*", help="pipeline, scrape, start, rss, idle (default: all)")
    parser.add_argument("--sizes", default="250,1000,4000,10000", help="containers per scrape run")
    parser.add_argument("--samples", type=int, default=5, help="scrape batches per size (median)")
    parser.add_argument("--rss-scrapes", type=int, default=1000)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--busy", action="store_true", help="keep the other core busy meanwhile")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    benches = args.benches or ["pipeline", "scrape", "start", "rss", "idle"]
    unknown = set(benches) - {"pipeline", "scrape", "start", "rss", "idle"}
    if unknown:
        parser.error(f"unknown benchmark {', '.join(sorted(unknown))}")
    busy = None
    if args.busy:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    results: dict = {"machine": machine(), "busy_core": args.busy}
    print("machine: " + json.dumps(results["machine"]), flush=True)
    try:
        if "pipeline" in benches:
            results["pipeline"] = bench_pipeline()
            print("pipeline: " + ", ".join(f"{k}={v}" for k, v in results["pipeline"].items()), flush=True)
        if "scrape" in benches:
            rows = bench_scrape([int(s) for s in args.sizes.split(",")], args.samples)
            results["scrape"] = rows
            for a, b in zip(rows, rows[1:]):
                added = b["containers"] - a["containers"]
                growth = {key: round((b[key] - a[key]) * 1000 / added, 1)
                          for key in ("agent_cpu_ms", "scrape_path_cpu_ms", "c_floor_cpu_ms")}
                results.setdefault("growth_us_per_added_container", []).append(
                    {"from": a["containers"], "to": b["containers"], **growth})
                print(f"growth {a['containers']} → {b['containers']}, µs CPU per added container: "
                      + ", ".join(f"{k.replace('_cpu_ms', '')}={v}" for k, v in growth.items()), flush=True)
        if "start" in benches:
            results["start"] = bench_start()
        if "rss" in benches:
            results["rss"] = bench_rss(scrapes=args.rss_scrapes)
            print("rss: " + ", ".join(f"{k}={v}" for k, v in results["rss"].items()), flush=True)
        if "idle" in benches:
            results["idle"] = bench_idle(seconds=args.idle_seconds)
            print("idle: " + ", ".join(f"{k}={v}" for k, v in results["idle"].items()), flush=True)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    results["machine"]["load_average_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
