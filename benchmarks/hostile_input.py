"""Worst cases for `inspect --kmsg` on a saved log (how long each takes and how much memory it needs), and for
the agent's state directory, events file and cgroup watcher (issue 19).

    .venv/bin/python benchmarks/hostile_input.py          # full sizes (1M lines, 50 MB lines, 20,000 cgroups)
    .venv/bin/python benchmarks/hostile_input.py 0.1      # a tenth of each
    .venv/bin/python benchmarks/hostile_input.py 1 agent  # only the agent's cases (or: kmsg)
    .venv/bin/python benchmarks/hostile_input.py 0.25 agent --before e534e78   # the watcher cases of that commit too
    .venv/bin/python benchmarks/hostile_input.py 1 input --before 40b15e4   # what a tenant's text does (issue 31)
    .venv/bin/python benchmarks/hostile_input.py 1 memory --before 40b15e4  # the agent's memory under attack (issue 31)

Each case is written to a temporary file and read, in a child process, by `build_report` (reader, correlator,
explanation; default --limit 20) and `render_text`, as `oomwatch inspect --kmsg FILE` does. Printed: seconds,
lines per second, the child's peak RSS (VmHWM), incidents found. Target: every case finishes, in time linear in its size (issue 10: a 1 MB comm of `(` took
1.2 s and 50 MB over 30 minutes; 1M `Killed process` lines did not finish in 300 s).

memory (issue 31 item 3): a real `oomwatch agent` on the golden tree replays a saved log (i) of 90 group kills
of 3,000 processes each, then 8 clients loop on /incidents for 10 s; (ii) of 200,000 memcg kills, with a state
directory and an events file. Printed: the agent's RSS and peak RSS (VmHWM), answers, replay time. Target: 128 MiB.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

KILL = ("[ {t}.000000] Memory cgroup out of memory: Killed process {pid} ({comm}) total-vm:1kB, anon-rss:1kB, "
        "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0\n")


def cases(scale: float) -> dict:
    n = max(1, int(1_000_000 * scale))
    big = max(1, int(50_000_000 * scale))
    return {
        "comm of 1 MB of '('": lambda: KILL.format(t=1, pid=1, comm="(" * max(1, int(1_000_000 * scale))).encode(),
        "comm of 50 MB": lambda: KILL.format(t=1, pid=1, comm="x" * big).encode(),
        "line of 50 MB without newline": lambda: b"[ 1.0] " + b"a" * big,
        "numbers of 5000 digits": lambda: KILL.format(t="9" * 5000, pid="9" * 5000, comm="x").encode() * 1000,
        "seq/usec of 2^64 (raw)": lambda: (f"6,{1 << 64},{1 << 64},-;x\n" * 1000).encode(),
        "invalid dates (Feb 29 2023, Feb 30)": lambda: (b"[Wed Feb 29 10:00:00 2023] x\nFeb 30 10:00:00 h kernel: x\n"
                                                         * 1000),
        "NUL bytes and invalid UTF-8": lambda: (b"\x00\xff\xfe[ 1.0] \x00\xc3(\n" * n),
        f"{n} lines of plain dmesg": lambda: b"".join(b"[ %d.000000] usb 1-1: new device\n" % i for i in range(n)),
        f"{n} single kills": lambda: "".join(KILL.format(t=i, pid=i + 2, comm="dd") for i in range(n)).encode(),
        f"one group kill listing {n // 10} processes": lambda: (
            "[ 1.000000] Tasks in /g are going to be killed due to memory.oom.group set\n"
            + "".join(KILL.format(t=1, pid=i + 2, comm="worker") for i in range(n // 10))).encode(),
    }


CHILD = """
import sys, time
sys.path.insert(0, {repo!r})
from oomwatch.config import Config
from oomwatch.inspect import build_report, render_text
start = time.perf_counter()
report = build_report(Config(kmsg={path!r}, boot_time=0.0), node_view=False, clock=lambda: 0.0, limit=20)
render_text(report)
elapsed = time.perf_counter() - start
peak_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(elapsed, peak_kib, (report["kmsg"] or {{}}).get("oom_reports", "error"))
"""


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    scale = float(args[0]) if args else 1.0
    only = args[1] if len(args) > 1 else None
    before = sys.argv[sys.argv.index("--before") + 1] if "--before" in sys.argv else None
    if only in (None, "kmsg"):
        kmsg_main(scale)
    if only in (None, "agent"):
        agent_main(scale, before)
    if only in (None, "input"):
        input_main(scale, before)
    if only in (None, "memory"):
        memory_main(scale, before)
    return 0


def kmsg_main(scale: float) -> None:
    print(f"{'case':<42} {'MB':>7} {'s':>8} {'lines/s':>10} {'peak RSS MiB':>12} {'incidents':>9}", flush=True)
    for name, make in cases(scale).items():
        data = make()
        with tempfile.NamedTemporaryFile(suffix=".log", delete=False) as f:
            f.write(data)
            path = f.name
        lines = data.count(b"\n") or 1
        size_mb = len(data) / 1e6
        del data
        child = subprocess.Popen([sys.executable, "-c", CHILD.format(repo=str(REPO), path=path)],
                                 stdout=subprocess.PIPE, text=True)
        out = child.stdout.read() if child.stdout else ""
        child.wait()
        os.unlink(path)
        if child.returncode != 0:
            print(f"{name:<42} {size_mb:>7.1f} failed (exit {child.returncode})", flush=True)
            continue
        elapsed, peak_kib, found = out.split()
        print(f"{name:<42} {size_mb:>7.1f} {float(elapsed):>8.2f} {lines / float(elapsed):>10.0f} "
              f"{int(peak_kib) / 1024:>12.1f} {found:>9}", flush=True)


# --- the agent's state directory, events file and cgroup watcher (issue 19) ------------------------------------
#
# Each case prints what it measured and the outcome the agent acts on. Cases that need a filesystem of their own
# (read-only, full) mount a small tmpfs and are skipped when that is not allowed (not root). The watcher cases
# build a tree of cgroup-shaped directories in tmpfs (inotify behaves there as on cgroupfs for directories and
# IN_MODIFY; a real cgroupfs is not touched) and run the watcher in a child process; the out-of-watches case
# runs it in a user namespace whose own `user.max_inotify_watches` is set low, so the host's limit is never
# reached (watches in a user namespace also count against the host user's, so it is kept well below it).

FILES = ("memory.events", "cgroup.events", "memory.max", "memory.oom.group")


def _tmpfs(size: str) -> Optional[str]:
    where = tempfile.mkdtemp(prefix="oomwatch-bench-")
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", where],
                                           capture_output=True).returncode != 0:
        os.rmdir(where)
        return None
    return where


def _umount(where: str) -> None:
    subprocess.run(["umount", "-l", where], check=False)
    os.rmdir(where)


def _fill(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"x" * 65536):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.levels: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.levels.append(record.levelname)


def _said(run: Callable[[], Any]) -> tuple[Any, list[str]]:
    handler = _Lines()
    logger = logging.getLogger("oomwatch")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        return run(), handler.levels
    finally:
        logger.removeHandler(handler)


def _incident(n: int) -> dict:
    return {"boot_id": "b0", "kernel_seq": n, "victim": {"pid": 1000 + n}, "kind": "single", "cgroup": "/a"}


def state_too_large(scale: float) -> str:
    from oomwatch.statefile import MAX_STATE_BYTES, StateFile
    from oomwatch.store import Store

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "state.json")
        with open(path, "wb") as f:  # sparse: a 75.7 MB state like issue 19's, without writing 75.7 MB
            f.write(b'{"version":2')
            f.truncate(75_700_000)
        f_state = StateFile(d)
        f_state.lock()
        start = time.perf_counter()
        outcome, _ = f_state.load(Store(), "b0")
        took = time.perf_counter() - start
        try:
            f_state.save(Store(), {})
            saved = "written over (wrong)"
        except OSError:
            saved = "not written over"
        kept = os.path.getsize(path) == 75_700_000
        f_state.unlock()
    return (f"load {took * 1000:.1f} ms, cap {MAX_STATE_BYTES:,} B; outcome {outcome.split(':')[0]!r}; file kept "
            f"{kept}, {saved}")


def state_read_only(scale: float) -> str:
    from oomwatch.statefile import StateFile, StateLocked, save_state
    from oomwatch.store import Store

    root = _tmpfs("1m")
    if root is None:
        return "skipped (needs root to mount a tmpfs)"
    try:
        d = os.path.join(root, "state")
        store = Store()
        store.set_cursor("b0", 41)
        save_state(store, d)
        os.unlink(os.path.join(d, ".lock"))
        subprocess.run(["mount", "-o", "remount,ro", root], check=True)
        f_state = StateFile(d)
        start = time.perf_counter()
        f_state.lock()  # before: OSError "Read-only file system: …/.lock", the agent exited 1
        outcome, _ = f_state.load(Store(), "b0")
        try:
            f_state.save(Store(), {})
            save = "saved (wrong)"
        except OSError as exc:
            save = "save refused: read-only" if "Read-only file system" in str(exc) else f"save refused: {exc}"
        took = time.perf_counter() - start
        try:
            StateFile(d).lock()
            second = "second agent admitted (wrong)"
        except StateLocked:
            second = "second agent refused"
        f_state.unlock()
        return f"start {took * 1000:.1f} ms; outcome {outcome!r}; {save}; {second}"
    finally:
        _umount(root)


def state_full(scale: float) -> str:
    from oomwatch.statefile import StateFile, save_state
    from oomwatch.store import Store

    root = _tmpfs("256k")
    if root is None:
        return "skipped (needs root to mount a tmpfs)"
    try:
        d = os.path.join(root, "state")
        save_state(Store(), d)
        f_state = StateFile(d)
        f_state.lock()
        f_state.load(Store(), "unknown")
        _fill(os.path.join(root, "filler"))
        failures = 0
        start = time.perf_counter()
        for _ in range(100):  # a second's saves of a storm, a hundred times over
            try:
                f_state.save(Store(), {})
            except OSError:
                failures += 1
        took = time.perf_counter() - start
        temps = [n for n in os.listdir(d) if n.startswith(".state-")]
        os.unlink(os.path.join(root, "filler"))
        f_state.save(Store(), {})
        f_state.unlock()
        return (f"100 saves on a full disk: {failures} failed in {took * 1000:.1f} ms, {len(temps)} temp files left; "
                f"saving again after space is freed: {f_state.saving}")
    finally:
        _umount(root)


def events_fifo(scale: float) -> str:
    from oomwatch.sinks.events import EventsFile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "events.jsonl")
        os.mkfifo(path)
        events = EventsFile(path)
        start = time.perf_counter()
        events.open()  # before: open(2) waited for a reader for ever, before the port opened
        took = time.perf_counter() - start
        events.write(_incident(1))
        events.close()
        return f"open returned in {took * 1000:.2f} ms; failing: {events.failing!r}"[:160]


def events_symlink(scale: float) -> str:
    from oomwatch.sinks.events import EventsFile

    with tempfile.TemporaryDirectory() as d:
        decoy = os.path.join(d, "decoy")
        with open(decoy, "w") as f:
            f.write("precious\n")
        path = os.path.join(d, "events.jsonl")
        os.symlink(decoy, path)
        events = EventsFile(path)
        events.open()
        for n in range(100):
            events.write(_incident(n))
        events.close()
        return f"decoy {os.path.getsize(decoy)} bytes after 100 incidents (9 before); errors {events.errors}"


def events_torn(scale: float) -> str:
    from oomwatch.sinks.events import EventsFile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "events.jsonl")
        with open(path, "wb") as f:
            f.write(json.dumps(_incident(0)).encode() + b"\n" + b'{"boot_id":"b0","kern')
        events = EventsFile(path)
        events.open()
        for n in range(1, 101):
            events.write(_incident(n))
        events.close()
        parsed = 0
        with open(path, "rb") as f:
            for line in f:
                try:
                    json.loads(line)
                    parsed += 1
                except ValueError:
                    pass
        return f"{parsed} of 101 incidents parse after a torn last line (before: 100, the first glued to it)"


def events_full(scale: float) -> str:
    from oomwatch.sinks.events import EventsFile

    root = _tmpfs("256k")
    if root is None:
        return "skipped (needs root to mount a tmpfs)"
    n = max(10, int(20_000 * scale))
    try:
        path = os.path.join(root, "events.jsonl")
        events = EventsFile(path)
        events.open()
        events.write(_incident(0))
        _fill(os.path.join(root, "filler"))
        start = time.perf_counter()
        _, levels = _said(lambda: [events.write(_incident(i)) for i in range(1, n + 1)])
        took = time.perf_counter() - start
        os.unlink(os.path.join(root, "filler"))
        _, after = _said(lambda: events.write(_incident(n + 1)))
        events.close()
        with open(path, "rb") as f:
            in_file = sum(1 for _ in f)
        return (f"{n:,} incidents on a full disk: {events.errors:,} not written, {len(levels)} log line(s) "
                f"({', '.join(levels)}), {took / n * 1e6:.1f} us each; writing again: {after}, {in_file:,} lines "
                f"in the file ({events.dropped:,} dropped: more than UNWRITTEN_KEPT waited)")
    finally:
        _umount(root)


WATCHER_CHILD = r"""
import importlib.util, json, logging, os, sys, time, threading
sys.path.insert(0, {repo!r})
source = {source!r}
if source:
    spec = importlib.util.spec_from_file_location("cgroupfs_under_test", source)
    cgroupfs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cgroupfs)
