"""cgroup path → workload: who a cgroup belongs to, from its path alone.

Pure functions, no file access: a saved kernel log with no live cgroup tree must still name its victims.
Paths are relative to the cgroup v2 root and start with "/", exactly as the kernel prints them
(`oom_memcg=`, `task_memcg=`, `Tasks in … are going to be killed`).

Recognised layouts (see docs/kernel-facts.md, "Kubernetes" and "Slurm and systemd"):

- Kubernetes, cgroupfs driver:  `<cgroupRoot>/kubepods[/burstable|/besteffort]/pod<uid>/<container>`
- Kubernetes, systemd driver:
  `kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid_>.slice/<container>`
  (with a `cgroupRoot` the systemd names carry its prefix: `kubelet.slice/kubelet-kubepods.slice/…`)
- containers: containerd `cri-containerd-<id>.scope` | `<id>`; CRI-O `crio-<id>.scope` | `crio-<id>`
  (`crio-conmon-<id>.scope` is CRI-O's monitor process, a pod-level helper, not the container);
  docker / cri-dockerd `docker-<id>.scope` | `<id>`. Anything below the container cgroup (crun's
  `container` / `exec` children) belongs to the container.
- Slurm cgroup/v2: `[/system.slice]/[<node>_]slurmstepd.scope/job_<id>/step_<name>/{user/task_<n>,slurm}`.
- systemd units: the deepest `.service` / `.scope` / `.slice` (and `.socket` / `.mount` / `.swap`) component.

Only the kubelet's own cgroup root makes Kubernetes identities, and only Slurm's own scope Slurm ones
(docs/contract.md, "Identity"): anyone who may create cgroups somewhere (a systemd user session, a rootless
runtime, a delegated subtree) can spell `kubepods/burstable/pod<uid>/<container id>` or `job_<id>/step_0`
below it, and container ids and pod UIDs are readable from any process's `/proc/PID/cgroup`. Kubernetes
series carry names, not cgroups, so a path spelt that way elsewhere would count its kills on the real pod's
series. Such a path is what it is: a systemd unit (the deepest unit in it) or "other", with its own cgroup.

`CgroupLayout` holds where the kubelet puts pods (its `cgroupRoot`, "/" by default); the module-level
functions are those of the default layout.

Kubernetes and Slurm are recognised before systemd units, because their cgroups are themselves slices
and scopes (`kubepods.slice`, `cri-containerd-….scope`, `slurmstepd.scope`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Optional

from oomwatch.model import Workload

# --- Kubernetes --------------------------------------------------------------------------------------

_QOS_CLASSES = ("burstable", "besteffort")

# cgroupfs driver: `pod<uid>` (a UUID, or a 32-hex md5 for static/mirror pods).
_CGROUPFS_POD = re.compile(r"^pod(?P<uid>[0-9A-Fa-f][0-9A-Fa-f-]*)$")

# Container cgroups, one pattern per runtime naming. Container ids are 64 hex digits for all three runtimes.
_CONTAINER_ID = r"(?P<id>[0-9a-f]{64})"
_CONTAINER_PATTERNS: tuple[tuple[re.Pattern[str], Optional[str]], ...] = (
    (re.compile(rf"^cri-containerd-{_CONTAINER_ID}\.scope$"), "containerd"),
    (re.compile(rf"^crio-{_CONTAINER_ID}(?:\.scope)?$"), "cri-o"),
    (re.compile(rf"^docker-{_CONTAINER_ID}\.scope$"), "docker"),
    # cgroupfs driver for containerd and docker: the bare id. Which runtime it is the path cannot say.
    (re.compile(rf"^{_CONTAINER_ID}$"), None),
)
_CRIO_CONMON = re.compile(rf"^crio-conmon-{_CONTAINER_ID}(?:\.scope)?$")

# Levels kubepods_level() reports.
NODE_ALLOCATABLE = "node-allocatable"
QOS = "qos"
POD = "pod"
CONTAINER = "container"
CONMON = "conmon"

# --- Slurm and systemd -------------------------------------------------------------------------------

# slurmd's scope: `slurmstepd.scope`, or `<node>_slurmstepd.scope` on a node that runs several slurmd.
_SLURMSTEPD_SCOPE = re.compile(r"^(?:[A-Za-z0-9._-]+_)?slurmstepd\.scope$")
# Where Slurm's cgroup/v2 plugin puts that scope: in system.slice (systemd made it), or at the root
# (IgnoreSystemd=yes). Both are root's: nobody else can create a cgroup there.
_SLURM_PARENTS = ((), ("system.slice",))
_SLURM_JOB = re.compile(r"^job_(?P<job>[0-9]+)$")
_SLURM_STEP = re.compile(r"^step_(?P<step>[A-Za-z0-9_.+-]+)$")
_SLURM_TASK = re.compile(r"^task_(?P<task>[A-Za-z0-9_]+)$")
_SYSTEMD_UNIT_SUFFIXES = (".service", ".scope", ".slice", ".socket", ".mount", ".swap")
# Containers run outside Kubernetes still name their runtime in their systemd scope.
_RUNTIME_SCOPES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"^docker-{_CONTAINER_ID}\.scope$"), "docker"),
    (re.compile(rf"^cri-containerd-{_CONTAINER_ID}\.scope$"), "containerd"),
    (re.compile(rf"^crio-{_CONTAINER_ID}\.scope$"), "cri-o"),
    (re.compile(rf"^libpod-{_CONTAINER_ID}\.scope$"), "podman"),
)


# Lone surrogates: what Python's surrogate escapes (os.fsdecode, os.scandir) make of bytes that are not UTF-8.
def normalize(cgroup_path: str) -> str:
    """`kubepods/x/` → `/kubepods/x`; "" → "/". Collapses repeated slashes. Nothing else: a cgroup name
    may start or end with any byte but `/`, spaces and newlines included."""
    return "/" + "/".join(p for p in cgroup_path.split("/") if p)


def _components(cgroup_path: str) -> list[str]:
    return [p for p in cgroup_path.split("/") if p]


def _join(parts: list[str]) -> str:
    return "/" + "/".join(parts)


@dataclass(frozen=True)
class _KubeRoot:
    """One cgroup the kubelet puts its pods under (node allocatable), as path components. `systemd_prefix` is
    set for the systemd driver's layout: the QoS and pod slices below repeat it (`kubepods-burstable.slice`,
    `kubelet-kubepods-pod<uid_>.slice`); None for the cgroupfs driver's (`burstable`, `pod<uid>`)."""

    parts: tuple[str, ...]
    systemd_prefix: Optional[str] = None


