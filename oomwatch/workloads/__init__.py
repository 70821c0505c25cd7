"""Workload attribution: cgroup path → Kubernetes container / pod, Slurm step, systemd unit or other."""

from oomwatch.workloads.paths import (
    container_cgroup_of,
    identify,
    is_kubepods_root,
    kubepods_level,
    pod_cgroup_of,
    scope_of,
)
from oomwatch.workloads.resolver import WorkloadResolver

__all__ = [
    "WorkloadResolver",
    "container_cgroup_of",
    "identify",
    "is_kubepods_root",
    "kubepods_level",
    "pod_cgroup_of",
    "scope_of",
]
