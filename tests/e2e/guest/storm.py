"""Guest side of the OOM storm (its own VM boot: tests/e2e/test_storm.py).

N kubelet-shaped container cgroups (`/kubepods/burstable/pod<uid>/<id>`, memory.max 24 MiB, memory.oom.group=1
as the kubelet asks since 1.28) each OOM R times in concurrent rounds: a `sleep` and a hog per cgroup per round,
all hogs released at once. The agent is SIGKILLed during round 2 and started again during round 3, on the
kernel's default 128 KiB ring buffer. The kernel's own memory.events of every cgroup is the ground truth.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import floorwatch  # noqa: E402 (this directory is on sys.path)
import __main__ as driver  # imported by tests/e2e/guest/driver.py, which runs as the guest's main script

CG, Scenario, cg_enable, hexid, jdump = driver.CG, driver.Scenario, driver.cg_enable, driver.hexid, driver.jdump
log, uid_for, wfile = driver.log, driver.uid_for, driver.wfile

CONTAINERS, ROUNDS = 30, 3  # the host's OOMWATCH_STORM_CONTAINERS/_ROUNDS come through settings.json
LIMIT = 24 << 20
HOG = ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"]


def agent_tree(pid: int) -> list[int]:
    """The agent and the processes it started (its kernel-log reader), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop(0))
        todo.extend(children.get(out[-1], ()))
    return out