def _is_unit(name: str) -> bool:
    return any(name.endswith(suffix) and len(name) > len(suffix) for suffix in _SYSTEMD_UNIT_SUFFIXES)


def kubepods_roots(cgroup_root: str = "/") -> tuple[_KubeRoot, ...]:
    """Where the kubelet with this `cgroupRoot` (KubeletConfiguration, "/" by default) puts pods: the
    cgroupfs driver's `<cgroupRoot>/kubepods` and the systemd driver's slice. The systemd driver expands the
    root's names into nested slices: "/" gives `/kubepods.slice`, "/kubelet" (kind)
    `/kubelet.slice/kubelet-kubepods.slice`; a root already given as a slice ("/kubelet.slice") continues it.
    Components before those names that are systemd units (kind's node container seen from the host:
    `/system.slice/docker-<id>.scope/kubelet`) are kept as they are."""
    parts = _components(cgroup_root)
    cgroupfs = _KubeRoot((*parts, "kubepods"))
    if parts and parts[-1].endswith(".slice") and len(parts[-1]) > len(".slice"):
        prefix = f"{parts[-1][: -len('.slice')]}-kubepods"
        return cgroupfs, _KubeRoot((*parts, f"{prefix}.slice"), prefix)
    keep = len(parts)
    while keep and not _is_unit(parts[keep - 1]):
        keep -= 1
    names = [name.replace("-", "_") for name in parts[keep:]]  # a dash is systemd's hierarchy separator
    slices = ["-".join(names[: i + 1]) + ".slice" for i in range(len(names))]
    prefix = "-".join([*names, "kubepods"])
    return cgroupfs, _KubeRoot((*parts[:keep], *slices, f"{prefix}.slice"), prefix)


