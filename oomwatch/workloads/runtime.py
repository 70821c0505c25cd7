"""Container and pod names from the node itself, without the API server.

Three sources, each a pure parser fed by a thin reader:

- the OCI bundle `config.json` the runtime writes for each container and sandbox: containerd
  (`<run>/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/config.json`, `io.kubernetes.cri.*`
  annotations) and CRI-O (`<run>/containers/storage/overlay-containers/<id>/userdata/config.json`,
  `io.kubernetes.pod.*` / `io.kubernetes.cri-o.*` annotations);
- the kubelet's log symlinks `/var/log/containers/<pod>_<namespace>_<container>-<id>.log` (every runtime,
  docker / cri-dockerd included);
- the kubelet's pod log directories `/var/log/pods/<namespace>_<pod>_<uid>/<container>/` (pod names by UID).

The bundle is deleted soon after a container dies, often before anyone asks who an OOM victim was, so
RuntimeNames reads names when a container appears (`remember`) and keeps them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional

from oomwatch.model import ContainerNames

log = logging.getLogger(__name__)

# containerd CRI plugin (pkg/cri/annotations); sandbox-uid since containerd 1.6.11 / 1.7.0.
CONTAINERD_CONTAINER_TYPE = "io.kubernetes.cri.container-type"
CONTAINERD_CONTAINER_NAME = "io.kubernetes.cri.container-name"
CONTAINERD_SANDBOX_NAME = "io.kubernetes.cri.sandbox-name"
CONTAINERD_SANDBOX_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
CONTAINERD_SANDBOX_UID = "io.kubernetes.cri.sandbox-uid"
CONTAINERD_SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
CONTAINERD_IMAGE_NAME = "io.kubernetes.cri.image-name"

# CRI-O: the kubelet's own keys (pkg/kubelet/types/labels.go) plus CRI-O's.
CRIO_CONTAINER_TYPE = "io.kubernetes.cri-o.ContainerType"
CRIO_CONTAINER_ID = "io.kubernetes.cri-o.ContainerID"
CRIO_SANDBOX_ID = "io.kubernetes.cri-o.SandboxID"
CRIO_IMAGE_NAME = "io.kubernetes.cri-o.ImageName"
CRIO_LABELS = "io.kubernetes.cri-o.Labels"  # JSON object of the CRI labels
KUBE_CONTAINER_NAME = "io.kubernetes.container.name"
KUBE_POD_NAME = "io.kubernetes.pod.name"
KUBE_POD_NAMESPACE = "io.kubernetes.pod.namespace"
KUBE_POD_UID = "io.kubernetes.pod.uid"

# Only names that cannot escape their directory are used to build paths.
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CONTAINER_LOG = re.compile(
    r"^(?P<pod>[^_/]+)_(?P<namespace>[^_/]+)_(?P<container>[^/]+)-(?P<id>[0-9a-f]{64})\.log$"
)
_MAX_CONFIG_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class PodLogDir:
    """`/var/log/pods/<namespace>_<pod>_<uid>`."""

    namespace: str
    pod: str
    pod_uid: str


@dataclass(frozen=True)
class ContainerLogName:
    """`/var/log/containers/<pod>_<namespace>_<container>-<id>.log`."""

    pod: str
    namespace: str
    container: str
    container_id: str


# --- pure parsers ------------------------------------------------------------------------------------


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def _id_from_cgroups_path(cgroups_path: Any) -> Optional[str]:
    """The container id at the end of an OCI `linux.cgroupsPath`: systemd form
    `kubepods-burstable-pod<uid>.slice:cri-containerd:<id>`, or cgroupfs `/kubepods/burstable/pod<uid>/<id>`.
    """
    if not isinstance(cgroups_path, str) or not cgroups_path:
        return None
    if ":" in cgroups_path and not cgroups_path.startswith("/"):
        tail = cgroups_path.rsplit(":", 1)[1]
    else:
        tail = cgroups_path.rstrip("/").rsplit("/", 1)[-1]
    for prefix in ("cri-containerd-", "crio-", "docker-"):
        if tail.startswith(prefix):
            tail = tail[len(prefix) :]
    if tail.endswith(".scope"):
        tail = tail[: -len(".scope")]
    return tail or None


def parse_oci_config(text: str, container_id: Optional[str] = None,
                     is_tmpfs: Optional[IsTmpfs] = None) -> Optional[ContainerNames]:
    """An OCI runtime `config.json` → the Kubernetes names in its annotations, for containerd and CRI-O.

    `container_id` overrides what the file says (the bundle directory is named after it); otherwise the id
    comes from CRI-O's annotation or the tail of `linux.cgroupsPath`. Returns None for text that is not a
    JSON object or carries no Kubernetes annotations (a plain `ctr run` container, a garbled file)."""
    try:
        spec = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(spec, dict):
        return None
    annotations = spec.get("annotations")
    if not isinstance(annotations, dict):
        return None
    linux = spec.get("linux")
    path_id = _id_from_cgroups_path(linux.get("cgroupsPath")) if isinstance(linux, dict) else None

    if CONTAINERD_CONTAINER_TYPE in annotations or CONTAINERD_SANDBOX_NAMESPACE in annotations:
        container_type = _text(annotations.get(CONTAINERD_CONTAINER_TYPE))
        sandbox_id = _text(annotations.get(CONTAINERD_SANDBOX_ID))
        is_sandbox = container_type == "sandbox"
        own_id = container_id or path_id or (sandbox_id if is_sandbox else None)
        return ContainerNames(
            container_id=own_id,
            container_type=container_type,
            container=None if is_sandbox else _text(annotations.get(CONTAINERD_CONTAINER_NAME)),
            pod=_text(annotations.get(CONTAINERD_SANDBOX_NAME)),
            namespace=_text(annotations.get(CONTAINERD_SANDBOX_NAMESPACE)),
            pod_uid=_text(annotations.get(CONTAINERD_SANDBOX_UID)),
            image=_text(annotations.get(CONTAINERD_IMAGE_NAME)),
            sandbox_id=sandbox_id,
            runtime="containerd",
            tmpfs_mounts=tmpfs_mounts(spec, is_tmpfs),
        )

    if CRIO_CONTAINER_TYPE in annotations or KUBE_POD_NAMESPACE in annotations:
        # The kubelet's labels are also kept, JSON-encoded, in io.kubernetes.cri-o.Labels: a fallback.
        labels: dict[str, Any] = {}
        try:
            decoded = json.loads(annotations.get(CRIO_LABELS) or "{}")
            if isinstance(decoded, dict):
                labels = decoded
        except (ValueError, TypeError, RecursionError):
            pass

        def pick(key: str) -> Optional[str]:
            return _text(annotations.get(key)) or _text(labels.get(key))

        container_type = _text(annotations.get(CRIO_CONTAINER_TYPE))
        name = pick(KUBE_CONTAINER_NAME)
        if container_type == "sandbox" or name == "POD":
            name = None  # the sandbox is not one of the pod's containers
        return ContainerNames(
            container_id=container_id or _text(annotations.get(CRIO_CONTAINER_ID)) or path_id,
            container_type=container_type,
            container=name,
            pod=pick(KUBE_POD_NAME),
            namespace=pick(KUBE_POD_NAMESPACE),
            pod_uid=pick(KUBE_POD_UID),
            image=_text(annotations.get(CRIO_IMAGE_NAME)),
            sandbox_id=_text(annotations.get(CRIO_SANDBOX_ID)),
            runtime="cri-o",
            tmpfs_mounts=tmpfs_mounts(spec, is_tmpfs),
        )
    return None


# The kubelet mounts an emptyDir from <root-dir>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>
# (pkg/volume/emptydir); with `medium: Memory` that directory is itself a tmpfs mount on the host.
EMPTY_DIR = "/volumes/kubernetes.io~empty-dir/"
# The pod's /dev/shm, a tmpfs the runtime makes per sandbox and binds into each container: containerd's
# <state>/io.containerd.grpc.v1.cri/sandboxes/<id>/shm, CRI-O's <storage>/overlay-containers/<id>/userdata/shm.
_SANDBOX_SHM = re.compile(r"/(?:sandboxes/[^/]+|overlay-containers/[^/]+/userdata)/shm$")
TMPFS_MAGIC = 0x01021994  # statfs(2) f_type of tmpfs (linux/magic.h)
MAX_TMPFS_MOUNTS = 8
IsTmpfs = Callable[[str], Optional[bool]]


def tmpfs_mounts(spec: Mapping[str, Any], is_tmpfs: Optional[IsTmpfs] = None) -> tuple[str, ...]:
    """The tmpfs mounts of an OCI spec that belong to the pod, as short phrases: the pod's /dev/shm
    ("the pod's /dev/shm"), and emptyDirs ("emptyDir \"dshm\" at /dev/shm") where `is_tmpfs(source)` says the
    volume is a tmpfs on the host (medium: Memory; a disk emptyDir is not memory). Without `is_tmpfs` (a pure
    parse) emptyDirs are left for the reader, which can look at the host (RuntimeNames). At most
    MAX_TMPFS_MOUNTS; names are cut to 63 characters (a volume name is a DNS label)."""
    mounts = spec.get("mounts")
    out: list[str] = []
    for mount in mounts if isinstance(mounts, list) else []:
        if not isinstance(mount, dict):
            continue
        source, destination = _text(mount.get("source")), _text(mount.get("destination"))
        if not source or not destination:
            continue
        destination = destination[:256]
        if _SANDBOX_SHM.search(source) and destination == "/dev/shm":
            out.append("the pod's /dev/shm")
        elif EMPTY_DIR in source and is_tmpfs is not None and is_tmpfs(source):
            name = source.rsplit(EMPTY_DIR, 1)[1].strip("/")[:63]
            if name and "/" not in name:
                out.append(f'emptyDir "{name}" at {destination}')
        if len(out) >= MAX_TMPFS_MOUNTS:
            break
    return tuple(out)


def host_is_tmpfs(proc_root: str = "/proc") -> IsTmpfs:
    """is_tmpfs for tmpfs_mounts: statfs of the path as the agent sees it, else through the host's root
    (`<proc>/1/root`, for an agent in a container with the host's pids); None when neither can be read."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86_64 and arm64; f_type comes first

    def is_tmpfs(path: str) -> Optional[bool]:
        for candidate in (path, f"{proc_root.rstrip('/')}/1/root{path}"):
            if libc.statfs(os.fsencode(candidate), buf) == 0:
                return ctypes.c_long.from_buffer(buf).value == TMPFS_MAGIC
        return None

    return is_tmpfs


def parse_pod_log_dir(name: str) -> Optional[PodLogDir]:
    """`<namespace>_<pod>_<uid>` (a directory name under /var/log/pods) → its parts. Namespaces, pod
    names and UIDs cannot contain "_", so the split is unambiguous."""
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    namespace, pod, uid = parts
    return PodLogDir(namespace=namespace, pod=pod, pod_uid=uid)


def parse_container_log_name(name: str) -> Optional[ContainerLogName]:
    """`<pod>_<namespace>_<container>-<64 hex id>.log` (a file name under /var/log/containers) → parts."""
    match = _CONTAINER_LOG.match(name)
    if not match:
        return None
    return ContainerLogName(
        pod=match.group("pod"),
        namespace=match.group("namespace"),
        container=match.group("container"),
        container_id=match.group("id"),
    )


# --- thin reader -------------------------------------------------------------------------------------


def _read_small(path: str) -> Optional[str]:
    """A file's text, or None when it is absent, unreadable, vanishing or absurdly large."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_CONFIG_BYTES + 1)
    except OSError:
        return None
    if len(data) > _MAX_CONFIG_BYTES:
        return None
    return data.decode("utf-8", errors="replace")


def _list_dir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


_NAME_FIELDS = (
    "container_type", "container", "pod", "namespace", "pod_uid", "image", "sandbox_id", "runtime",
)


def _merge(first: ContainerNames, second: Optional[ContainerNames]) -> ContainerNames:
    """`first`, with its unknown fields filled from `second`."""
    if second is None:
        return first
    changes = {
        key: getattr(second, key)
        for key in _NAME_FIELDS
        if getattr(first, key) is None and getattr(second, key) is not None
    }
    return replace(first, **changes) if changes else first


class RuntimeNames:
    """Container names read from the node, cached so they outlive the container's bundle.

    Thread-safe: the cgroup watcher calls `remember` as containers appear, the correlator calls `lookup`
    when an OOM names a victim. Missing, unreadable or garbled files are normal and give None."""

    def __init__(
        self,
        run_root: str = "/run",
        pod_log_root: str = "/var/log/pods",
        *,
        crio_root: Optional[str] = None,
        container_log_root: Optional[str] = None,
        max_entries: int = 8192,
        read_files: bool = True,
        is_tmpfs: Optional[IsTmpfs] = None,
    ) -> None:
        self.is_tmpfs = is_tmpfs  # tells memory-medium emptyDirs (host_is_tmpfs); None: they are not named
        # False: names only from `keep` (the pipeline's copy, which reads nothing: the cgroup source reads the
        # bundles and sends the names with its events).
        self.read_files = read_files
        self.containerd_root = os.path.join(run_root, "containerd", "io.containerd.runtime.v2.task", "k8s.io")
        self.crio_root = crio_root or os.path.join(run_root, "containers", "storage", "overlay-containers")
        self.pod_log_root = pod_log_root
        # /var/log/containers sits next to /var/log/pods.
        self.container_log_root = container_log_root or os.path.join(
            os.path.dirname(pod_log_root.rstrip("/")) or "/", "containers"
        )
        self._max_entries = max_entries
        self._cache: OrderedDict[str, ContainerNames] = OrderedDict()
        # Pod UID → (namespace, pod), learnt from any of its containers' bundles: names the pod cgroup too.
        self._pods: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._lock = threading.Lock()

    # -- reading ------------------------------------------------------------------------------------

    def _read_bundle(self, container_id: str) -> Optional[ContainerNames]:
        for path in (
            os.path.join(self.containerd_root, container_id, "config.json"),
            os.path.join(self.crio_root, container_id, "userdata", "config.json"),
        ):
            text = _read_small(path)
            if text is None:
                continue
            names = parse_oci_config(text, container_id=container_id, is_tmpfs=self.is_tmpfs)
            if names is not None:
                return names
        return None

    def _read_container_log(self, container_id: str) -> Optional[ContainerNames]:
        suffix = f"-{container_id}.log"
        for name in _list_dir(self.container_log_root):
            if not name.endswith(suffix):
                continue
            parsed = parse_container_log_name(name)
            if parsed is not None:
                return ContainerNames(
                    container_id=container_id,
                    container_type="container",
                    container=parsed.container,
                    pod=parsed.pod,
                    namespace=parsed.namespace,
                )
        return None

    def _read_pod_log_dir(self, pod_uid: str) -> Optional[PodLogDir]:
        suffix = f"_{pod_uid}"
        for name in _list_dir(self.pod_log_root):
            if name.endswith(suffix):
                parsed = parse_pod_log_dir(name)
                if parsed is not None and parsed.pod_uid == pod_uid:
                    return parsed
        return None

    def _read(self, container_id: str) -> Optional[ContainerNames]:
        names = self._read_bundle(container_id)
        if names is not None and (names.container is not None or names.is_sandbox):
            return names
        # No bundle (docker / cri-dockerd, or already gone): the kubelet's log symlink still names it.
        from_log = self._read_container_log(container_id)
        return from_log if names is None else _merge(names, from_log)

    # -- cache --------------------------------------------------------------------------------------

    def _store(self, names: ContainerNames) -> None:
        if names.container_id is None:
            return
        with self._lock:
            self._cache[names.container_id] = names
            self._cache.move_to_end(names.container_id)
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
            if names.pod_uid and names.pod and names.namespace:
                self._pods[names.pod_uid] = (names.namespace, names.pod)
                self._pods.move_to_end(names.pod_uid)
                while len(self._pods) > self._max_entries:
                    self._pods.popitem(last=False)

    def _cached(self, container_id: str) -> Optional[ContainerNames]:
        with self._lock:
            return self._cache.get(container_id)

    # -- public -------------------------------------------------------------------------------------

    def keep(self, names: ContainerNames) -> None:
        """Keep names read elsewhere (by the cgroup source, for the pipeline's copy)."""
        self._store(names)

    def remember(self, container_id: str) -> Optional[ContainerNames]:
        """Read the names of a container that just appeared and keep them. None when nothing says."""
        if not _SAFE_ID.match(container_id) or not self.read_files:
            return None
        names = self._read(container_id)
        if names is not None:
            self._store(names)
        return names

    def lookup(self, container_id: Optional[str], pod_uid: Optional[str] = None) -> Optional[ContainerNames]:
        """Names for a container (cache first, then the node's files), completed with the pod's namespace
        and name from /var/log/pods when only the pod UID says who it is."""
        names: Optional[ContainerNames] = None
        if container_id and _SAFE_ID.match(container_id):
            names = self._cached(container_id)
            if names is None:
                names = self.remember(container_id)
        pod_unnamed = names is None or names.pod is None or names.namespace is None
        if pod_uid and pod_unnamed:
            with self._lock:
                known = self._pods.get(pod_uid)
            if known is not None:
                from_pod = ContainerNames(container_id=container_id, namespace=known[0], pod=known[1], pod_uid=pod_uid)
                names = _merge(names, from_pod) if names is not None else from_pod
                pod_unnamed = False
        if pod_uid and _SAFE_ID.match(pod_uid) and pod_unnamed and self.read_files:
            pod_dir = self._read_pod_log_dir(pod_uid)
            if pod_dir is not None:
                from_logs = ContainerNames(
                    container_id=container_id, pod=pod_dir.pod, namespace=pod_dir.namespace, pod_uid=pod_uid
                )
                names = _merge(names, from_logs) if names is not None else from_logs
        if names is not None and pod_uid and names.pod_uid is None:
            names = replace(names, pod_uid=pod_uid)
        return names

    def forget(self, container_id: str) -> None:
        with self._lock:
            self._cache.pop(container_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)
