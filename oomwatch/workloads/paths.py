"""cgroup path → workload: who a cgroup belongs to, from its path alone.

Pure functions, no file access: a saved kernel log with no live cgroup tree must still name its victims.
Paths are relative to the cgroup v2 root and start with "/", exactly as the kernel prints them
(`oom_memcg=`, `task_memcg=`, `Tasks in … are going to be killed`).

Recognised layouts (see docs/kernel-facts.md, "Kubernetes" and "Slurm and systemd"):

- Kubernetes, cgroupfs driver:  `[<cgroupRoot>/]kubepods[/burstable|/besteffort]/pod<uid>/<container>`
- Kubernetes, systemd driver:
  `[<root>.slice/]kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid_>.slice/<container>`
  (with a `cgroupRoot` the systemd names carry its prefix: `kubelet.slice/kubelet-kubepods.slice/…`)
- containers: containerd `cri-containerd-<id>.scope` | `<id>`; CRI-O `crio-<id>.scope` | `crio-<id>`
  (`crio-conmon-<id>.scope` is CRI-O's monitor process, a pod-level helper, not the container);
  docker / cri-dockerd `docker-<id>.scope` | `<id>`. Anything below the container cgroup (crun's
  `container` / `exec` children) belongs to the container.
- Slurm cgroup/v2: `…/slurmstepd.scope/job_<id>/step_<name>/{user/task_<n>,slurm}`.
- systemd units: the deepest `.service` / `.scope` / `.slice` (and `.socket` / `.mount` / `.swap`) component.

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

# systemd driver: `kubepods.slice`, `kubepods-burstable.slice`, `kubepods-burstable-pod<uid_>.slice`,
# `kubepods-pod<uid_>.slice`, each possibly prefixed by a cgroupRoot name (`kubelet-kubepods.slice`).
_SYSTEMD_KUBEPODS = re.compile(
    r"^(?:[A-Za-z0-9_.@\\:-]+-)?kubepods"
    r"(?:-(?P<qos>burstable|besteffort))?"
    r"(?:-pod(?P<uid>[0-9A-Fa-f][0-9A-Fa-f_]*))?"
    r"\.slice$"
)
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


def normalize(cgroup_path: str) -> str:
    """`kubepods/x/` → `/kubepods/x`; "" → "/". Collapses repeated slashes."""
    parts = [p for p in cgroup_path.strip().split("/") if p]
    return "/" + "/".join(parts)


def _components(cgroup_path: str) -> list[str]:
    return [p for p in cgroup_path.strip().split("/") if p]


def _join(parts: list[str]) -> str:
    return "/" + "/".join(parts)


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


def _find_kubepods(parts: list[str]) -> Optional[int]:
    for i, part in enumerate(parts):
        if part == "kubepods":
            return i
        match = _SYSTEMD_KUBEPODS.match(part)
        if match and not match.group("qos") and not match.group("uid"):
            return i
    return None


def _kube_parts(parts: list[str]) -> Optional[_KubeParts]:
    root = _find_kubepods(parts)
    if root is None:
        return None
    i = root + 1
    qos: Optional[str] = None
    qos_index: Optional[int] = None
    pod_uid: Optional[str] = None
    pod_index: Optional[int] = None

    if i < len(parts):
        part = parts[i]
        systemd = _SYSTEMD_KUBEPODS.match(part)
        if part in _QOS_CLASSES:
            qos, qos_index, i = part, i, i + 1
        elif systemd and systemd.group("qos") and not systemd.group("uid"):
            qos, qos_index, i = systemd.group("qos"), i, i + 1

    if i < len(parts):
        part = parts[i]
        cgroupfs = _CGROUPFS_POD.match(part)
        systemd = _SYSTEMD_KUBEPODS.match(part)
        if cgroupfs:
            pod_uid, pod_index = cgroupfs.group("uid"), i
        elif systemd and systemd.group("uid") and systemd.group("qos") == qos:
            # systemd turns the UID's dashes into underscores (a dash is its hierarchy separator).
            pod_uid, pod_index = systemd.group("uid").replace("_", "-"), i
        if pod_index is not None:
            i += 1

    kube = _KubeParts(kubepods=root, qos=qos, qos_index=qos_index, pod_uid=pod_uid, pod_index=pod_index)
    if pod_index is None or i >= len(parts):
        return kube

    part = parts[i]
    conmon = _CRIO_CONMON.match(part)
    if conmon:
        return replace(kube, container_id=conmon.group("id"), container_index=i, runtime="cri-o", conmon=True)
    for pattern, runtime in _CONTAINER_PATTERNS:
        match = pattern.match(part)
        if match:
            return replace(kube, container_id=match.group("id"), container_index=i, runtime=runtime)
    return kube


# A storm names the same few cgroups over and over: the explanation and scope of each incident ask these.
@functools.lru_cache(maxsize=256)
def kubepods_level(cgroup_path: str) -> Optional[str]:
    """Where a path sits in the Kubernetes hierarchy: "node-allocatable" (the kubepods cgroup itself,
    whose memory.max is the node's allocatable memory), "qos" (burstable / besteffort), "pod",
    "container" (a container cgroup or anything below it), "conmon" (CRI-O's per-container monitor,
    a child of the pod), or None (not under kubepods, or an unrecognised child)."""
    parts = _components(cgroup_path)
    kube = _kube_parts(parts)
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


def is_kubepods_root(cgroup_path: str) -> bool:
    """True for the kubepods cgroup itself and its QoS-class children: a limit hit there is node
    memory pressure (node allocatable), not any one pod's limit."""
    return kubepods_level(cgroup_path) in (NODE_ALLOCATABLE, QOS)


def pod_cgroup_of(cgroup_path: str) -> Optional[str]:
    """The pod cgroup a path is in (the path itself when it is a pod cgroup), else None."""
    parts = _components(cgroup_path)
    kube = _kube_parts(parts)
    if kube is None or kube.pod_index is None:
        return None
    return _join(parts[: kube.pod_index + 1])


def container_cgroup_of(cgroup_path: str) -> Optional[str]:
    """The container cgroup a path is in: the path itself, or its ancestor when the path is a crun
    `container` / `exec` child (or deeper). None outside a container (conmon is not a container)."""
    parts = _components(cgroup_path)
    kube = _kube_parts(parts)
    if kube is None or kube.container_index is None or kube.conmon:
        return None
    return _join(parts[: kube.container_index + 1])


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
    for i, part in enumerate(parts):
        job = _SLURM_JOB.match(part)
        if not job:
            continue
        step = _SLURM_STEP.match(parts[i + 1]) if i + 1 < len(parts) else None
        under_slurm = any("slurm" in p for p in parts[:i])
        if not (step or under_slurm):
            continue  # a `job_1` cgroup that nothing says is Slurm's
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
    return None


def _identify_systemd(parts: list[str]) -> Optional[Workload]:
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        if any(part.endswith(suffix) and len(part) > len(suffix) for suffix in _SYSTEMD_UNIT_SUFFIXES):
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


@functools.lru_cache(maxsize=8192)  # pure: a path's identity never changes (an OOM storm asks again and again)
def identify(cgroup_path: str) -> Workload:
    """What the cgroup at `cgroup_path` belongs to, from the path alone (names come later, from the
    runtime and the API server). Never raises; an unrecognised path is type "other" with itself as
    its workload cgroup."""
    parts = _components(cgroup_path)
    kube = _kube_parts(parts)
    if kube is not None:
        return _identify_kubernetes(parts, kube)
    slurm = _identify_slurm(parts)
    if slurm is not None:
        return slurm
    unit = _identify_systemd(parts)
    if unit is not None:
        return unit
    return Workload(type="other", cgroup=_join(parts))


@functools.lru_cache(maxsize=256)
def scope_of(victim_cgroup: Optional[str], oom_cgroup: Optional[str], constraint: str) -> str:
    """docs/contract.md `scope`: where the limit was hit, relative to the victim's workload.

    - "node": a global OOM (constraint "global", or oom cgroup "/"; cpuset and mempolicy OOMs are not
      memcg OOMs and the kernel prints `global_oom` for them), and a memcg OOM at the kubepods cgroup
      (node allocatable) or at one of its QoS classes: the node ran short, not a pod.
    - "container": the oom cgroup is the victim's container cgroup (crun `container`/`exec` children
      count as the container).
    - "pod": the oom cgroup is the victim's pod cgroup.
    - "cgroup": anything else, including every non-Kubernetes workload (a Slurm step or a systemd unit
      that hit its own limit is "cgroup": container and pod are Kubernetes notions), and a memcg OOM
      whose cgroup is unknown (a ratelimited storm lost its `oom-kill:` summary).
    """
    if constraint == "global":
        return "node"
    if oom_cgroup is None:
        return "cgroup"
    oom = normalize(oom_cgroup)
    if oom == "/" or is_kubepods_root(oom):
        return "node"
    if victim_cgroup is None:
        return "cgroup"
    victim = normalize(victim_cgroup)
    container = container_cgroup_of(victim)
    if container is not None and oom == container:
        return "container"
    pod = pod_cgroup_of(victim)
    if pod is not None and oom == pod:
        return "pod"
    return "cgroup"