@dataclass(frozen=True)
class _KubeParts:
    """Where the Kubernetes pieces sit in a path's components (indexes into the component list)."""

    kubepods: int
    qos: Optional[str] = None
    qos_index: Optional[int] = None
    pod_uid: Optional[str] = None
    pod_index: Optional[int] = None
    container_id: Optional[str] = None
    container_index: Optional[int] = None
    runtime: Optional[str] = None
    conmon: bool = False


class _KubeLayout:
    """The QoS and pod cgroup names below one kubepods root."""

    def __init__(self, root: _KubeRoot) -> None:
        self.parts = root.parts
        prefix = root.systemd_prefix
        if prefix is None:
            self.qos_names = {qos: qos for qos in _QOS_CLASSES}
            self.pod = _CGROUPFS_POD
            self.systemd = False
        else:
            self.qos_names = {f"{prefix}-{qos}.slice": qos for qos in _QOS_CLASSES}
            self.pod = re.compile(rf"^{re.escape(prefix)}(?:-(?P<qos>burstable|besteffort))?"
                                  r"-pod(?P<uid>[0-9A-Fa-f][0-9A-Fa-f_]*)\.slice$")
            self.systemd = True

    def parse(self, parts: list[str]) -> Optional[_KubeParts]:
        n = len(self.parts)
        if len(parts) < n or tuple(parts[:n]) != self.parts:
            return None
        i = n
        qos = self.qos_names.get(parts[i]) if i < len(parts) else None
        qos_index = i if qos is not None else None
        if qos is not None:
            i += 1
        pod_uid: Optional[str] = None
        pod_index: Optional[int] = None
        if i < len(parts):
            match = self.pod.match(parts[i])
            if match and (not self.systemd or match.group("qos") == qos):
                # systemd turns the UID's dashes into underscores (a dash is its hierarchy separator).
                pod_uid, pod_index = match.group("uid").replace("_", "-"), i
                i += 1
        kube = _KubeParts(kubepods=n - 1, qos=qos, qos_index=qos_index, pod_uid=pod_uid, pod_index=pod_index)
        if pod_index is None or i >= len(parts):
            return kube
        part = parts[i]
        conmon = _CRIO_CONMON.match(part)
        if conmon:
            return replace(kube, container_id=conmon.group("id"), container_index=i, runtime="cri-o",
                           conmon=True)
        for pattern, runtime in _CONTAINER_PATTERNS:
            match = pattern.match(part)
            if match:
                return replace(kube, container_id=match.group("id"), container_index=i, runtime=runtime)
        return kube


def _identify_kubernetes(parts: list[str], kube: _KubeParts) -> Workload:
    path = _join(parts)
    if kube.pod_index is None:
        # kubepods itself, a QoS class, or something unrecognised directly below them.
        return Workload(type="other", cgroup=path)
    pod_cgroup = _join(parts[: kube.pod_index + 1])
    if kube.container_index is not None and not kube.conmon:
        return Workload(
            type="k8s-container",
            cgroup=_join(parts[: kube.container_index + 1]),
            pod_uid=kube.pod_uid,
            container_id=kube.container_id,
            runtime=kube.runtime,
            pod_cgroup=pod_cgroup,
        )
    if kube.conmon:
        # CRI-O's conmon belongs to the pod, not to the container it watches.
        return Workload(
            type="k8s-pod",
            cgroup=_join(parts[: kube.container_index + 1]),  # type: ignore[operator]
            pod_uid=kube.pod_uid,
            runtime="cri-o",
            pod_cgroup=pod_cgroup,
        )
    # The pod cgroup itself, or a child we do not recognise as a container: its own cgroup.
    return Workload(type="k8s-pod", cgroup=path, pod_uid=kube.pod_uid, pod_cgroup=pod_cgroup)


