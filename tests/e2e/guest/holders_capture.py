#!/usr/bin/env python3
"""What held the memory at a memcg OOM kill (issue 21), captured from the real kernel. Runs as root INSIDE the
VM (scripts/capture-holders boots it); writes to --out:

  kmsg.raw            every /dev/kmsg record of the boot, raw (`PRI,SEQ,USEC,FLAG;text`)
  memory-events.txt   each scenario cgroup's memory.events after its kill (`== <cgroup> procs=N` headers)
  memory-stat.txt     each scenario cgroup's memory.stat as last read before the kill (`== <cgroup>` headers,
                      with how many ms before the kill was seen)

Scenarios (plain cgroups, no runtime: the kernel's report is what is captured):
  pool    8 forked workers named pt_data_worker, each growing to 24 MiB, in a 160 MiB cgroup with
          memory.oom.group=1: the pool, not one process, fills the limit; all 8 die.
  shm     a filler writes 96 MiB into a tmpfs (as /dev/shm is) and exits; then an app allocates 64 MiB in the
          same 128 MiB cgroup: the tmpfs pages stay charged, the app is killed.
  single  one process allocates 200 MiB in a 64 MiB cgroup (the 6.1 capture's scenario a).
  locked  a process locks 64 MiB (mlockall), then another allocates in the same 96 MiB cgroup: unevictable
          pages fill the limit (pinned host memory on GPU nodes is the same to the kernel).
  writer  dd rewrites a 200 MiB file on ext4 (on a brd ramdisk, whose own pages no cgroup is charged for)
          while an app allocates in the same 128 MiB cgroup. What it showed (a RAM disk writes back at once):
          the file pages are reclaimed as fast as they are written, 172 KiB remain at the kill.
Run with --only to pick some: fixtures/kmsg/linux-6.12-holders.kmsg ran pool,shm,single and
linux-6.12-holders-locked-writer.kmsg ran locked,writer.

memory.stat is polled every POLL_S while a scenario runs, and the last reading taken while memory.events still
showed no oom_kill is kept: the reaper frees the victim's anonymous memory right after the kill, so a reading
taken after it is not the state at the kill (docs/kernel-facts.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

CG = "/sys/fs/cgroup"
POLL_S = 0.02
MIB = 1 << 20

POOL_LEADER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None)
def name(comm):
    libc.prctl(15, comm.encode(), 0, 0, 0)  # PR_SET_NAME: the name column of the task table
name("pool_leader")
pids = []
for i in range(8):
    pid = os.fork()
    if pid == 0:
        name("pt_data_worker")
        held = []
        for _ in range(24):
            held.append(bytearray(1 << 20))  # 1 MiB at a time, touched, so every worker grows together
            time.sleep(0.15)
        time.sleep(60)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
"""

SHM_FILLER = "dd if=/dev/zero of={path} bs=1M count=96 2>/dev/null; sync"
APP = "import time; held = [bytearray(1 << 20) for _ in range({mib})]; time.sleep(60)"
# grows by 1 MiB every 20 ms, so that the writer keeps writing while memory fills
SLOW_APP = ("import time\nheld = []\nfor _ in range({mib}):\n"
            "    held.append(bytearray(1 << 20)); time.sleep(0.02)")
LOCKER = r"""
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
if libc.mlockall(3) != 0:  # MCL_CURRENT | MCL_FUTURE
    raise SystemExit(f"mlockall: errno {ctypes.get_errno()}")
held = [bytearray(1 << 20) for _ in range(64)]
open("/run/holders-locked", "w").close()
time.sleep(60)
"""
WRITER = "while :; do dd if=/dev/zero of={path} bs=1M count=200 conv=notrunc 2>/dev/null; done"


