"""Worst cases for `inspect --kmsg` on a saved log: how long each takes and how much memory it needs.

    .venv/bin/python benchmarks/hostile_input.py          # full sizes (1M lines, 50 MB lines)
    .venv/bin/python benchmarks/hostile_input.py 0.1      # a tenth of each

Each case is written to a temporary file and read, in a child process, by `build_report` (reader, correlator,
explanation; default --limit 20) and `render_text`, as `oomwatch inspect --kmsg FILE` does. Printed: seconds,
lines per second, the child's peak RSS (VmHWM), incidents found. Target: every case finishes, in time linear in its size (issue 10: a 1 MB comm of `(` took
1.2 s and 50 MB over 30 minutes; 1M `Killed process` lines did not finish in 300 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

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
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