def _identify_slurm(parts: list[str]) -> Optional[Workload]:
    """A job or step of slurmd's own scope; the same names anywhere else are not Slurm's."""
    for parent in _SLURM_PARENTS:
        i = len(parent) + 1  # the job's index
        if (len(parts) > i and tuple(parts[: i - 1]) == parent and _SLURMSTEPD_SCOPE.match(parts[i - 1])):
            break
    else:
        return None
    job = _SLURM_JOB.match(parts[i])
    if not job:
        return None  # slurmstepd's own cgroup (`system`) and anything else beside the jobs
    step = _SLURM_STEP.match(parts[i + 1]) if i + 1 < len(parts) else None
    if step is None:
        return Workload(type="slurm", cgroup=_join(parts[: i + 1]), slurm_job=job.group("job"))
    task: Optional[str] = None
    for rest in parts[i + 2 :]:
        task_match = _SLURM_TASK.match(rest)
        if task_match:
            task = task_match.group("task")
            break
    return Workload(
        type="slurm",
        cgroup=_join(parts[: i + 2]),
        slurm_job=job.group("job"),
        slurm_step=step.group("step"),
        slurm_task=task,
    )


def _identify_systemd(parts: list[str]) -> Optional[Workload]:
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        if _is_unit(part):
            runtime: Optional[str] = None
            container_id: Optional[str] = None
            for pattern, name in _RUNTIME_SCOPES:
                match = pattern.match(part)
                if match:
                    runtime, container_id = name, match.group("id")
                    break
            return Workload(
                type="systemd", cgroup=_join(parts[: i + 1]), unit=part, runtime=runtime,
                container_id=container_id,
            )
    return None