def w(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def r(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def oom_kills(cg: str) -> int:
    for line in r(f"{cg}/memory.events").splitlines():
        k, _, v = line.partition(" ")
        if k == "oom_kill":
            return int(v)
    return 0


def spawn(cg: str, argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, preexec_fn=lambda: w(f"{cg}/cgroup.procs", os.getpid()))


class StatWatch:
    """Polls a cgroup's memory.stat until memory.events shows a kill; keeps the last reading before it."""

    def __init__(self, cg: str):
        self.cg, self.last, self.last_at, self.kill_seen_at = cg, "", 0.0, 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            stat = r(f"{self.cg}/memory.stat")
            now = time.monotonic()
            if oom_kills(self.cg):
                self.kill_seen_at = now
                return
            self.last, self.last_at = stat, now
            time.sleep(POLL_S)

    def finish(self, timeout: float) -> None:
        self.thread.join(timeout)
        self.stop.set()


def setup(cg: str, limit_mib: int, group: int) -> str:
    path = f"{CG}/{cg}"
    os.makedirs(path, exist_ok=True)
    w(f"{path}/memory.max", limit_mib * MIB)
    w(f"{path}/memory.swap.max", 0)
    w(f"{path}/memory.oom.group", group)
    return path


def scenario_pool() -> tuple[str, StatWatch]:
    cg = setup("pool", 160, 1)
    watch = StatWatch(cg)
    leader = spawn(cg, [sys.executable, "-c", POOL_LEADER])
    watch.finish(120)
    leader.wait(60)
    return cg, watch


def scenario_shm() -> tuple[str, StatWatch]:
    cg = setup("shm", 128, 0)
    shm = "/run/holders-shm"
    os.makedirs(shm, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", shm], check=True)
    spawn(cg, ["sh", "-c", SHM_FILLER.format(path=f"{shm}/fill")]).wait(120)
    watch = StatWatch(cg)
    app = spawn(cg, [sys.executable, "-c", APP.format(mib=64)])
    watch.finish(120)
    app.wait(60)
    return cg, watch


def scenario_single() -> tuple[str, StatWatch]:
    cg = setup("single", 64, 0)
    watch = StatWatch(cg)
    app = spawn(cg, [sys.executable, "-c", APP.format(mib=200)])
    watch.finish(120)
    app.wait(60)
    return cg, watch


def scenario_locked() -> tuple[str, StatWatch]:
    cg = setup("locked", 96, 0)
    locker = spawn(cg, [sys.executable, "-c", LOCKER])
    deadline = time.monotonic() + 60
    while not os.path.exists("/run/holders-locked") and time.monotonic() < deadline and locker.poll() is None:
        time.sleep(0.1)
    watch = StatWatch(cg)
    app = spawn(cg, [sys.executable, "-c", APP.format(mib=200)])
    watch.finish(120)
    for p in (app, locker):
        if p.poll() is None:
            p.kill()
        p.wait(60)
    return cg, watch


def scenario_writer() -> tuple[str, StatWatch]:
    cg = setup("writer", 128, 0)
    subprocess.run(["modprobe", "brd", "rd_nr=1", "rd_size=307200"], check=True)  # 300 MiB, in KiB
    subprocess.run(["mkfs.ext4", "-q", "-F", "/dev/ram0"], check=True)
    os.makedirs("/run/holders-disk", exist_ok=True)
    subprocess.run(["mount", "-t", "ext4", "/dev/ram0", "/run/holders-disk"], check=True)
    writer = subprocess.Popen(["sh", "-c", WRITER.format(path="/run/holders-disk/big")],
                              start_new_session=True, preexec_fn=lambda: w(f"{cg}/cgroup.procs", os.getpid()))
    time.sleep(3)  # the file is being written before the app starts
    watch = StatWatch(cg)
    app = spawn(cg, [sys.executable, "-c", SLOW_APP.format(mib=200)])
    watch.finish(120)
    app.wait(60)
    os.killpg(writer.pid, signal.SIGKILL)  # the loop and its dd
    writer.wait(60)
    return cg, watch


SCENARIOS = {"pool": scenario_pool, "shm": scenario_shm, "single": scenario_single, "locked": scenario_locked,
             "writer": scenario_writer}


def dump_kmsg(path: str) -> None:
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    with open(path, "wb") as out:
        while True:
            try:
                b = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:
                out.write(b"#EPIPE\n")
                continue
            out.write(b if b.endswith(b"\n") else b + b"\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="pool,shm,single",
                    help="scenarios, comma-separated: " + ",".join(SCENARIOS))
    a = ap.parse_args()
    w(f"{CG}/cgroup.subtree_control", "+memory")
    w("/proc/sys/vm/oom_dump_tasks", 1)
    events, stats = [], []
    for run in (SCENARIOS[name] for name in a.only.split(",")):
        cg, watch = run()
        time.sleep(1)
        name = cg[len(CG) + 1:]
        procs = len(r(f"{cg}/cgroup.procs").split())
        events.append(f"== {name} procs={procs}\n{r(f'{cg}/memory.events')}")
        before = (watch.kill_seen_at - watch.last_at) * 1000 if watch.kill_seen_at else -1
        stats.append(f"== {name} read {before:.0f} ms before the kill was seen\n{watch.last}")
        print(f"{name}: oom_kill={oom_kills(cg)} procs={procs} stat read {before:.0f} ms before", flush=True)
    with open(f"{a.out}/memory-events.txt", "w") as f:
        f.write("".join(events))
    with open(f"{a.out}/memory-stat.txt", "w") as f:
        f.write("".join(stats))
    dump_kmsg(f"{a.out}/kmsg.raw")
    print(os.uname().release, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
