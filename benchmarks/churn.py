"""Cgroup churn and start: what removing cgroups costs the running agent in CPU seconds, and how soon its port
answers (issue 31, items 2 and 12; issue 30, item 4).

    .venv/bin/python benchmarks/churn.py            # 20,000 cgroups, 10,000 removed, 1,000 a second
    .venv/bin/python benchmarks/churn.py 0.25       # a quarter of each
    .venv/bin/python benchmarks/churn.py 1 --rate 50          # removals paced slower (each its own wake-up)
    .venv/bin/python benchmarks/churn.py 1 --rate 0           # removals unpaced (the queue overflows)
    .venv/bin/python benchmarks/churn.py 1 --before 3d0f9bb   # the same run on that commit's tree too
    .venv/bin/python benchmarks/churn.py 5 --start-only       # 100,000 cgroups: the start alone

A tree of cgroup-shaped directories (/kubepods/podNNNNN/cNNN, each a workload with the four watched files) is
built in /dev/shm (inotify behaves there as on cgroupfs for directories and IN_MODIFY), `oomwatch agent` runs on
it as a child process (an empty saved kernel log, no API server), and half of the leaves are removed as a
runtime tears containers down, RATE a second (a burst all at once overflows inotify's queue, and the one rescan
that follows hides what each removal costs). Printed: when the port first answered (wall time, and the agent's
CPU time then: wall time means little on a loaded machine) and when the tree was read (/healthz no longer
"starting"); the agent's CPU time (utime + stime from /proc/PID/stat) from the first removal until it has taken
them all (its CPU stops moving and a scrape shows the workloads left), per removal, the wall time, and how often
its inotify queue overflowed. Target: <= 5 s of CPU for 10,000 of 20,000 (it was 118 s: the whole view rebuilt
for every removal), the port answering within a second.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
RATE = 1000.0  # removals a second (0: as fast as the benchmark can)
FILES = {"memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
         "cgroup.events": "populated 0\nfrozen 0\n", "memory.max": "max\n", "memory.oom.group": "0\n"}


def tree(root: str, pods: int, per_pod: int) -> list[str]:
    """/kubepods/podI/cJ, each with the four watched files; the leaf paths."""
    leaves = []
    os.makedirs(root, exist_ok=True)
    Path(root, "cgroup.controllers").write_text("cpu memory pids\n")  # a cgroup v2 root with memory
    for i in range(pods):
        pod = os.path.join(root, "kubepods", f"pod{i:05d}")
        for j in range(per_pod):
            leaf = os.path.join(pod, f"c{j:03d}")
            os.makedirs(leaf)
            for name, text in FILES.items():
                with open(os.path.join(leaf, name), "w") as f:
                    f.write(text)
            leaves.append(leaf)
    return leaves


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str, timeout: float = 30.0) -> Optional[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
            return response.read().decode()
    except OSError as exc:
        body = getattr(exc, "read", None)
        return body().decode() if body is not None else None


def live_workloads(port: int) -> int:
    """Live workload cgroups a scrape shows (oomwatch_memory_limit_bytes: read from each live cgroup)."""
    text = get(port, "/metrics") or ""
    return len(set(re.findall(r'^oomwatch_memory_limit_bytes\{cgroup="(/kubepods/pod\d+/c\d+)"', text, re.M)))


def settle(pid: int, quiet: float = 1.5, timeout: float = 900.0) -> float:
    """Wait until the agent's CPU time stops moving for `quiet` seconds; returns it."""
    last, since, start = cpu_seconds(pid), time.monotonic(), time.monotonic()
    while time.monotonic() - start < timeout:
        time.sleep(0.25)
        now = cpu_seconds(pid)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


