"""What held the memory (issue 21) in real runc containers on the real kernel, with the agent running: runs INSIDE
the guest, imported by driver.py (its SCENARIOS). Each scenario polls its container's memory.stat until
memory.events shows the kill and keeps the last reading taken before it (`memory_stat_before_kill` in the ground
truth): tests/e2e/test_real_kernel.py compares the agent's incident with that reading and with the kernel's own
printed report.

  l_holders_pool    8 forked workers named pt_data_worker, each growing 1 MiB at a time to 24 MiB, in a 160 MiB
                    container with memory.oom.group=1: the pool fills the limit (verdict "pool").
  m_holders_shm     the container writes 96 MiB into a memory-medium emptyDir "dshm" at /dev/shm (a tmpfs under the
                    pod's volumes directory, as the kubelet mounts one), then an app allocates in the same 128 MiB
                    container (verdict "shmem": a restart will not free it; the sentence names the emptyDir).
  n_holders_writer  dd rewrites a 200 MiB file on an ext4 RAM disk mounted into the container while an app
                    allocates in the same 128 MiB container: the breakdown shows the page cache at the kill,
                    which the kernel has reclaimed almost whole by then (4 KiB in the runs of 2026-11-26, also
                    with the disk a loop device over a file of the 9p run directory, slow to write back).

The containers run Debian's /usr/bin/python3 from the guest's /usr, bind-mounted read-only (the busybox root has
no Python): the workers need to name themselves and grow slowly, which a busybox shell cannot do.
"""

from __future__ import annotations

import os
import subprocess
import time

import holders_capture as hc  # noqa: E402 (the guest directory is on sys.path)
from image_scenario import d  # driver.py, as loaded in the guest

