"""Workload attribution: cgroup path → Kubernetes container / pod, Slurm step, systemd unit or other."""

from oomwatch.workloads.paths import (
    DEFAULT_LAYOUT,
    CgroupLayout,
    container_cgroup_of,
    identify,
    is_kubepods_root,
    kubepods_level,
    pod_cgroup_of,
    scope_of,
)
from oomwatch.workloads.resolver import WorkloadResolver

__all__ = [
    "DEFAULT_LAYOUT",
    "CgroupLayout",
    "WorkloadResolver",
    "container_cgroup_of",
    "identify",
    "is_kubepods_root",
    "kubepods_level",
    "pod_cgroup_of",
    "scope_of",
]
