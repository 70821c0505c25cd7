"""Calm single kills beside the floor (issue 30: "the calm single kill: ≤ 100 ms after the floor"): runs INSIDE the
guest, imported by driver.py (its SCENARIOS); tests/e2e/test_calm_floor.py reads what it leaves.

  r_calm_floor  KILLS containers of one pod (containerd, cgroupfs, 64 MiB each, memory.oom.group=0), each a shell
                that waits for its trigger and execs dd past its limit: the kernel kills the dd alone, a single
                kill in a cgroup of its own. The floor watcher (tests/e2e/guest/oomfloor.c, built here with the
                guest's gcc) runs beside the agent on the kernel log and the containers' memory.events. One kill at
                a time on a quiet node: each is fired once the kernel log has been quiet a second, after the agent
                has published the kill before and written its death line (its last work for a kill).

Left in the scenario's directory: floor.txt (the floor's lines; `events INDEX …` is the INDEXth container) and
calm-floor.json, a row per kill: the container, its cgroup, the kernel's record (`oom-kill:` summary) sequence
number and victim, when it was fired and when the driver found the agent's line in the events file (a poll of
the test, never the figure: that is the agent's own `detected_at`, in the run's agent/events.jsonl).
"""

from __future__ import annotations

import json
import time

import floorwatch  # noqa: E402 (the guest directory is on sys.path)
from deaths_scenario import DEATH_WAIT, deaths_in
from image_scenario import d  # driver.py, as loaded in the guest

KILLS = 6
LIMIT = 64 << 20
POLL = 0.25  # seconds between the driver's looks at the events file (the agent's own time is the figure)


def incidents_in(events_path: str) -> list[dict]:
    """The agent's incident lines in its events file (its death lines apart)."""
    try:
        with open(events_path) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("record") != "death":
            out.append(data)
    return out


class CalmFloor(d.Scenario):
    name = "r_calm_floor"
    description = (f"{KILLS} containers (64M, memory.oom.group=0) each OOM once, one at a time on a quiet node, "
                   "with the C floor watcher beside the agent: the agent's publish after the floor, per kill")

    def setup(self):
        p = self.main_pod("cgroupfs", "burstable", "calm", "floor-0")
        self.hogs = [self.started(p, "containerd", f"calm-{i}", d.sh(f"{d.WAIT_FIFO}; exec {d.HOG}"), procs=1,
                                  limit=LIMIT, oom_group=0, trigger=True) for i in range(KILLS)]
        self.gt["cgroups_tracked"] = [c.cgroup for c in self.hogs] + [p["cgroup"]]
        self.gt["expect"] = {"kind": "single", "constraint": "memcg", "scope": "container", "kills": KILLS}
        self.binary = f"{d.WORK}/oomfloor"
        t = time.monotonic()
        floorwatch.build(self.binary)
        self.gt["floor_build_seconds"] = round(time.monotonic() - t, 2)

    def act(self):
        # the agent knows each container (it read the bundle when the cgroup appeared) before any kill
        self.gt["agent"]["workload_seen_after"] = [self.wait_agent_sees(f"calm-{i}") for i in range(KILLS)]
        floor = floorwatch.start(self.binary, f"{self.dir}/floor.txt",
                                 [f"{d.CG}{c.cgroup}/memory.events" for c in self.hogs])
        kills = []
        try:
            for i, c in enumerate(self.hogs):
                kills.append(self.one_kill(i, c))
        finally:
            floorwatch.stop(floor)
        self.gt["calm_kills"] = kills
        d.jdump(f"{self.dir}/calm-floor.json", kills)
        self.record_after(self.gt["cgroups_tracked"])

    def one_kill(self, index: int, c: "d.Container") -> dict:
        ctx = self.ctx
        ctx.kmsg.wait_quiet(1.0, 30)
        seq0 = ctx.kmsg.last_seq()
        row: dict = {"index": index, "container": c.id, "cgroup": c.cgroup, "fired_wall": time.time()}
        c.fire()
        end = time.monotonic() + 60
        incs = []
        while time.monotonic() < end and not (incs and incs[0].victim_pid is not None):
            time.sleep(0.05)
            incs = ctx.kmsg.incidents_since(seq0)
        if not incs:
            self.gt["errors"].append(f"{c.id[:12]}: the kernel logged no OOM kill")
            return row
        k = incs[0]
        row.update(kernel_seq=k.seq, victim_pid=k.victim_pid, kind=k.kind, task_memcg=k.task_memcg)
        end = time.monotonic() + ctx.agent_wait
        while time.monotonic() < end and "agent_line_seen_wall" not in row:
            if any((i.get("victim") or {}).get("pid") == k.victim_pid for i in incidents_in(ctx.agent.events)):
                row["agent_line_seen_wall"] = time.time()
            else:
                time.sleep(POLL)
        end = time.monotonic() + DEATH_WAIT  # the agent's last work for this kill: then the node is quiet
        while time.monotonic() < end and not deaths_in(ctx.agent.events, c.cgroup):
            time.sleep(POLL)
        row["death_line"] = bool(deaths_in(ctx.agent.events, c.cgroup))
        d.log(f"  kill {index}: seq {k.seq} pid {k.victim_pid} in {c.id[:12]}; agent line "
              f"{'found' if 'agent_line_seen_wall' in row else 'NOT found'}, death line {row['death_line']}")
        return row


SCENARIOS = [CalmFloor]
