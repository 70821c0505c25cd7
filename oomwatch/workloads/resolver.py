"""cgroup path → a named workload: identify() from the path, then names from the node and the API server.

The path says what kind of workload it is and carries the ids (container id, pod UID); RuntimeNames
turns the ids into container / pod / namespace names without the API server; `pods`, when there is API
access, adds the pod's controlling owner and training job: in the agent's pipeline, the identity stage's own
table of the pods the pod source's events told it of (never a live read of the API server). Each source is
optional and each only fills what is still unknown, so a saved log replayed on a laptop still gets its
path-level identity.

Which paths are Kubernetes' is the node's `CgroupLayout` (the kubelet's cgroupRoot): names are looked up
only for those, so a path spelt like a pod's elsewhere never gets a real pod's names (docs/contract.md,
"Identity").

Who may create a cgroup decides whether it is a workload of its own (docs/contract.md, "Identity"): a subtree
given to a user (its directory owned by someone other than the owner of the cgroup root: `user@UID.service`,
a rootless runtime, what `systemd-run --user` makes below them) is ONE workload at its delegation root, unless
the operator trusts delegated subtrees (`trust_delegated`). Kubernetes' and Slurm's cgroups are identified by
their place below the kubelet's root and slurmd's scope, whoever owns them. The live agent learns owners from
the tree (`owned`); a saved log replayed without a tree names units as its paths spell them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional

from oomwatch.model import PodInfo, Workload
from oomwatch.workloads.paths import CONTAINER, DEFAULT_LAYOUT, CgroupLayout, normalize
from oomwatch.workloads.runtime import ContainerNames, RuntimeNames

PodLookup = Callable[[str], Optional[PodInfo]]  # pod UID → what the API server said of it, or None


def _no_pods(pod_uid: str) -> Optional[PodInfo]:
    return None


class WorkloadResolver:
    """`layout` says which cgroups are the kubelet's (CgroupLayout(cgroupRoot); the default is a kubelet with
    cgroupRoot "/"). Its `identify`, `kubepods_level` and `scope_of` are this node's: use them, not the
    module-level functions of oomwatch.workloads.paths, wherever the agent asks who a path belongs to."""

    def __init__(
        self, runtime_names: Optional[RuntimeNames] = None, pods: Optional[PodLookup] = None, *,
        layout: CgroupLayout = DEFAULT_LAYOUT, trust_delegated: bool = False,
    ) -> None:
        self.runtime_names = runtime_names
        self.pods: PodLookup = pods or _no_pods  # the pipeline's identity stage gives its table's lookup
        self.layout = layout
        self.kubepods_level = layout.kubepods_level
        self.scope_of = layout.scope_of
        self.trust_delegated = trust_delegated
        self._root_owner = 0  # the cgroup root's owner (not 0 in a user namespace that does not map root)
        self._delegated: set[str] = set()  # delegation roots: owned by another user than the root's, parent not

    def owned(self, cgroup_path: str, owner: Optional[int]) -> None:
        """The directory of `cgroup_path` (found now, parents before children) is owned by uid `owner` (None:
        unknown, gone): a delegation root when that is not the cgroup root's owner and no ancestor is one."""
        if owner is None:
            return
        if cgroup_path == "/":
            self._root_owner = owner
        elif owner != self._root_owner and self.delegation_root(cgroup_path) is None:
            self._delegated.add(cgroup_path)

    def removed(self, cgroup_path: str) -> None:
        self._delegated.discard(cgroup_path)

    def delegation_root(self, cgroup_path: str) -> Optional[str]:
        """The delegated subtree's root `cgroup_path` is in (itself included), or None."""
        if not self._delegated:
            return None
        path = cgroup_path
        while len(path) > 1:
            if path in self._delegated:
                return path
            path = path.rsplit("/", 1)[0] or "/"
        return None

    def identify(self, cgroup_path: str) -> Workload:
        """What the cgroup at `cgroup_path` is (CgroupLayout.identify): in a delegated subtree that is not trusted,
        a systemd unit or other cgroup is its delegation root's workload."""
        workload = self.layout.identify(cgroup_path)
        if self.trust_delegated or workload.type not in ("systemd", "other"):
            return workload
        root = self.delegation_root(workload.cgroup)
        if root is None or root == workload.cgroup:
            return workload
        return self.layout.identify(root)  # (the root's unit, or a unit above it holding the whole subtree)

    def delegated(self, cgroup_path: str) -> bool:
        """A workload in a subtree a user was given (the cap keeps room for the others)."""
        return self.delegation_root(cgroup_path) is not None

    def resolve(self, cgroup_path: str) -> Workload:
        """The workload of a cgroup, with every name the node and the API server can give."""
        workload = self.identify(cgroup_path)
        if not workload.is_kubernetes:
            return workload
        changes: dict[str, Any] = {}

        names = self._names(workload)
        if names is not None:
            for key, value in (
                ("container", names.container),
                ("pod", names.pod),
                ("namespace", names.namespace),
                ("pod_uid", names.pod_uid),
                ("runtime", names.runtime),
            ):
                if value is not None and getattr(workload, key) is None:
                    changes[key] = value
            if names.is_sandbox:
                changes["sandbox"] = True
                changes.pop("container", None)

        pod_uid = changes.get("pod_uid", workload.pod_uid)
        info = self.pods(pod_uid) if pod_uid else None
        if info is not None:
            # The API server's names win only where the node had none.
            changes.setdefault("pod", info.name)
            changes.setdefault("namespace", info.namespace)
            if info.owner is not None:
                changes["owner"] = dict(info.owner)
            if info.job is not None:
                changes["job"] = dict(info.job)
        return replace(workload, **changes) if changes else workload

    def tmpfs_mounts(self, workload: Workload) -> tuple[str, ...]:
        """The container's tmpfs mounts that belong to its pod (memory-medium emptyDirs, the pod's /dev/shm), as
        its runtime's bundle said when it appeared (oomwatch.workloads.runtime.tmpfs_mounts); () when unknown."""
        if self.runtime_names is None or workload.type != "k8s-container":
            return ()
        names = self.runtime_names.lookup(workload.container_id, workload.pod_uid)
        return names.tmpfs_mounts if names is not None else ()

    def _names(self, workload: Workload) -> Optional[ContainerNames]:
        if self.runtime_names is None:
            return None
        if workload.type == "k8s-container":
            return self.runtime_names.lookup(workload.container_id, workload.pod_uid)
        return self.runtime_names.lookup(None, workload.pod_uid)

    def container_appeared(self, cgroup_path: str) -> Optional[ContainerNames]:
        """Called by the cgroup watcher for each new cgroup: when it is a container cgroup, read and keep
        the container's names now, while its runtime bundle still exists."""
        if self.runtime_names is None or self.kubepods_level(cgroup_path) != CONTAINER:
            return None
        workload = self.identify(cgroup_path)
        if workload.container_id is None or workload.cgroup != normalize(cgroup_path):
            return None  # a crun `container`/`exec` child: its container was remembered already
        return self.runtime_names.remember(workload.container_id)


