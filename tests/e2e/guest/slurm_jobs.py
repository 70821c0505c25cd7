"""What the Slurm scenario's jobs run (tests/e2e/guest/slurm.py), as the job's user with the guest's python3:

  hog MIB            allocate MIB MiB, 1 MiB at a time (each byte written: resident, charged to the cgroup)
  tasks MIB SECONDS  Slurm task 0 is a hog of MIB MiB, every other task sleeps SECONDS and says so
  workers N MIB SECONDS  fork N workers (named worker0..), each allocates MIB MiB then sleeps SECONDS; the
                     parent waits for them and prints how each ended
"""

from __future__ import annotations

import os
import sys
import time


def hog(mib: int) -> None:
    chunks = []
    for _ in range(mib):
        chunks.append(b"\1" * (1 << 20))
        time.sleep(0.005)
    print(f"hog: {mib} MiB allocated and not killed", flush=True)


def worker(index: int, mib: int, seconds: float) -> None:
    with open("/proc/self/comm", "w") as f:  # what the kernel names in its kill line
        f.write(f"worker{index}")
    hog(mib)
    time.sleep(seconds)


def main() -> int:
    mode, args = sys.argv[1], [float(a) for a in sys.argv[2:]]
    if mode == "hog":
        hog(int(args[0]))
    elif mode == "tasks":
        task = os.environ.get("SLURM_PROCID", "?")
        if task == "0":
            hog(int(args[0]))
        else:
            time.sleep(args[1])
            print(f"task {task}: slept {args[1]:.0f} s", flush=True)
    elif mode == "workers":
        pids = {}
        for i in range(int(args[0])):
            pid = os.fork()
            if pid == 0:
                worker(i, int(args[1]), args[2])
                os._exit(0)
            pids[pid] = i
        for _ in pids:
            pid, status = os.wait()
            how = f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else "exited"
            print(f"worker{pids[pid]} (pid {pid}) {how}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