def run(repo: Path, cgroups: int, rate: float, start_only: bool = False) -> dict:
    root = tempfile.mkdtemp(prefix="oomwatch-churn-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    work = tempfile.mkdtemp(prefix="oomwatch-churn-run-")
    kmsg = os.path.join(work, "empty.kmsg")
    Path(kmsg).write_text("")
    port = free_port()
    log_path = os.path.join(work, "agent.log")
    try:
        leaves = tree(root, max(1, cgroups // 100), 100)
        started = time.monotonic()
        with open(log_path, "w") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "oomwatch", "agent", "--listen", f"127.0.0.1:{port}", "--kmsg", kmsg,
                 "--cgroup-root", root, "--kube-api", "off", "--kubelet-config", os.path.join(work, "none.yaml"),
                 "--run-root", os.path.join(work, "run"), "--pod-log-dir", os.path.join(work, "pods"),
                 "--journal", "off"],
                cwd=str(repo), stdout=log, stderr=subprocess.STDOUT)
        try:
            while get(port, "/healthz", timeout=1.0) is None and agent.poll() is None:
                time.sleep(0.05)
            port_s, port_cpu = time.monotonic() - started, cpu_seconds(agent.pid)
            while "starting" in (get(port, "/healthz", timeout=5.0) or "starting") and agent.poll() is None:
                time.sleep(0.05)
            ready_s = time.monotonic() - started
            before_cpu = settle(agent.pid)
            live_before = live_workloads(port)
            if start_only:
                return dict(cgroups=len(leaves), port_s=port_s, port_cpu=port_cpu, ready_s=ready_s,
                            start_cpu=before_cpu, live_before=live_before)
            remove = leaves[::2]
            cpu0, wall0 = cpu_seconds(agent.pid), time.monotonic()
            for n, leaf in enumerate(remove):  # as a runtime tears containers down (tmpfs: files first)
                for name in FILES:
                    os.unlink(os.path.join(leaf, name))
                os.rmdir(leaf)
                if rate:  # paced: one at a time, as jobs end, not one burst the inotify queue drops
                    time.sleep(max(0.0, wall0 + (n + 1) / rate - time.monotonic()))
            after_cpu = settle(agent.pid)
            wall = time.monotonic() - wall0
            live_after = live_workloads(port)
        finally:
            agent.terminate()
            agent.wait(30)
        text = Path(log_path).read_text(errors="replace")
        return dict(cgroups=len(leaves), removed=len(remove), port_s=port_s, port_cpu=port_cpu, ready_s=ready_s,
                    start_cpu=before_cpu, removal_cpu=after_cpu - cpu0, wall=wall, live_before=live_before,
                    live_after=live_after, overflows=text.count("queue overflowed"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def checkout(commit: str) -> Path:
    where = Path(tempfile.mkdtemp(prefix="oomwatch-churn-src-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scale", nargs="?", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=RATE)
    parser.add_argument("--before")
    parser.add_argument("--start-only", action="store_true", help="measure the start alone (try a scale of 5)")
    args = parser.parse_args()
    cgroups, rate, before = max(200, int(20_000 * args.scale)), args.rate, args.before
    trees: list[tuple[str, Path]] = [("now", REPO)]
    if before:
        trees.append((before, checkout(before)))
    for label, repo in trees:
        out = run(repo, cgroups, rate, args.start_only)
        started = (f"[{label}] {out['cgroups']:,} workload cgroups: port answers after {out['port_s']:.1f} s "
                   f"({out['port_cpu']:.2f} s of the agent's CPU), "
                   f"tree read after {out['ready_s']:.1f} s, start {out['start_cpu']:.1f} s CPU")
        if args.start_only:
            print(f"{started}; workloads on /metrics {out['live_before']:,}", flush=True)
            continue
        print(f"{started}; removing {out['removed']:,}: {out['removal_cpu']:.2f} s CPU "
              f"({out['removal_cpu'] / out['removed'] * 1e3:.3f} ms each), {out['wall']:.1f} s wall, "
              f"{out['overflows']} queue overflow(s); workloads on /metrics {out['live_before']:,} -> "
              f"{out['live_after']:,}", flush=True)
        if repo != REPO:
            shutil.rmtree(repo, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