def spawn_in(cgroup: str, argv: list[str]) -> subprocess.Popen:
    def enter() -> None:
        with open(f"{CG}{cgroup}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        # Not the driver's -1000 (then nothing in the cgroup could be killed, and the kernel would loop
        # printing OOM reports): what the kubelet gives a burstable container.
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(driver.kubelet_oom_score_adj("burstable", LIMIT)))

    return subprocess.Popen(argv, preexec_fn=enter, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


class Storm(Scenario):
    name = "j_storm"
    description = ("kubelet-shaped containers (24M, memory.oom.group=1; 30 x 3 unless the host says otherwise) "
                   "OOM in concurrent rounds; the agent SIGKILLed in round 2 and restarted in round 3")

    def setup(self):
        self.cgroups = []
        try:
            with open(os.path.join(self.ctx.out, "settings.json")) as f:
                sizes = json.load(f).get("storm", {})
        except (OSError, ValueError):
            sizes = {}
        self.floor_binary = sizes.get("floor")  # the C floor watcher, built by the host (tests/e2e/test_storm.py)
        self.containers_n = int(sizes.get("containers", CONTAINERS))
        self.rounds_n = int(sizes.get("rounds", ROUNDS))
        for i in range(self.containers_n):
            uid = uid_for(f"storm-{i}")
            pod = f"/kubepods/burstable/pod{uid}"
            cg_enable(pod)
            self.cleanup_cgroups.append(pod)
            cgroup = f"{pod}/{hexid(f'storm-{i}')}"
            os.makedirs(f"{CG}{cgroup}", exist_ok=True)
            wfile(f"{CG}{cgroup}/memory.max", LIMIT)
            wfile(f"{CG}{cgroup}/memory.swap.max", 0)
            wfile(f"{CG}{cgroup}/memory.oom.group", 1)
            self.cgroups.append(cgroup)
        self.gt["storm"] = {"containers": self.cgroups, "rounds": self.rounds_n,
                            "agent_cpu_weight": self.agent_as_deployed()}
        with open("/proc/sys/kernel/printk") as f:
            self.gt["storm"]["printk"] = f.read().strip()

    def agent_as_deployed(self) -> str | None:
        """The agent where its chart puts it: a Guaranteed pod of one CPU, whose cgroup the kubelet gives
        cpu.weight 39 (cpu shares 1024), beside burstable pods with no CPU request, which the kubelet gives its
        minimum (shares 2: cpu.weight 1). Without the cpu controller every hog in reclaim weighs as much as the
        agent on the guest's one vCPU, which no node the agent is deployed on does. Its restart starts it there
        too. Returns the agent's cgroup (None: the cpu controller could not be enabled; the agent stays put)."""
        pod = f"/kubepods/pod{uid_for('storm-agent')}"
        cgroup = f"{pod}/{hexid('storm-agent')}"
        try:
            wfile(f"{CG}/cgroup.subtree_control", "+cpu")
            wfile(f"{CG}/kubepods/cgroup.subtree_control", "+cpu")
            os.makedirs(f"{CG}{cgroup}", exist_ok=True)
            wfile(f"{CG}{pod}/cpu.weight", 39)
            wfile(f"{CG}/kubepods/burstable/cpu.weight", 1)
            for pid in agent_tree(self.ctx.agent.proc.pid) if self.ctx.agent.proc else ():
                wfile(f"{CG}{cgroup}/cgroup.procs", pid)
        except OSError as e:
            log(f"  storm: the agent stays in the driver's cgroup: {e}")
            return None
        self.ctx.agent.cgroup = cgroup
        return cgroup

    def forge(self) -> None:
        """Only the kernel may report a kill: what any process that can write /dev/kmsg writes is facility user
        (the kernel enforces it for userspace writes), and the agent must reject it."""
        forged = ("<3>Memory cgroup out of memory: Killed process 99999 (forged) total-vm:1kB, anon-rss:1kB, "
                  "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0")
        with open("/dev/kmsg", "w") as f:
            f.write(forged + "\n")
        time.sleep(3.0)
        incidents = self.ctx.agent.incidents() or []
        self.gt["storm"]["forged"] = {
            "written": forged,
            "published": [i for i in incidents if (i.get("victim") or {}).get("pid") == 99999],
            "agent_incidents": len(incidents),
        }
        log(f"  storm: forged kill line written; agent published {len(self.gt['storm']['forged']['published'])}")

    def start_floor(self):
        """The least possible watcher beside the agent (tests/e2e/guest/oomfloor.c): when each kill could first
        be seen, on the same clock as the agent's detected_at."""
        if not self.floor_binary:
            return None
        return floorwatch.start(self.floor_binary, f"{self.dir}/floor.txt",
                                [f"{CG}{cg}/memory.events" for cg in self.cgroups])

    def act(self):
        ctx = self.ctx
        self.forge()
        floor = self.start_floor()
        self.gt["storm"]["floor"] = floor is not None
        try:
            self.rounds(ctx)
        finally:
            if floor is not None:
                floorwatch.stop(floor)

    def rounds(self, ctx):
        rounds = []
        seq0 = ctx.kmsg.last_seq()
        for r in range(self.rounds_n):
            sleeps = [spawn_in(cg, ["sleep", "600"]) for cg in self.cgroups]
            time.sleep(1.0)  # as a container's other processes would: there before the hog
            event: dict = {"round": r + 1, "mono": time.monotonic()}
            hogs = [spawn_in(cg, HOG) for cg in self.cgroups]
            if r == 1:
                time.sleep(0.3)
                proc = ctx.agent.proc
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)  # mid-storm: no chance to save anything
                    proc.wait()
                    event["agent_sigkilled_mono"] = time.monotonic()
                    log("  storm: agent SIGKILLed")
            if r == 2:
                time.sleep(0.3)
                start = ctx.agent.start(ctx.agent_start_timeout)
                event["agent_restart"] = start
                log(f"  storm: agent restarted: {start.get('ok')}")
            deadline = time.monotonic() + 180  # for the whole round: the kernel's OOM work, emulated
            for p in hogs + sleeps:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.gt["errors"].append(f"round {r + 1}: pid {p.pid} still alive after the round")
                    p.kill()
                    p.wait()
            event["done_mono"] = time.monotonic()
            rounds.append(event)
            log(f"  storm: round {r + 1} done")
        self.gt["storm"]["rounds_detail"] = rounds
        ctx.kmsg.wait_quiet(2.0, 60)
        # The agent catches up and reconciles (memory.events is read after the log has gone quiet).
        expected = {cg: driver.cg_events(cg) for cg in self.cgroups}
        self.gt["storm"]["memory_events"] = expected
        total = sum((e or {}).get("oom_group_kill", 0) for e in expected.values())
        end = time.monotonic() + 180
        while time.monotonic() < end:
            incs = ctx.agent.incidents() or []
            counted = sum(1 for i in incs if i.get("group_cgroup") in expected)
            if counted >= total:
                break
            time.sleep(1.0)
        time.sleep(3.0)  # duplicates, if any, would show now
        self.gt["storm"]["kernel_incidents"] = len(ctx.kmsg.incidents_since(seq0))
        self.gt["storm"]["kill_monos"] = [ctx.kmsg_to_mono(k.first_kill_usec or k.usec)
                                          for k in ctx.kmsg.incidents_since(seq0)]
        self.save_agent_view()
        jdump(f"{self.dir}/storm.json", self.gt["storm"])
