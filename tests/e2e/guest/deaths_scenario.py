"""Deaths that look like memory deaths (issue 22 item 1) in real runc containers on the real kernel, with the agent
running its proc connector: runs INSIDE the guest, imported by driver.py (its SCENARIOS). Each scenario waits for
the agent's death line for its container in the events file (`"record": "death"`, written once the state that
counts it is saved) and keeps it in `deaths.json`; tests/e2e/test_deaths.py checks the verdicts against what the
kernel did (its log, memory.events) and that no OOM kill was counted for a death the kernel did not cause.

  o_death_userspace  a container (init sh, two sleeps) whose init another process SIGKILLs: no kernel OOM kill,
                     so `userspace` (sender unknown); no incident, oomwatch_oom_kills_total stays 0.
  p_death_kernel     a container whose main process (dd, exec'd by its init) allocates past its 64 MiB limit,
                     memory.oom.group=0: the kernel kills it, `kernel-oom`, tied to the kernel's incident.
  q_death_stale      a container whose init shell runs dd as a child, which the kernel kills (a kernel-oom death
                     of its own), then the pod is deleted: `runc kill TERM`, the init traps it and exits 143: its
                     status would say OOMKilled (oom_kill 1 in the run), but this exit was not one: `not-oom`.
"""

from __future__ import annotations

import json
import os
import signal
import time

from image_scenario import d  # driver.py, as loaded in the guest

DEATH_WAIT = 30.0  # seconds for the agent's death line (2 s settle, a state save, the VM's slowness)


class DeathScenario(d.Scenario):
    container_name = "worker"

    def pod_and_container(self, script: str, *, oom_group: int = 0, trigger: bool = False,
                          procs: int = 1) -> "d.Container":
        p = self.pod("cgroupfs", "burstable", self.name, "ml", f"{self.name.split('_')[0]}-death-0")
        self.gt["pod"] = p
        c = self.container(p, "containerd", self.container_name, d.sh(script), limit=64 << 20, oom_group=oom_group,
                           trigger=trigger)
        c.run()
        c.wait_procs(procs)
        self.c = c
        self.gt["cgroups_tracked"] = [c.cgroup, p["cgroup"]]
        self.gt["main_pid"] = c.init_pid
        self.gt["main_ns_pid"] = ns_pid(c.init_pid)
        return c

    def wait_agent(self) -> None:
        seen = self.wait_agent_sees(self.container_name)
        self.gt["agent"]["workload_seen_after"] = seen

    def wait_deaths(self, count: int, at_least_after: float) -> list[dict]:
        """The agent's death lines for this scenario's container, once `count` are there (or DEATH_WAIT has
        passed); kept in deaths.json with when each appeared."""
        end = time.monotonic() + DEATH_WAIT
        found: list[dict] = []
        while time.monotonic() < end and self.ctx.agent.alive():
            found = deaths_in(self.ctx.agent.events, self.c.cgroup)
            if len(found) >= count:
                break
            time.sleep(0.25)
        self.gt["agent"]["deaths_seconds_after_exit"] = round(time.monotonic() - at_least_after, 2)
        d.jdump(f"{self.dir}/deaths.json", found)
        for death in found:
            d.log(f"  agent: death {death.get('cause')} pid {death.get('pid')}: {death.get('explanation')}")
        return found

    def exited(self, timeout: float = 20) -> float:
        end = time.monotonic() + timeout
        while d.cg_procs(self.c.cgroup) and time.monotonic() < end:
            time.sleep(0.05)
        return time.monotonic()


def ns_pid(pid: int) -> int | None:
    """The last NSpid of /proc/PID/status: 1 for a container's init, as the agent reads it at exec."""
    text = d.rfile(f"/proc/{pid}/status") or ""
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return None


def deaths_in(events_path: str, cgroup: str) -> list[dict]:
    out = []
    try:
        with open(events_path) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("record") == "death" and data.get("cgroup") == cgroup:
            out.append(data)
    return out


class DeathUserspace(DeathScenario):
    name = "o_death_userspace"
    description = ("a container's init is SIGKILLed by another process (no OOM): the agent's verdict is "
                   "userspace, with no incident and no OOM-kill count")

    def setup(self):
        self.pod_and_container("sleep 600 & sleep 601 & wait", procs=3)
        self.gt["expect"] = {"no_incident": True, "cause": "userspace"}

    def act(self):
        ctx, cgs = self.ctx, self.gt["cgroups_tracked"]
        self.wait_agent()
        self.record_pids_before(cgs)
        self.snapshot("before", cgs)
        seq0 = ctx.kmsg.last_seq()
        os.kill(self.c.init_pid, signal.SIGKILL)  # as `kill -9` from a shell on the node would
        self.gt["t_kill_mono"] = time.monotonic()
        gone = self.exited()
        self.wait_deaths(1, gone)
        self.gt["kernel_incidents"] = [k.summary() for k in ctx.kmsg.incidents_since(seq0)]
        self.record_after(cgs)


class DeathKernel(DeathScenario):
    name = "p_death_kernel"
    description = ("a container's main process (dd, exec'd by its init) allocates past its 64 MiB limit, "
                   "memory.oom.group=0: the kernel kills it, the agent's verdict is kernel-oom")

    def setup(self):
        self.pod_and_container(f"{d.WAIT_FIFO}; exec {d.HOG}", trigger=True)
        self.hog = self.c
        self.gt["expect"] = {"cause": "kernel-oom", "kind": "single", "victim_workload": self.c.cgroup}

    def act(self):
        self.wait_agent()
        self.oom_and_observe(self.c)
        self.wait_deaths(1, self.exited())
        self.save_agent_view()  # /incidents and /metrics once the death is counted too


class DeathStale(DeathScenario):
    name = "q_death_stale"
    description = ("the kernel kills a child (dd) of a container's init; then the pod is deleted (runc kill "
                   "TERM) and the init exits 143: its status would say OOMKilled, the agent says not-oom")

    def setup(self):
        self.pod_and_container(f"trap 'exit 143' TERM; {d.WAIT_FIFO}; {d.HOG}; sleep 600 & wait", trigger=True)
        self.hog = self.c
        self.gt["expect"] = {"cause": "not-oom", "child_cause": "kernel-oom", "kind": "single"}

    def act(self):
        self.wait_agent()
        self.oom_and_observe(self.c)  # the child's kill (the init and its sleep live on)
        self.wait_deaths(1, time.monotonic())
        self.gt["procs_after_child_kill"] = d.cg_procs(self.c.cgroup)
        self.gt["t_term_mono"] = time.monotonic()
        self.c.kill("TERM")
        self.wait_deaths(2, self.exited())
        self.save_agent_view()


SCENARIOS = [DeathUserspace, DeathKernel, DeathStale]
