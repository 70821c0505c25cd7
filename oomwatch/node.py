"""What the agent and `inspect` both know about this node: its OOM posture and which cgroups are workloads (how
kernel records become incidents is the pipeline's, for both: oomwatch.replay). Neither command's wiring lives
here; both import this."""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from typing import Iterator, Optional

from oomwatch.config import Config
from oomwatch.model import CgroupStats, NodeInfo, Workload
from oomwatch.nodestate import is_workload
from oomwatch.sources.cgroupfs import CgroupFS, Proc
from oomwatch.sources.cgroupfs import cat as cat_text
from oomwatch.store import Labels
from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads.kubelet import read_kubelet_config, single_process_oom_kill
from oomwatch.workloads.paths import CgroupLayout
from oomwatch.workloads.runtime import RuntimeNames, host_is_tmpfs


def cgroup_version_label(version: str) -> str:
    return {"v2": "2", "v1": "1"}.get(version, version)


def is_workload_cgroup(path: str, workload: Workload, stats: Optional[CgroupStats]) -> bool:
    """nodestate.is_workload of a cgroup's stats as read."""
    limited = stats is not None and stats.limit_bytes is not None and not math.isinf(stats.limit_bytes)
    return is_workload(path, workload, stats.oom_group if stats else None, limited)


def with_effective_oom_group(fs: CgroupFS, workload: Workload, stats: CgroupStats) -> CgroupStats:
    """Slurm's OOMKillStep sets memory.oom.group on the step's `user` child, not on the step: what decides
    whether the step dies whole is that child's flag."""
    if workload.type == "slurm" and workload.slurm_step and not stats.oom_group:
        child = fs.read_stats(workload.cgroup.rstrip("/") + "/user")
        if child is not None and child.oom_group:
            return replace(stats, oom_group=child.oom_group)
    return stats


def cgroup_root_problem(root: str, version: str) -> Optional[str]:
    """Why the agent cannot see workloads' memory at `root` (None: it can). `version` is Proc.cgroup_version's.
    Raises FileNotFoundError when `root` does not exist: a mistyped host path is a start failure, not an agent
    that is green and blind."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"--cgroup-root {root} does not exist (where is the host's /sys/fs/cgroup "
                                "mounted? in a DaemonSet, mount it and point --cgroup-root at it)")
    controllers = cat_text(os.path.join(root, "cgroup.controllers"))
    if version in ("hybrid", "v1"):
        return (f"memory is on a cgroup v1 hierarchy on this host ({version}): {root} holds no cgroup v2 memory "
                "controller, so no workload's memory.events can be read (boot the node with "
                "systemd.unified_cgroup_hierarchy=1, as Kubernetes 1.31+ wants)")
    if controllers is None:
        return f"{root} is not a cgroup v2 hierarchy (it has no cgroup.controllers): point --cgroup-root at one"
    if "memory" not in controllers.split():
        return (f"the memory controller is not enabled at {root} (its cgroup.controllers lists "
                f"{controllers.strip() or 'nothing'}): no workload's memory.events can be read")
    return None


def node_layout(kubelet_config: str) -> CgroupLayout:
    """Whose cgroups are whose on this node: the kubelet's cgroupRoot (its config; "/" without one) decides where
    Kubernetes identities may come from (docs/contract.md, Identity)."""
    policy = read_kubelet_config(kubelet_config)
    return CgroupLayout(policy.cgroup_root if policy is not None else "/")


def scraped_workloads(workloads: tuple[tuple[str, Labels, Workload], ...], cache, fs: CgroupFS,
                      unwatched_limits: set[str]) -> Iterator[tuple[Labels, CgroupStats]]:
    """A scrape's reads: each workload of the pipeline's snapshot with its cgroup's files now (through the
    stat cache, sources.statcache), once per label set."""
    seen: set[Labels] = set()
    for path, labels, workload in workloads:
        if labels in seen:
            continue
        if path in unwatched_limits:
            cache.invalidate(path)  # no inotify on its limits: read them every time
        stats = cache.read(path)
        if stats is not None:
            seen.add(labels)
            yield labels, with_effective_oom_group(fs, workload, stats)


class NodePosture:
    """What the node's OOM policy is, read on demand (the kubelet config can change under us)."""

    def __init__(self, config: Config, proc: Proc) -> None:
        self.config = config
        self.proc = proc
        self.kernel = proc.kernel_release()
        self.cgroup_version = proc.cgroup_version(config.cgroup_root)

    def single_process_oom_kill(self) -> str:
        policy = read_kubelet_config(self.config.kubelet_config)
        return single_process_oom_kill(policy, self.cgroup_version)

    def info(self) -> NodeInfo:
        return self.info_with(self.single_process_oom_kill())

    def info_with(self, single_process_oom_kill: str) -> NodeInfo:
        """The node's info series with the policy as last read (the agent's pipeline holds it)."""
        return NodeInfo(kernel=self.kernel, cgroup_version=cgroup_version_label(self.cgroup_version),
                        single_process_oom_kill=single_process_oom_kill)


def node_resolver(config: Config, layout: CgroupLayout) -> WorkloadResolver:
    """Who this node's cgroups are, named from its runtime's bundles and pod logs (the agent's cgroup source,
    inspect, inspect --job)."""
    return WorkloadResolver(RuntimeNames(run_root=config.run_root, pod_log_root=config.pod_log_dir,
                                         is_tmpfs=host_is_tmpfs(config.proc)), layout=layout)


def host_boot_time() -> float:
    """Epoch seconds of kernel time 0: printk stamps count from boot like CLOCK_MONOTONIC."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