else:
    import oomwatch.sources.cgroupfs as cgroupfs
limit = {limit!r}
if limit:
    with open("/proc/sys/user/max_inotify_watches", "w") as f:
        f.write(str(limit))
levels = []
class Lines(logging.Handler):
    def emit(self, record):
        levels.append(record.levelname + ": " + record.getMessage()[:150])
logging.getLogger().addHandler(Lines())
logging.getLogger().setLevel(logging.INFO)
added, removed = [], []
watcher = cgroupfs.CgroupWatcher(cgroupfs.CgroupFS({tree!r}), on_added=added.append, on_removed=removed.append,
                                 on_events=lambda p: None)
start = time.process_time()
found = watcher.start_watching()
out = {{"found": len(found), "start_cpu_s": time.process_time() - start,
        "blind": getattr(watcher, "blind", "(no such attribute)"),
        "counts": watcher.unwatched_counts() if hasattr(watcher, "unwatched_counts") else None}}
thread = threading.Thread(target=watcher.run, daemon=True)
thread.start()
print("ready", flush=True)
expect = {expect_removed!r}
cpu0, wall0 = time.process_time(), time.monotonic()
while expect and len(removed) < expect and time.monotonic() - wall0 < {timeout!r}:
    time.sleep(0.05)
out.update(removed=len(removed), removal_cpu_s=time.process_time() - cpu0, removal_wall_s=time.monotonic() - wall0,
           known_after=len(watcher.known()), log=levels)
