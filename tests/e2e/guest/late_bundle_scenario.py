"""A container whose runtime bundle is written only after its cgroup appeared (issue 29 item 2), in a real runc
container on the real kernel with the agent running: runs INSIDE the guest, imported by driver.py (its
SCENARIOS). tests/e2e/test_late_bundle.py checks that the kill's incident still names the pod.

  s_late_bundle  containerd + cgroupfs, limit 48M, oom.group=1: runc runs the container from a bundle outside
                 containerd's task directory, so the agent's reads of its names at the cgroup's appearance and at
                 its first process find nothing, and it exports the container by its cgroup alone. Then the
                 bundle is written where containerd keeps it (`<run>/containerd/io.containerd.runtime.v2.task/
                 k8s.io/<id>/config.json`) and the hog fires: the agent reads the bundle again when the kill needs
                 the names, and the incident names container, pod and namespace.
"""

from __future__ import annotations

import os
import shutil
import time

from image_scenario import d  # driver.py, as loaded in the guest

NAMESPACE, POD, CONTAINER = "research", "late-bundle-0", "learner"


class LateBundle(d.Scenario):
    name = "s_late_bundle"
    description = (
        "containerd + cgroupfs, limit 48M, oom.group=1: the container's bundle is written where containerd keeps "
        "it only after its cgroup appeared and got its processes (the agent's reads then find nothing); the "
        "kill's incident must still name the pod"
    )

    def setup(self) -> None:
        p = self.main_pod("cgroupfs", "burstable", NAMESPACE, POD)
        self.hog = self.container(p, "containerd", CONTAINER, d.sh(f"sleep 600 & {d.WAIT_FIFO}; {d.HOG}; wait"),
                                  limit=48 << 20, oom_group=1, trigger=True)
        self.task_dir = self.hog.bundle  # where the agent reads the names
        self.hog.bundle = f"{d.WORK}/late-bundles/{self.hog.id}"  # where runc is given it
        self.run_hog(p, procs=2)
        self.gt["task_bundle_at_start"] = os.path.exists(f"{self.task_dir}/config.json")

    def act(self) -> None:
        a = self.gt["agent"]
        a["exported_unnamed_after"] = self.wait_agent_exports(self.hog.cgroup)
        a["named_before_bundle"] = f'container="{CONTAINER}"' in (self.ctx.agent.metrics() or "")
        os.makedirs(self.task_dir, exist_ok=True)
        shutil.copy(f"{self.hog.bundle}/config.json", f"{self.task_dir}/config.json")
        d.log(f"  bundle written to {self.task_dir} after the agent exported {self.hog.cgroup} unnamed")
        self.oom_and_observe(self.hog)

    def wait_agent_exports(self, cgroup: str) -> float | None:
        """Seconds until the agent exports a series for `cgroup` (named by its cgroup alone), or None."""
        t = time.monotonic()
        end = t + self.ctx.agent_wait
        while self.ctx.agent.alive() and time.monotonic() < end:
            if f'cgroup="{cgroup}"' in (self.ctx.agent.metrics() or ""):
                return time.monotonic() - t
            time.sleep(0.25)
        return None

    def finish(self) -> None:
        shutil.rmtree(self.task_dir, ignore_errors=True)


SCENARIOS = [LateBundle]