class CgroupLayout:
    """Who a cgroup path belongs to on a node whose kubelet has `kubelet_cgroup_root` (KubeletConfiguration
    `cgroupRoot`, "/" by default): Kubernetes identities come only from below that root's kubepods cgroups
    (both drivers' layouts), Slurm ones only from slurmd's scope. Pure and cached: a storm asks the same few
    paths again and again."""

    def __init__(self, kubelet_cgroup_root: str = "/") -> None:
        self.kubelet_cgroup_root = normalize(kubelet_cgroup_root)
        self.kubepods = kubepods_roots(self.kubelet_cgroup_root)
        self._layouts = tuple(_KubeLayout(root) for root in self.kubepods)
        self.identify = functools.lru_cache(maxsize=8192)(self._identify)
        self.kubepods_level = functools.lru_cache(maxsize=256)(self._kubepods_level)
        self.scope_of = functools.lru_cache(maxsize=256)(self._scope_of)

    def __repr__(self) -> str:
        return f"CgroupLayout({self.kubelet_cgroup_root!r})"

    def _kube_parts(self, parts: list[str]) -> Optional[_KubeParts]:
        for layout in self._layouts:
            kube = layout.parse(parts)
            if kube is not None:
                return kube
        return None

    def _identify(self, cgroup_path: str) -> Workload:
        """What the cgroup at `cgroup_path` belongs to, from the path alone (names come later, from the
        runtime and the API server). Never raises; an unrecognised path is type "other" with itself as
        its workload cgroup."""
        parts = _components(cgroup_path)
        kube = self._kube_parts(parts)
        if kube is not None:
            return _identify_kubernetes(parts, kube)
        slurm = _identify_slurm(parts)
        if slurm is not None:
            return slurm
        unit = _identify_systemd(parts)
        if unit is not None:
            return unit
        return Workload(type="other", cgroup=_join(parts))

    def _kubepods_level(self, cgroup_path: str) -> Optional[str]:
        """Where a path sits in the Kubernetes hierarchy: "node-allocatable" (the kubepods cgroup itself,
        whose memory.max is the node's allocatable memory), "qos" (burstable / besteffort), "pod",
        "container" (a container cgroup or anything below it), "conmon" (CRI-O's per-container monitor,
        a child of the pod), or None (not under the kubelet's kubepods, or an unrecognised child)."""
        parts = _components(cgroup_path)
        kube = self._kube_parts(parts)
        if kube is None:
            return None
        last = len(parts) - 1
        if last == kube.kubepods:
            return NODE_ALLOCATABLE
        if kube.qos_index is not None and last == kube.qos_index:
            return QOS
        if kube.pod_index is not None and last == kube.pod_index:
            return POD
        if kube.container_index is not None:
            return CONMON if kube.conmon else CONTAINER
        return None

    def is_kubepods_root(self, cgroup_path: str) -> bool:
        """True for the kubepods cgroup itself and its QoS-class children: a limit hit there is node
        memory pressure (node allocatable), not any one pod's limit."""
        return self.kubepods_level(cgroup_path) in (NODE_ALLOCATABLE, QOS)

    def pod_cgroup_of(self, cgroup_path: str) -> Optional[str]:
        """The pod cgroup a path is in (the path itself when it is a pod cgroup), else None."""
        parts = _components(cgroup_path)
        kube = self._kube_parts(parts)
        if kube is None or kube.pod_index is None:
            return None
        return _join(parts[: kube.pod_index + 1])

    def container_cgroup_of(self, cgroup_path: str) -> Optional[str]:
        """The container cgroup a path is in: the path itself, or its ancestor when the path is a crun
        `container` / `exec` child (or deeper). None outside a container (conmon is not a container)."""
        parts = _components(cgroup_path)
        kube = self._kube_parts(parts)
        if kube is None or kube.container_index is None or kube.conmon:
            return None
        return _join(parts[: kube.container_index + 1])

    def _scope_of(self, victim_cgroup: Optional[str], oom_cgroup: Optional[str], constraint: str) -> str:
        """docs/contract.md `scope`: where the limit was hit, relative to the victim's workload.

        - "node": a global OOM (constraint "global", or oom cgroup "/"; cpuset and mempolicy OOMs are not
          memcg OOMs and the kernel prints `global_oom` for them), and a memcg OOM at the kubepods cgroup
          (node allocatable) or at one of its QoS classes: the node ran short, not a pod.
        - "container": the oom cgroup is the victim's container cgroup (crun `container`/`exec` children
          count as the container).
        - "pod": the oom cgroup is the victim's pod cgroup.
        - "cgroup": anything else, including every non-Kubernetes workload (a Slurm step or a systemd unit
          that hit its own limit is "cgroup": container and pod are Kubernetes notions).
        - "unknown": not global, and the log does not say which cgroup ran out (no `oom-kill:` summary, and
          nothing else placed it: a pasted kill line alone, a kill known only from its reaper line).
        """
        if constraint == "global":
            return "node"
        if oom_cgroup is None:
            return "unknown"  # which limit was hit is not in the log (no summary, no cgroup to tell it from)
        oom = normalize(oom_cgroup)
        if oom == "/" or self.is_kubepods_root(oom):
            return "node"
        if victim_cgroup is None:
            return "cgroup"
        victim = normalize(victim_cgroup)
        container = self.container_cgroup_of(victim)
        if container is not None and oom == container:
            return "container"
        pod = self.pod_cgroup_of(victim)
        if pod is not None and oom == pod:
            return "pod"
        return "cgroup"


# The layout of a kubelet with the default cgroupRoot ("/"): what the functions below answer. An agent that
# knows its kubelet's cgroupRoot uses its own CgroupLayout (WorkloadResolver.layout).
DEFAULT_LAYOUT = CgroupLayout()
identify = DEFAULT_LAYOUT.identify
kubepods_level = DEFAULT_LAYOUT.kubepods_level
is_kubepods_root = DEFAULT_LAYOUT.is_kubepods_root
pod_cgroup_of = DEFAULT_LAYOUT.pod_cgroup_of
container_cgroup_of = DEFAULT_LAYOUT.container_cgroup_of
scope_of = DEFAULT_LAYOUT.scope_of
