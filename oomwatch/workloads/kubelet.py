"""The kubelet's OOM policy: KubeletConfiguration `singleProcessOOMKill` (kubernetes#126096), and where it
puts pods (`cgroupRoot`).

Since 1.28 the kubelet asks the runtime for `memory.oom.group=1` on every container cgroup on cgroup v2,
so one process running out of memory takes its whole container down. `singleProcessOOMKill: true` turns
that off. Unset means false on cgroup v2 (group kill) and the kubelet forces it true on cgroup v1, which
has no `memory.oom.group`. Kubelets before 1.32 do not know the field; 1.28–1.31 group-kill on cgroup v2
like an unset field does, and before 1.28 nothing set oom.group at all: the per-cgroup `memory.oom.group`
that oomwatch reads is the ground truth, this is the declared intent.

`cgroupRoot` ("/" when unset) is where the kubelet creates `kubepods`: only cgroups below it are Kubernetes
workloads (oomwatch.workloads.paths.CgroupLayout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union


DEFAULT_KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
_FIELD = "singleProcessOOMKill"
_ROOT_FIELD = "cgroupRoot"
DEFAULT_CGROUP_ROOT = "/"
_MAX_CONFIG_BYTES = 1024 * 1024


@dataclass(frozen=True)
class KubeletOomPolicy:
    """What a kubelet config file says. `single_process_oom_kill` None = the field is unset;
    `error` set = the file could not be understood (then the value means nothing). `cgroup_root` is the
    kubelet's cgroupRoot ("/" when unset or not a cgroup path: the kubelet's own default)."""

    single_process_oom_kill: Optional[bool] = None
    error: Optional[str] = None
    cgroup_root: str = DEFAULT_CGROUP_ROOT


def _cgroup_root(document: dict) -> str:
    value = document.get(_ROOT_FIELD)
    # The kubelet refuses anything but an absolute path here; "" means its default, "/".
    if isinstance(value, str) and value.startswith("/") and "\x00" not in value:
        return value
    return DEFAULT_CGROUP_ROOT


def parse_kubelet_config(text: str) -> KubeletOomPolicy:
    """A KubeletConfiguration (YAML or JSON) → its OOM policy. Never raises: garbled text comes back
    as a policy with `error` set."""
    import yaml  # only where a kubelet config exists: it costs seconds to import under emulation

    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return KubeletOomPolicy(error=f"not YAML: {first_line}")
    except (RecursionError, ValueError) as exc:
        return KubeletOomPolicy(error=f"not YAML: {type(exc).__name__}")
    if not isinstance(document, dict):
        return KubeletOomPolicy(error="not a KubeletConfiguration (not a mapping)")
    kind = document.get("kind")
    if kind is not None and kind != "KubeletConfiguration":
        return KubeletOomPolicy(error=f"not a KubeletConfiguration (kind {kind!r})")
    root = _cgroup_root(document)
    if _FIELD not in document or document[_FIELD] is None:
        return KubeletOomPolicy(single_process_oom_kill=None, cgroup_root=root)
    value = document[_FIELD]
    if not isinstance(value, bool):
        # The kubelet itself rejects a non-boolean here (strict decoding), so it would not be running.
        return KubeletOomPolicy(error=f"{_FIELD} is not a boolean: {value!r}", cgroup_root=root)
    return KubeletOomPolicy(single_process_oom_kill=value, cgroup_root=root)


def single_process_oom_kill(policy: Optional[KubeletOomPolicy], cgroup_version: Union[int, str, None]) -> str:
    """`oomwatch_node_info{single_process_oom_kill}`: "true" | "false" | "unknown".

    - no readable config (None) or a garbled one → "unknown";
    - cgroup v1 → "true" (the kubelet forces it; v1 has no memory.oom.group);
    - cgroup v2 → the configured value, "false" when unset (group kill);
    - cgroup version unknown → "true" when configured true (true on both versions), else "unknown"."""
    if policy is None or policy.error is not None:
        return "unknown"
    version = str(cgroup_version) if cgroup_version is not None else ""
    if version in ("1", "v1"):
        return "true"
    if version in ("2", "v2"):
        return "true" if policy.single_process_oom_kill else "false"
    return "true" if policy.single_process_oom_kill else "unknown"


def read_kubelet_config(path: str = DEFAULT_KUBELET_CONFIG) -> Optional[KubeletOomPolicy]:
    """Read and parse the kubelet config at `path`; None when absent or unreadable (a non-Kubernetes
    node, or an agent without the host path mounted)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_CONFIG_BYTES + 1)
    except OSError:
        return None
    if len(data) > _MAX_CONFIG_BYTES:
        return KubeletOomPolicy(error="config file too large")
    return parse_kubelet_config(data.decode("utf-8", errors="replace"))


def read_kubelet_cgroup_root(path: str = DEFAULT_KUBELET_CONFIG) -> str:
    """The kubelet's cgroupRoot from its config at `path`: "/" when the file is absent, unreadable or garbled
    (the kubelet's default, and the strictest choice: only `/kubepods` and `/kubepods.slice` are pods')."""
    policy = read_kubelet_config(path)
    return DEFAULT_CGROUP_ROOT if policy is None else policy.cgroup_root