watcher.stop()
thread.join(5)
print(json.dumps(out), flush=True)
"""


def _tree(root: str, pods: int, per_pod: int) -> list[str]:
    """/kubepods/podI/cJ, each with the four watched files; the leaf paths."""
    leaves = []
    for i in range(pods):
        pod = os.path.join(root, "kubepods", f"pod{i:05d}")
        for j in range(per_pod):
            leaf = os.path.join(pod, f"c{j:03d}")
            os.makedirs(leaf)
            for name in FILES:
                with open(os.path.join(leaf, name), "w") as f:
                    f.write("0\n")
            leaves.append(leaf)
    return leaves


def _run_watcher(tree: str, source: Optional[str], limit: Optional[int], remove: list[str],
                 timeout: float = 600.0) -> dict:
    prefix = ["unshare", "-U", "-r"] if limit else []
    script = WATCHER_CHILD.format(repo=str(REPO), source=source, limit=limit, tree=tree,
                                  expect_removed=len(remove), timeout=timeout)
    child = subprocess.Popen(prefix + [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    for leaf in remove:  # as a runtime tears containers down (cgroupfs: rmdir alone; tmpfs: files first)
        for name in FILES:
            os.unlink(os.path.join(leaf, name))
        os.rmdir(leaf)
    out = json.loads(child.stdout.read().strip().splitlines()[-1])
    child.wait()
    return out


def _sources(before: Optional[str]) -> list[tuple[str, Optional[str]]]:
    sources: list[tuple[str, Optional[str]]] = [("now", None)]
    if before:
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{before}:oomwatch/sources/cgroupfs.py"],
                              capture_output=True, text=True, check=True).stdout
        fd, path = tempfile.mkstemp(suffix=".py", prefix="cgroupfs-before-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        sources.append((before, path))
    return sources


def watcher_out_of_watches(scale: float, before: Optional[str]) -> str:
    if subprocess.run(["unshare", "-U", "-r", "true"], capture_output=True).returncode != 0:
        return "skipped (needs unshare -U)"
    cgroups = max(100, int(20_000 * scale))
    # Issue 19: 192,536 watches for 100,002 cgroups (1.93 per cgroup); the same ratio here.
    limit = int(cgroups * 1.925)
    root = tempfile.mkdtemp(prefix="oomwatch-bench-tree-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    lines = []
    try:
        _tree(root, cgroups // 100, 100)
        total = cgroups + cgroups // 100 + 2
        for label, source in _sources(before):
            out = _run_watcher(root, source, limit, [])
            errors = [line for line in out["log"] if line.startswith("ERROR")]
            lines.append(f"[{label}] {total:,} cgroups, {limit:,} watches: reported {out['found']:,}; "
                         f"unwatched {out['counts']}; start {out['start_cpu_s']:.2f} s CPU; "
                         f"{len(errors)} ERROR line(s): {errors[0][:110] if errors else '-'}")
    finally:
        shutil.rmtree(root)
    return "\n    ".join(lines)


def watcher_removal(scale: float, before: Optional[str]) -> str:
    cgroups = max(100, int(20_000 * scale))
    lines = []
    for label, source in _sources(before):
        root = tempfile.mkdtemp(prefix="oomwatch-bench-tree-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        try:
            leaves = _tree(root, cgroups // 100, 100)
            remove = leaves[::2]
            out = _run_watcher(root, source, None, remove)
            overflows = sum("overflowed" in line for line in out["log"])
            lines.append(f"[{label}] removing {len(remove):,} of {cgroups:,}: {out['removed']:,} seen, watcher "
                         f"{out['removal_cpu_s']:.2f} s CPU ({out['removal_cpu_s'] / max(1, out['removed']) * 1e3:.3f}"
                         f" ms each), {out['removal_wall_s']:.1f} s wall, {overflows} queue overflow(s)")
        finally:
            shutil.rmtree(root)
    return "\n    ".join(lines)


def delegated_flood(scale: float) -> str:
    """Issue 31, item 1: one logged-in user makes 20,000 scopes with limits and hostile names under its
    user@1000.service (its directory and what is below owned by uid 1000, as systemd delegates it), then a pod
    starts. Printed: the agent's series, a scrape's size and time, whether the pod is exported, /healthz."""
    import urllib.error
    import urllib.request

    if os.geteuid() != 0:
        return "skipped (chown needs root)"
    sys.path.insert(0, str(REPO / "benchmarks"))
    from churn import FILES, free_port, get

    scopes = max(100, int(20_000 * scale))
    root = tempfile.mkdtemp(prefix="oomwatch-bench-deleg-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    work = tempfile.mkdtemp(prefix="oomwatch-bench-deleg-run-")

    def cgroup(path: str, owner: int = 0, limit: str = "max\n") -> str:
        os.makedirs(path, exist_ok=True)
        for name, text in {**FILES, "memory.max": limit}.items():
            with open(os.path.join(path, name), "w") as f:
                f.write(text)
        os.chown(path, owner, owner)
        return path

    Path(root, "cgroup.controllers").write_text("cpu memory pids\n")
    user = cgroup(os.path.join(root, "user.slice", "user-1000.slice", "user@1000.service"), 1000)
    app = cgroup(os.path.join(user, "app.slice"), 1000)
    for i in range(scopes):
        cgroup(os.path.join(app, f"x\u202e{i:05d}\x1b.scope"), 1000, "1073741824\n")
    kmsg = os.path.join(work, "boot.kmsg")  # a saved log with one line: a kernel log, healthy
    Path(kmsg).write_text("[    0.000000] Linux version 6.1.0 (benchmark)\n")
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "oomwatch", "agent", "--listen", f"127.0.0.1:{port}", "--kmsg", kmsg, "--cgroup-root",
         root, "--kube-api", "off", "--kubelet-config", os.path.join(work, "none.yaml"), "--run-root",
         os.path.join(work, "run"), "--pod-log-dir", os.path.join(work, "pods"), "--journal", "off"],
        cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while "starting" in (get(port, "/healthz", timeout=5.0) or "starting") and agent.poll() is None:
            time.sleep(0.1)
        pod = os.path.join(root, "kubepods", "burstable", "pod0f0e0d0c-0000-4000-8000-000000000001")
        cgroup(os.path.join(pod, "c" * 64), 0, "1073741824\n")
        deadline = time.monotonic() + 60
        body = ""
        while time.monotonic() < deadline and "c" * 64 not in body:
            time.sleep(0.5)
            start = time.perf_counter()
            body = get(port, "/metrics") or ""
            scrape_s = time.perf_counter() - start
        series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
            health = response.status
    except urllib.error.HTTPError as exc:
        health = exc.code
    finally:
        agent.terminate()
        agent.wait(30)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return (f"{scopes:,} scopes of uid 1000: {series:,} series, scrape {len(body) / 1e6:.2f} MB in {scrape_s:.2f} s, "
            f"pod started after them exported: {'c' * 64 in body}, /healthz {health}")


def statcache_forget(scale: float) -> str:
    from oomwatch.sources.cgroupfs import CgroupFS
    from oomwatch.sources.statcache import StatCache, _Entry

    figures = []
    for size in (1_000, max(1_000, int(100_000 * scale))):
        cache = StatCache(CgroupFS("/nonexistent"), max_open=0)
        for i in range(size):
            cache._entries[f"/pod{i}"] = _Entry()
        start = time.perf_counter()
        for i in range(0, 1000):
            cache.forget(f"/pod{i}")
        figures.append(f"{(time.perf_counter() - start):.4f} ms each at {size:,} cached")
    return "forget: " + "; ".join(figures)


# --- the agent's memory under attack (issue 31 item 3) ---------------------------------------------------------

GOLDEN = REPO / "fixtures" / "golden" / "k8s-runc"


def _kmsg_lines(messages: list[str]) -> str:
    """`messages` (after the golden log's boot) as /dev/kmsg records, numbered on, 10 ms apart."""
    boot = (GOLDEN / "kmsg").read_text().splitlines()[:565]
    seq = len(boot)
    out = ["\n".join(boot)]
    for i, message in enumerate(messages):
        out.append(f"3,{seq + i},{20_000_000 + i * 10_000},-;{message}")
    return "\n".join(out) + "\n"


def group_kills_kmsg(kills: int, processes: int) -> str:
    """The golden tree's group kill `kills` times over, each report listing `processes` killed processes."""
    report = [line.split(";", 1)[1] for line in (GOLDEN / "kmsg").read_text().splitlines()[565:619]]
    kill = report[-2].replace("127 (dd)", "{pid} (w{pid})")
    messages: list[str] = []
    for k in range(kills):
        messages += report
        messages += [kill.format(pid=10_000 + k * processes + i) for i in range(processes)]
    return _kmsg_lines(messages)


def single_kills_kmsg(kills: int) -> str:
    """`kills` memcg kills in the golden tree's pod, each its summary line and its Killed line."""
    lines = [line.split(";", 1)[1] for line in (GOLDEN / "kmsg").read_text().splitlines()[616:618]]
    messages: list[str] = []
    for i in range(kills):
        pid = 10_000 + i
        messages.append(lines[0].replace("pid=127,", f"pid={pid},"))
        messages.append(lines[1].replace("127 (dd)", f"{pid} (dd)"))
    return _kmsg_lines(messages)


class MeasuredAgent:
    """`oomwatch agent` on the golden tree with a saved kernel log, from `source` (a tree with an oomwatch
    package: another commit) or this one."""

    def __init__(self, kmsg: str, source: Optional[str], extra: list[str]) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        python = [sys.executable, "-c", "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' "
                  "not in repr(f)]; sys.path.insert(0, sys.argv.pop(1)); from oomwatch.cli import main; "
                  "sys.exit(main())", source or str(REPO)]
        self.proc = subprocess.Popen(
            [*python, "agent", "--listen", f"127.0.0.1:{self.port}", "--kube-api", "off", "--log-level", "error",
             "--boot-time", "2026-11-22T20:40:00Z", "--kmsg", kmsg, "--kubelet-config",
             str(GOLDEN / "kubelet" / "config.yaml"), "--cgroup-root", str(GOLDEN / "cgroup"), "--proc",
             str(GOLDEN / "proc"), "--run-root", str(GOLDEN / "run"), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def get(self, path: str) -> bytes:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("GET", path)
            return conn.getresponse().read()
        finally:
            conn.close()

    def records_read(self) -> float:
        for line in self.get("/metrics").decode().splitlines():
            if line.startswith("oomwatch_kmsg_records_total "):
                return float(line.split()[1])
        return -1.0

    def replayed(self, timeout: float = 1200.0) -> float:
        """Seconds until the kernel log's records read stop growing (3 s unchanged)."""
        started, last, same = time.monotonic(), -2.0, 0
        while time.monotonic() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited {self.proc.returncode}")
            try:
                now = self.records_read()
            except OSError:
                now = -2.0
            same = same + 1 if now == last and now > 0 else 0
            if same >= 6:
                return time.monotonic() - started - 3
            last = now
            time.sleep(0.5)
        raise RuntimeError("replay not done")

    def mib(self, key: str) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        from http_attacks import Agent  # (benchmarks/: the directory this script runs from)

        Agent.stop(self)  # type: ignore[arg-type]  (it stops self.proc)


def incidents_readers(scale: float, source: Optional[str]) -> str:
    """90 group kills of 3,000 processes, then 8 clients loop on /incidents for 10 s."""
    import threading

    kills, processes = max(1, int(90 * scale)), max(1, int(3000 * scale))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kmsg")
        with open(path, "w") as f:
            f.write(group_kills_kmsg(kills, processes))
        agent = MeasuredAgent(path, source, [])
        try:
            replay = agent.replayed()
            body = agent.get("/incidents")
            found, hwm_before = len(json.loads(body)), agent.mib("VmHWM")
            served = [0]
            until = time.monotonic() + 10

            def loop() -> None:
                while time.monotonic() < until:
                    served[0] += bool(agent.get("/incidents"))

            threads = [threading.Thread(target=loop) for _ in range(8)]
            for t in threads:
                t.start()
            rss = []
            while any(t.is_alive() for t in threads):
                rss.append(agent.mib("VmRSS"))
                time.sleep(0.2)
            return (f"{found} incidents, /incidents {len(body) / 1e6:.1f} MB; replay {replay:.0f} s, peak RSS "
                    f"{hwm_before:.0f} MiB; 8 readers: {served[0]} answers in 10 s, RSS max {max(rss):.0f} MiB, "
                    f"peak {agent.mib('VmHWM'):.0f} MiB")
        finally:
            agent.stop()


def replay_with_state(scale: float, source: Optional[str]) -> str:
    """200k kills replayed with a state directory and an events file."""
    kills = max(1, int(200_000 * scale))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kmsg")
        with open(path, "w") as f:
            f.write(single_kills_kmsg(kills))
        events = os.path.join(d, "events.jsonl")
        agent = MeasuredAgent(path, source, ["--state-dir", os.path.join(d, "state"), "--events-file", events])
        try:
            figures = [f"{kills:,} kills replayed in {agent.replayed():.0f} s"]
            with open(events, "rb") as lines:
                figures.append(f"{sum(1 for _ in lines):,} events lines")
            state = os.path.getsize(os.path.join(d, "state", "state.json"))
            figures.append(f"state.json {state / 1e6:.1f} MB; RSS {agent.mib('VmRSS'):.0f} MiB, peak "
                           f"{agent.mib('VmHWM'):.0f} MiB")
            return ", ".join(figures)
        finally:
            agent.stop()


def _this_and(before: Optional[str], old: str) -> list[tuple[Optional[str], str]]:
    """(source, label) of this tree and, with `before`, of that commit's oomwatch package unpacked under `old`."""
    if before is None:
        return [(None, "this tree")]
    archive = subprocess.run(["git", "-C", str(REPO), "archive", before, "oomwatch"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
    return [(None, "this tree"), (old, before)]


def memory_main(scale: float, before: Optional[str]) -> None:
    print(f"# load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as old:
        sources = _this_and(before, old)
        for name, case in (("8 readers of /incidents after group kills", incidents_readers),
                           ("replay of kills, state dir and events file", replay_with_state)):
            for source, label in sources:
                start = time.perf_counter()
                result = case(scale, source)
                print(f"{name} ({label}): {result}  [{time.perf_counter() - start:.1f} s]", flush=True)


def agent_main(scale: float, before: Optional[str]) -> None:
    logging.getLogger("oomwatch").addHandler(logging.NullHandler())  # each case counts the lines it cares about
    cases: list[tuple[str, Callable[[], str]]] = [
        ("state.json of 75.7 MB (over the read cap)", lambda: state_too_large(scale)),
        ("state directory read-only", lambda: state_read_only(scale)),
        ("state directory full", lambda: state_full(scale)),
        ("events file a FIFO with no reader", lambda: events_fifo(scale)),
        ("events file a symlink to a decoy", lambda: events_symlink(scale)),
        ("events file with a torn last line", lambda: events_torn(scale)),
        ("events file on a full disk", lambda: events_full(scale)),
        ("watcher out of inotify watches", lambda: watcher_out_of_watches(scale, before)),
        ("watcher removal cost", lambda: watcher_removal(scale, before)),
        ("stat cache removal cost", lambda: statcache_forget(scale)),
        ("20,000 hostile scopes of one user, then a pod", lambda: delegated_flood(scale)),
    ]
    for name, case in cases:
        start = time.perf_counter()
        result = case()
        print(f"{name:<44} {result}  [{time.perf_counter() - start:.1f} s]", flush=True)


# --- what a tenant's text does to what people read (issue 31: items 5, 7, 9) ----------------------------------
#
# Each case runs `oomwatch` (this tree, and with --before that commit's package) in a child process on input a
# tenant controls: the figure is what a person or Prometheus then gets, and how long it took.

INPUT_CHILD_TIMEOUT = 60.0


def _oomwatch(source: Optional[str], args: list[str], timeout: float = INPUT_CHILD_TIMEOUT) -> tuple[int, str, str,
                                                                                                       float]:
    """(exit status, stdout, stderr, seconds) of `python -m oomwatch ARGS` from `source` (None: this tree); exit
    status -9 when it was still running after `timeout` s and was killed."""
    env = dict(os.environ, PYTHONPATH=source or str(REPO), COLUMNS="100")
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "oomwatch", *args], env=env, capture_output=True,
                              timeout=timeout, cwd=source or REPO)  # (-m puts the working directory first)
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = -9, exc.stdout or b"", exc.stderr or b""
    return (code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), time.perf_counter() - start)


def _said(code: int, err: str, took: float) -> str:
    if code == -9:
        return f"still running after {took:.0f} s (killed)"
    traceback = err.splitlines()[-1][:70] if "Traceback" in err else None
    last = (err.strip().splitlines() or [""])[-1][:90]
    return (f"exit {code} in {took:.1f} s" + (f", traceback: {traceback}" if traceback else f": {last}" if last
                                                 else ""))


def _golden_incident() -> dict:
    incident = json.loads((REPO / "fixtures/golden/k8s-runc/expected-incidents.json").read_text())[0]
    incident["workload"]["job"] = {"kind": "JobSet", "name": "train"}
    return incident


def job_wrong_types(scale: float, source: Optional[str], tmp: str) -> str:
    """`inspect --job` on an events file of N records, every tenth of a wrong type (a string where an object is)."""
    n = max(10, int(10_000 * scale))
    good = _golden_incident()
    lines = []
    for i in range(n):
        record = json.loads(json.dumps(good))
        if i % 10 == 0:
            record["killed"] = {"pid": i} if i % 20 else "dd"
        lines.append(json.dumps(record))
    path = os.path.join(tmp, "events.jsonl")
    Path(path).write_text("\n".join(lines) + "\n")
    code, out, err, took = _oomwatch(source, ["inspect", "--cgroup-root", tmp, "--job", "train", "--incidents",
                                              path, "--no-color"])
    note = next((line.strip() for line in out.splitlines() if "wrong type" in line), "")
    return _said(code, err, took) + (f"; note: {note[:60]}…" if note else "")


def job_deep_json(scale: float, source: Optional[str], tmp: str) -> str:
    """`inspect --job` on an events file whose one line is 100,000 `[` deep."""
    path = os.path.join(tmp, "deep.jsonl")
    Path(path).write_text("[" * 100_000 + "]" * 100_000 + "\n" + json.dumps(_golden_incident()) + "\n")
    code, _, err, took = _oomwatch(source, ["inspect", "--cgroup-root", tmp, "--job", "train", "--incidents",
                                            path, "--no-color"])
    return _said(code, err, took)


def job_trickling_url(scale: float, source: Optional[str], tmp: str) -> str:
    """`inspect --job --incidents URL` against a server that sends one byte every 5 s."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.5)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"[" * 100_000:
                if stop.wait(5.0):
                    break
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    break
            conn.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        code, _, err, took = _oomwatch(source, ["inspect", "--cgroup-root", tmp, "--job", "train", "--incidents",
                                                url, "--no-color"])
    finally:
        stop.set()
        server.join()
        listener.close()
    return _said(code, err, took)


def terminal_escapes(scale: float, source: Optional[str], tmp: str) -> str:
    """`inspect --no-color` on a real capture whose killed process is named `\\x1b]0;PWNED\\x07` and whose cgroup
    carries an OSC 52 clipboard write, escaped as /dev/kmsg escapes them: control bytes in the output."""
    import re

    text = (REPO / "fixtures/kmsg/linux-6.1-systemd-units.kmsg").read_bytes()
    text = re.sub(rb"(?<=[ =(])dd(?=[ ,)\n])", lambda m: rb"\x1b]0;PWNED\x07\xc2\x9b", text)
    text = text.replace(b"oomtest-hog.service", rb"oomtest-hog\x1b]52;c;cHduZWQ=\x07.service")
    path = os.path.join(tmp, "hostile.kmsg")
    Path(path).write_bytes(text)
    code, out, err, took = _oomwatch(source, ["inspect", "--kmsg", path, "--boot-time", "2026-01-01T00:00:00",
                                              "--no-color"])
    sent = len(re.findall("[\x00-\x09\x0b-\x1f\x7f-\x9f]", out))
    return f"{sent} control characters sent to the terminal ({out.count(chr(0x1b))} ESC), " + _said(code, err, took)


JOB_INFO_CHILD = """
import sys
sys.path.insert(0, {source!r})
from oomwatch.model import CgroupStats, Workload
from oomwatch.sinks.collector import NodeInfo, OomwatchCollector
from oomwatch.store import Store
huge = "a" * 150_000 + "\\x00\\x1b]52;c;cHduZWQ=\\x07" + "b" * 150_000
rows, live, store = [], [], Store()
for i in range({pods}):
    labels = ("ml", f"train-{{i}}", "", "")
    w = Workload(type="k8s-pod", cgroup=f"/kubepods/pod{{i}}", namespace="ml", pod=f"train-{{i}}",
                 owner={{"kind": "Job", "name": huge + str(i)}})
    rows.append((w.cgroup, labels, w))
    store.seen(labels)
    live.append((labels, CgroupStats(path=w.cgroup, oom_group=1, events={{}}, limit_bytes=1.0, usage_bytes=1)))
body = OomwatchCollector(store, lambda: live, lambda: NodeInfo("6.1", "2", "false"),
                         workloads=lambda: rows).exposition()
lines = [line for line in body.split(b"\\n") if line.startswith(b"oomwatch_workload_job_info")]
print(len(body), max(map(len, lines)), sum(line.count(b"\\x1b") + line.count(b"\\x00") for line in lines))
"""


def job_info_owner_name(scale: float, source: Optional[str], tmp: str) -> str:
    """A scrape of pods whose ownerReference name is 300,000 characters with NUL and ESC (10 pods at scale 1)."""
    pods = max(1, int(10 * scale))
    done = subprocess.run([sys.executable, "-c", JOB_INFO_CHILD.format(source=source or str(REPO), pods=pods)],
                          capture_output=True, text=True, timeout=INPUT_CHILD_TIMEOUT)
    if done.returncode != 0:
        return f"failed: {done.stderr.strip().splitlines()[-1][:80]}"
    size, line, controls = map(int, done.stdout.split())
    return f"{pods} pods: /metrics {size / 1e6:.2f} MB, job_info line {line:,} bytes, {controls} NUL/ESC bytes"


def input_main(scale: float, before: Optional[str]) -> None:
    print(f"# load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as old:
        sources = _this_and(before, old)
        for name, case in (("inspect --job, every 10th record a wrong type", job_wrong_types),
                           ("inspect --job, a line 100,000 deep", job_deep_json),
                           ("inspect --job, a URL sending 1 byte / 5 s", job_trickling_url),
                           ("inspect --no-color, a hostile comm and cgroup", terminal_escapes),
                           ("job_info, a 300,000-character owner name", job_info_owner_name)):
            for source, label in sources:
                with tempfile.TemporaryDirectory() as tmp:
                    print(f"{name} ({label}): {case(scale, source, tmp)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