PY = "/usr/bin/python3"
USR = [{"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]}]
DISK = "/run/holders-disk"


def python_in_container(script: str) -> list[str]:
    """Wait for the trigger, then run `script` with Debian's python3 (-I -S: nothing from outside /usr)."""
    assert "'" not in script
    return d.sh(f"{d.WAIT_FIFO}; exec {PY} -I -S -c '{script}'")


class StatWatch(hc.StatWatch):
    """holders_capture's watch, that also keeps the most page cache (`file`) any reading before the kill saw."""

    def __init__(self, cg: str):
        self.file_max = 0
        super().__init__(cg)

    def _run(self) -> None:
        while not self.stop.is_set():
            stat = hc.r(f"{self.cg}/memory.stat")
            now = time.monotonic()
            if hc.oom_kills(self.cg):
                self.kill_seen_at = now
                return
            self.last, self.last_at = stat, now
            for line in stat.splitlines():
                if line.startswith("file "):
                    self.file_max = max(self.file_max, int(line.split()[1]))
            time.sleep(hc.POLL_S)


class HeldMemory(d.Scenario):
    limit_mib = 128

    def prepare_rootfs(self) -> None:
        # /lib and /lib64 as Debian has them (links into /usr), so that python3's loader and libc are found
        for name in ("lib", "lib64"):
            link = os.path.join(self.rootfs, name)
            if not os.path.lexists(link):
                os.symlink(f"usr/{name}", link)
        os.makedirs(os.path.join(self.rootfs, "usr"), exist_ok=True)

    def act(self) -> None:
        watch = StatWatch(f"{d.CG}{self.hog.cgroup}")
        self.oom_and_observe(self.hog)
        watch.finish(5)
        self.gt["memory_stat_before_kill"] = {
            "text": watch.last,
            "ms_before_kill_seen": round((watch.kill_seen_at - watch.last_at) * 1000) if watch.kill_seen_at
            else None,
        }
        self.gt["limit_bytes"] = self.limit_mib << 20
        self.gt["file_bytes_max_before_kill"] = watch.file_max


class HoldersPool(HeldMemory):
    name = "l_holders_pool"
    description = ("a pool of 8 forked pt_data_worker processes, each growing to 24 MiB, in a 160 MiB container "
                   "with memory.oom.group=1: the pool fills the limit and the group dies")
    limit_mib = 160

    def setup(self):
        self.prepare_rootfs()
        p = self.pod("cgroupfs", "burstable", self.name, "train", "loader-0")
        self.gt["pod"] = p
        self.start_hog(p, "containerd", "loader", python_in_container(hc.POOL_LEADER), limit=self.limit_mib << 20,
                       procs=1, extra_mounts=USR)
        self.gt["expect"].update(verdict="pool", pool_comm="pt_data_worker", pool_processes=8)


class HoldersShm(HeldMemory):
    name = "m_holders_shm"
    description = ("the container fills 96 MiB of its own tmpfs, then allocates in its 128 MiB limit: tmpfs "
                   "pages stay charged, the app is killed")

    def setup(self):
        self.prepare_rootfs()
        p = self.pod("cgroupfs", "burstable", self.name, "train", "shm-0")
        self.gt["pod"] = p
        # A memory-medium emptyDir "dshm" at /dev/shm, as the kubelet makes one (the DataLoader's shared memory):
        # a tmpfs on the node under the pod's volumes directory, bound into the container.
        volume = f"/var/lib/kubelet/pods/{p['uid']}/volumes/kubernetes.io~empty-dir/dshm"
        os.makedirs(volume, exist_ok=True)
        if not os.path.ismount(volume):
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", volume], check=True)
        self.cleanup_mounts = [volume]
        fill = "dd if=/dev/zero of=/dev/shm/fill bs=1M count=96 2>/dev/null"
        self.start_hog(p, "containerd", "app",
                       d.sh(f"{d.WAIT_FIFO}; {fill}; exec {PY} -I -S -c '{hc.SLOW_APP.format(mib=200)}'"),
                       limit=self.limit_mib << 20, procs=1,
                       extra_mounts=USR + [{"destination": "/dev/shm", "type": "bind", "source": volume,
                                            "options": ["rbind", "rw"]}])
        self.gt["expect"].update(verdict="shmem", names='emptyDir "dshm" at /dev/shm')

    def finish(self):
        super().finish()
        # its 96 MiB stay in RAM while the tmpfs is mounted (the global OOM scenario after needs them): unmounted
        # here, the pages go with the container's own mount when the driver deletes it
        for volume in getattr(self, "cleanup_mounts", []):
            for name in os.listdir(volume):  # freed now, whoever still holds the mount
                os.remove(os.path.join(volume, name))
            subprocess.run(["umount", "-l", volume], check=False)


class HoldersWriter(HeldMemory):
    name = "n_holders_writer"
    description = ("dd rewrites a 200 MiB file on an ext4 RAM disk while an app allocates in the same 128 MiB "
                   "container: the page cache at the kill is in the breakdown")

    def setup(self):
        self.prepare_rootfs()
        if not os.path.ismount(DISK):
            subprocess.run(["modprobe", "brd", "rd_nr=1", "rd_size=307200"], check=True)  # 300 MiB, in KiB
            subprocess.run(["mkfs.ext4", "-q", "-F", "/dev/ram0"], check=True)
            os.makedirs(DISK, exist_ok=True)
            subprocess.run(["mount", "-t", "ext4", "/dev/ram0", DISK], check=True)
        p = self.pod("cgroupfs", "burstable", self.name, "train", "writer-0")
        self.gt["pod"] = p
        writer = hc.WRITER.format(path="/data/big")
        self.start_hog(p, "containerd", "writer",
                       d.sh(f"{d.WAIT_FIFO}; ( /usr/bin/nice -n 19 sh -c '{writer}' ) & sleep 3; "
                            f"exec {PY} -I -S -c '{hc.SLOW_APP.format(mib=200)}'"),
                       limit=self.limit_mib << 20, procs=1,
                       extra_mounts=USR + [{"destination": "/data", "type": "bind", "source": DISK,
                                            "options": ["rbind", "rw"]}])


# The writer is not in the main boot: there (the fresh-clone CI of 2026-11-26 13:03) its app did not reach the
# limit within the scenario's minute, and its RAM disk's 200 MiB stayed allocated, so the global OOM after it
# found no OOM either. The tier boots it alone (tests/e2e/test_real_kernel.py, writer_run), with the writer at
# nice 19 (Debian's /usr/bin/nice: the busybox root has none) so that the one vCPU goes to the app first.
SCENARIOS = [HoldersPool, HoldersShm]
ALONE = [HoldersWriter]
