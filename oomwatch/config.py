"""The agent's and inspect's settings: one frozen value built by the CLI, passed everywhere."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

DEFAULT_LISTEN = "0.0.0.0:9717"


@dataclass(frozen=True)
class Config:
    kmsg: str = "/dev/kmsg"
    cgroup_root: str = "/sys/fs/cgroup"
    proc: str = "/proc"
    listen: str = DEFAULT_LISTEN
    events_file: Optional[str] = None
    state_dir: Optional[str] = None
    kubelet_config: str = "/var/lib/kubelet/config.yaml"
    run_root: str = "/run"
    pod_log_dir: str = "/var/log/pods"
    node_name: Optional[str] = None
    kube_api: str = "auto"  # auto | off
    pod_events: bool = True
    grace_period: float = 600.0
    # Each unit in a subtree delegated to a user (user@UID.service, rootless runtimes) its own workload; by
    # default the subtree is one workload at its delegation root (docs/contract.md, "Identity").
    trust_delegated_cgroups: bool = False
    proc_connector: bool = False  # witness SIGKILLed processes the kernel log does not name
    # How long the kernel log must stay quiet before an incident still being printed is taken as complete.
    quiet_seconds: float = 0.25
    boot_time: Optional[float] = None  # epoch of kernel time 0 for saved logs; None = this host's
    web_config_file: Optional[str] = None  # TLS and auth for the port (sinks.webconfig.load_web_config)
    # Series left out of /metrics on large fleets (sinks.collector.DROPPABLE): "pods", "memory-events".
    drop_series: tuple[str, ...] = ()
    # Journal entries attached to the systemd unit of each kill (sinks.journal): auto = as root where
    # journald's socket exists, on, off. `oomwatch agent` defaults to auto; a Config built elsewhere (tests)
    # writes to this host's journal only when it asks to.
    journal: str = "off"
    # Append each kill's explanation to the Slurm job's AdminComment (sinks.slurm; scontrol as root on the node).
    slurm_admin_comment: bool = False
