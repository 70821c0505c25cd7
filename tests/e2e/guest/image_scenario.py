"""Scenario k: the agent from the image scripts/build-image made, run under runc as the DaemonSet runs it.

Runs INSIDE the guest (imported by driver.py, which appends ImageAgent to SCENARIOS), in its own VM boot
(tests/e2e/test_image.py passes --only k_image_agent): the main boot's scenarios already fill its 9 minutes, so
in a run of every scenario this one does nothing and leaves no ground truth. The container's OCI config
is made here from daemonset/daemonset.yaml itself and the image's own config (entrypoint, env), the way a
kubelet and containerd would make it:
  - the root filesystem: the image's rootfs (as `umoci unpack` left it in .cache/image/bundle/rootfs) as the
    lower layer of an overlay, as containerd's overlayfs snapshotter does, mounted read-only in the container
    (readOnlyRootFilesystem);
  - the securityContext: uid/gid, capabilities (drop ALL, add SYSLOG: bounding, effective and permitted hold
    CAP_SYSLOG only), no_new_privs (allowPrivilegeEscalation: false), not privileged, so the device cgroup
    allows only runc's default devices and /dev/kmsg is refused;
  - hostPID: no pid namespace; its own network namespace (no hostNetwork), with loopback up as a CNI plugin
    leaves it; its own cgroup namespace, as containerd gives a pod on cgroup v2;
  - every volume: hostPath as a bind mount, read-only where the volumeMount says so; emptyDir as a tmpfs;
  - env: the image's, then the container's (spec.nodeName from the downward API = this guest's name);
  - the memory limit (requests = limits) as memory.max of a Guaranteed pod's container cgroup.
Not reproduced: the RuntimeDefault seccomp profile (runc gets none here), the CPU limit (under TCG a CPU
second is not a node's), the API server (OOMWATCH_KUBE_API is set to off: there is none in the guest).

Then a container is group-killed (with collateral) and another single-killed; the agent in the image must be
healthy, must have fallen back to syslog(2), and must publish both. A Prometheus server in the agent's network
namespace scrapes it, and every panel query of the dashboard is saved as a range (time series panels) or instant
query (tests/e2e/test_image.py checks that each returned data).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time


def _driver_module():
    """driver.py, whichever name it was loaded under (__main__ in the guest): this module is imported from it
    once its classes exist, and must use that very module (its log file, its constants)."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "driver.py")
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and os.path.abspath(path) == here and hasattr(module, "Scenario"):
            return module
    # Imported first (host-side tools): driver.py imports this module back at its end, and must get a complete
    # copy of it, not this one, half-run.
    me = sys.modules.pop(__name__, None)
    try:
        import driver
    finally:
        if me is not None:
            sys.modules.setdefault(__name__, me)
    return driver


d = _driver_module()

IMAGE_DIR = os.path.join(d.REPO, ".cache", "image")
DAEMONSET = os.path.join(d.REPO, "daemonset", "daemonset.yaml")
IMAGE_AGENT_PORT = 9717  # the DaemonSet's port, in the container's own network namespace
CLONE_NEWNET = 0x40000000


def asked_for_by_name(name: str) -> bool:
    """Whether the driver's --only names this scenario (or its letter)."""
    argv = sys.argv
    only = next((a.split("=", 1)[1] for a in argv if a.startswith("--only=")), None)
    if only is None and "--only" in argv[:-1]:
        only = argv[argv.index("--only") + 1]
    wanted = [s for s in (only or "").split(",") if s]
    return name in wanted or name.split("_")[0] in wanted
_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 1000, "M": 1000**2, "G": 1000**3}


def quantity_bytes(q: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]i?)?", str(q))
    if not m:
        raise ValueError(f"memory quantity {q!r}")
    return int(m.group(1)) * _UNITS.get(m.group(2) or "", 1)


def image_config(layout: str, tag: str) -> dict:
    """The OCI image config (Entrypoint, Cmd, Env, User) of `tag` in an OCI layout."""

    def blob(digest: str) -> dict:
        with open(os.path.join(layout, "blobs", *digest.split(":", 1))) as f:
            return json.load(f)

    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    (desc,) = [m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
    return blob(blob(desc["digest"])["config"]["digest"])["config"]


def pod_to_oci(pod_spec: dict, image: dict, rootfs: str, node_name: str, cgroups_path: str,
               env_override: dict) -> tuple[dict, list[dict]]:
    """The OCI runtime config a kubelet + containerd would give the pod's one container, and the hostPath
    volumes it mounts ({"path", "type"}, for the caller to prepare as the kubelet would)."""
    (c,) = pod_spec["containers"]
    sc = c.get("securityContext", {})
    privileged = bool(sc.get("privileged"))
    caps = [] if privileged else sorted("CAP_" + x for x in sc.get("capabilities", {}).get("add", []))
    assert privileged or sc.get("capabilities", {}).get("drop") == ["ALL"], "the DaemonSet drops ALL"
    env = {}
    for item in image.get("Env", []):
        k, _, v = item.partition("=")
        env[k] = v
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[e["name"]] = node_name
    env.update(env_override)
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    host_paths = []
    for vm in c.get("volumeMounts", []):
        vol = volumes[vm["name"]]
        if "hostPath" in vol:
            hp = vol["hostPath"]
            host_paths.append({"path": hp["path"], "type": hp.get("type", "")})
            opts = ["rbind", "ro" if vm.get("readOnly") else "rw"]
            mounts.append({"destination": vm["mountPath"], "type": "bind", "source": hp["path"], "options": opts})
        elif "emptyDir" in vol:
            opts = ["nosuid", "nodev", "mode=1777"]
            if vol["emptyDir"].get("sizeLimit"):
                opts.append(f"size={quantity_bytes(vol['emptyDir']['sizeLimit'])}")
            mounts.append({"destination": vm["mountPath"], "type": "tmpfs", "source": "tmpfs", "options": opts})
        else:
            raise ValueError(f"volume {vm['name']}: only hostPath and emptyDir are modelled")
    limits = c.get("resources", {}).get("limits", {})
    namespaces = [{"type": t} for t in ("mount", "ipc", "uts", "network", "cgroup")]
    if not pod_spec.get("hostPID"):
        namespaces.append({"type": "pid"})
    resources: dict = {"devices": [{"allow": False, "access": "rwm"}]}  # containerd's first rule
    if "memory" in limits:
        limit = quantity_bytes(limits["memory"])
        resources["memory"] = {"limit": limit, "swap": limit}
    config = {
        "ociVersion": "1.0.2",
        "process": {
            "user": {"uid": sc.get("runAsUser", 0), "gid": sc.get("runAsGroup", 0)},
            # Kubernetes `args` replace the image's Cmd; its Entrypoint stays
            "args": list(c.get("command") or image.get("Entrypoint") or []) + list(c.get("args") or image.get("Cmd") or []),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps, "inheritable": [], "ambient": []},
            "noNewPrivileges": sc.get("allowPrivilegeEscalation") is False,
            "oomScoreAdj": d.kubelet_oom_score_adj("guaranteed", None),
        },
        "root": {"path": rootfs, "readonly": bool(sc.get("readOnlyRootFilesystem"))},
        "hostname": node_name,
        "mounts": mounts,
        "linux": {
            "cgroupsPath": cgroups_path,
            "resources": resources,
            "namespaces": namespaces,
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }
    return config, host_paths


def in_netns(pid: int, fn, *args):
    """fn(*args) in a thread that joined `pid`'s network namespace (setns changes only the calling thread)."""
    out: dict = {}

    def run() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                out["error"] = OSError(ctypes.get_errno(), "setns")
                return
        finally:
            os.close(fd)
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


class NetnsPrometheus(d.Prometheus):
    """Debian's Prometheus in the agent container's network namespace (as a sidecar would be): it scrapes the
    agent at 127.0.0.1:9717 there."""

    def __init__(self, exe: str, out_dir: str, netns_pid: int):
        super().__init__(exe, out_dir)
        self.netns_pid = netns_pid
        self.data = f"{d.WORK}/prometheus-image"

    def start(self) -> dict:
        netns = os.open(f"/proc/{self.netns_pid}/ns/net", os.O_RDONLY)

        def enter() -> None:
            ctypes.CDLL(None, use_errno=True).setns(netns, CLONE_NEWNET)
            d._preexec_protect()

        shutil.rmtree(self.data, ignore_errors=True)
        os.makedirs(self.data)
        cfg = os.path.join(self.out_dir, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(self.config())
        cmd = [self.exe, f"--config.file={cfg}", f"--storage.tsdb.path={self.data}",
               f"--web.listen-address={d.PROM_ADDR}", "--log.level=info"]
        rec: dict = {"cmd": cmd, "mono": time.monotonic()}
        with open(self.log_path, "ab") as logf:
            # preexec_fn as the driver's own Prometheus: setns must happen in the child, before exec
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                         preexec_fn=enter, pass_fds=(netns,))  # noqa: PLW1509
        os.close(netns)
        rec["pid"] = self.proc.pid
        return rec

    def wait_ready(self, timeout: float) -> float | None:
        t = time.monotonic()
        while time.monotonic() - t < timeout and self.proc and self.proc.poll() is None:
            try:
                if in_netns(self.netns_pid, d.http_get, "/-/ready", 2, d.PROM_ADDR)[0] == 200:
                    return time.monotonic() - t
            except OSError:
                pass
            time.sleep(0.5)
        return None

    def api(self, path: str, **params) -> dict:
        return in_netns(self.netns_pid, lambda: d.Prometheus.api(self, path, **params))


class ImageAgent(d.Scenario):
    name = "k_image_agent"
    description = (
        "the agent from scripts/build-image's OCI image, run by runc with daemonset/daemonset.yaml's security "
        "context (read-only root, only CAP_SYSLOG, no_new_privs, not privileged, hostPID, read-only host "
        "mounts, own network and cgroup namespaces): healthy, reading the kernel log through syslog(2); a "
        "group kill with collateral and a single kill, both published by it; Prometheus scrapes it and every "
        "dashboard panel query is saved over time"
    )

    def setup(self):
        gt = self.gt
        with open(os.path.join(IMAGE_DIR, "image.json")) as f:
            image_meta = json.load(f)
        gt["image"] = image_meta
        image = image_config(image_meta["layout"], image_meta["tag"])
        gt["image_config"] = image
        import yaml  # the venv's PyYAML

        with open(DAEMONSET) as f:
            ds = yaml.safe_load(f)
        pod_spec = ds["spec"]["template"]["spec"]
        gt["daemonset_security_context"] = pod_spec["containers"][0].get("securityContext")
        gt["daemonset_resources"] = pod_spec["containers"][0].get("resources")

        # The image's rootfs under a writable overlay, as containerd's snapshotter gives it (runc makes the mount
        # points in it, then mounts it read-only); the rootfs itself stays as the build left it.
        ov = f"{d.WORK}/image-overlay"
        for sub in ("upper", "work", "merged"):
            os.makedirs(f"{ov}/{sub}", exist_ok=True)
        lower = os.path.join(image_meta["bundle"], "rootfs")
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={ov}/upper,workdir={ov}/work", f"{ov}/merged"],
                       check=True, capture_output=True, timeout=60)
        self.overlay = f"{ov}/merged"

        # The kubelet config file the DaemonSet mounts (type File): this node's policy.
        self.kubelet_config = "/var/lib/kubelet/config.yaml"
        self.made_kubelet_config = not os.path.exists(self.kubelet_config)
        if self.made_kubelet_config:
            os.makedirs(os.path.dirname(self.kubelet_config), exist_ok=True)
            d.wfile(self.kubelet_config, "apiVersion: kubelet.config.k8s.io/v1beta1\n"
                                         "kind: KubeletConfiguration\nsingleProcessOOMKill: false\n")

        node = os.uname().nodename or "oomwatch-e2e"
        p = self.pod("cgroupfs", "guaranteed", self.name + "/agent", "oomwatch", "oomwatch-x7k2q")
        agent = self.container(p, "containerd", "oomwatch", [], oom_score_adj=-997)
        # no API server in the guest: the one change to the DaemonSet's environment
        oci, host_paths = pod_to_oci(pod_spec, image, self.overlay, node, agent.cgroup, {"OOMWATCH_KUBE_API": "off"})
        oci["annotations"] = agent.annotations
        self.oci = oci
        agent.config = lambda: oci  # runc gets the pod's config, not the busybox one
        for hp in host_paths:  # what the kubelet checks or creates for each hostPath type
            if hp["type"] == "DirectoryOrCreate":
                os.makedirs(hp["path"], exist_ok=True)
            elif hp["type"] == "Directory" and not os.path.isdir(hp["path"]):
                raise RuntimeError(f"hostPath {hp['path']} (Directory) missing")
            elif hp["type"] == "File" and not os.path.isfile(hp["path"]):
                raise RuntimeError(f"hostPath {hp['path']} (File) missing")
            elif hp["type"] == "CharDevice" and not os.path.exists(hp["path"]):
                raise RuntimeError(f"hostPath {hp['path']} (CharDevice) missing")
        gt["host_paths"] = host_paths
        self.agent = agent
        agent.run()
        pid = agent.init_pid
        # loopback up in the pod's network namespace, as the CNI plugin does
        r = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "link", "set", "lo", "up"],
                           capture_output=True, text=True, timeout=30, check=False)
        gt["lo_up"] = r.returncode == 0 or r.stderr
        gt["agent_container"] = {"id": agent.id, "cgroup": agent.cgroup, "init_pid": pid, "start_mono": time.monotonic()}

        # Prometheus in the same network namespace, starting while the agent starts (~20 s each under TCG)
        self.prom = NetnsPrometheus(self.ctx.prometheus, self.dir, pid) if self.ctx.prometheus else None
        if self.prom:
            self.prom.node = node
            gt["prometheus"] = {"start": self.prom.start()}

        # the containers to kill: a group kill with collateral, a single kill
        p1 = self.pod("cgroupfs", "burstable", self.name + "/g", "vision", "train-3")
        p2 = self.pod("cgroupfs", "burstable", self.name + "/s", "shop", "cart-7d9c")
        self.group_hog = self.container(p1, "containerd", "trainer",
                                        d.sh(f"sleep 600 & sleep 601 & {d.WAIT_FIFO}; {d.HOG}; wait"),
                                        limit=48 << 20, oom_group=1, trigger=True)
        self.single_hog = self.container(p2, "containerd", "api", d.sh(f"sleep 600 & {d.WAIT_FIFO}; {d.HOG}; wait"),
                                         limit=48 << 20, oom_group=0, trigger=True)
        self.group_hog.run()
        self.single_hog.run()
        self.group_hog.wait_procs(3)
        self.single_hog.wait_procs(2)
        gt["expect"] = {"incidents": [
            {"scope": "container", "kind": "group", "victim_workload": self.group_hog.cgroup,
             "group_cgroup": self.group_hog.cgroup},
            {"scope": "container", "kind": "single", "victim_workload": self.single_hog.cgroup, "group_cgroup": None},
        ]}
        gt["cgroups_tracked"] = [self.group_hog.cgroup, self.single_hog.cgroup, p1["cgroup"], p2["cgroup"]]

    # the agent in the container, through its network namespace
    def image_get(self, path: str, timeout: float = 10) -> tuple[int, bytes]:
        return in_netns(self.agent.init_pid, d.http_get, path, timeout, f"127.0.0.1:{IMAGE_AGENT_PORT}")

    def image_json(self, path: str):
        try:
            code, body = self.image_get(path)
            return json.loads(body) if code == 200 else None
        except (OSError, ValueError):
            return None

    def wait_healthy(self, timeout: float) -> dict:
        rec: dict = {}
        t = self.gt["agent_container"]["start_mono"]
        while time.monotonic() - t < timeout:
            if self.agent.state() not in ("running", "created"):
                rec["error"] = f"container {self.agent.state()}"
                break
            try:
                code, body = self.image_get("/healthz", 5)
                rec["last"] = [code, body.decode(errors="replace")[:500]]
                if code == 200:
                    rec["healthy_after"] = time.monotonic() - t
                    break
            except OSError as e:
                rec["last"] = str(e)
            time.sleep(1)
        return rec

    def wait_published(self, kernel_incidents: list, timeout: float) -> list:
        t = time.monotonic()
        while True:
            incs = self.image_json("/incidents") or []
            got = [next((i for i in incs if d.incident_matches(i, k)), None) for k in kernel_incidents]
            if all(got) or time.monotonic() - t > timeout:
                return [{"seconds": time.monotonic() - t, "incident": g} for g in got]
            time.sleep(0.5)

    def process_view(self) -> dict:
        """How the kernel sees the agent process: credentials, capabilities, namespaces, its root mount."""
        pid = self.agent.init_pid
        status = {}
        for line in (d.rfile(f"/proc/{pid}/status") or "").splitlines():
            k, _, v = line.partition(":")
            if k in ("Name", "Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
                     "Seccomp"):
                status[k] = v.strip()
        root_mount = next((line for line in (d.rfile(f"/proc/{pid}/mountinfo") or "").splitlines()
                           if line.split()[4] == "/"), None)
        ns = {n: os.readlink(f"/proc/{pid}/ns/{n}") for n in ("pid", "net", "cgroup", "mnt")}
        mine = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("pid", "net", "cgroup", "mnt")}
        return {"pid": pid, "status": status, "root_mount": root_mount, "ns": ns, "driver_ns": mine,
                "cmdline": (d.rfile(f"/proc/{pid}/cmdline") or "").split("\0"),
                "exe": os.readlink(f"/proc/{pid}/exe"),
                "dmesg_restrict": (d.rfile("/proc/sys/kernel/dmesg_restrict") or "").strip()}

    def act(self):
        ctx, gt = self.ctx, self.gt
        a = gt["image_agent"] = {}
        a["health"] = self.wait_healthy(240)
        d.log(f"  image agent: {a['health']}")
        a["process"] = self.process_view()
        if self.prom:
            gt["prometheus"]["ready_after"] = self.prom.wait_ready(120)
        for name in ("trainer", "api"):  # the agent exports the containers (counters at 0) before their kills
            t = time.monotonic()
            while time.monotonic() - t < 60:
                code, body = self.image_get("/metrics", 30)
                if f'container="{name}"'.encode() in body:
                    break
                time.sleep(1)
        time.sleep(3)  # a few scrapes of the zeros
        self.t_wall_start = time.time() - 20
        kernel_all = []
        for key, hog in (("group", self.group_hog), ("single", self.single_hog)):
            seq0 = ctx.kmsg.last_seq()
            self.oom_and_observe(hog, cgroups=[hog.cgroup])
            kernel = ctx.kmsg.incidents_since(seq0)
            kernel_all += [{"seq": k.seq, "victim_pid": k.victim_pid, "summary": k.summary()} for k in kernel]
            a[f"{key}_published"] = self.wait_published(kernel, ctx.agent_wait * 2)
            d.log(f"  image agent published the {key} kill: {[p['incident'] is not None for p in a[key + '_published']]}")
        gt["kernel_incidents"] = kernel_all
        time.sleep(5)
        a["incidents"] = self.image_json("/incidents")
        # what the agent's container used, against the DaemonSet's memory limit (docs/deploy.md, "Sizing")
        a["cgroup"] = d.cg_snapshot(self.agent.cgroup)
        a["cgroup"]["memory.peak"] = (d.rfile(f"{d.CG}{self.agent.cgroup}/memory.peak") or "").strip() or None
        code, body = self.image_get("/healthz")
        a["healthz_end"] = [code, body.decode(errors="replace")]
        code, body = self.image_get("/metrics", 30)
        with open(os.path.join(self.dir, "image-agent-metrics.txt"), "wb") as f:
            f.write(body)
        state_dir = next((m["source"] for m in self.oci["mounts"] if m["destination"] == "/var/lib/oomwatch"), None)
        a["state_files"] = {}
        if state_dir and os.path.isdir(state_dir):
            for name in os.listdir(state_dir):
                a["state_files"][name] = d.rfile(os.path.join(state_dir, name))
        if self.prom:
            self.save_dashboard()

    def save_dashboard(self):
        """Every panel query of the dashboard over the scenario's time: range queries for time series panels,
        instant queries (with $__range = the scenario's length) for the others."""
        sys.path.insert(0, d.REPO)
        from tests.deploy.dashboard import prometheus_targets, substitute

        with open(d.DASHBOARD) as f:
            dashboard = json.load(f)
        end = time.time()
        start = self.t_wall_start
        span = int(end - start) + 1
        variables = {"node": ".*", "namespace": ".*", "pod": ".*", "__rate_interval": "30s",
                     "__range": f"{span}s", "__interval": "2s"}
        out: dict = {"start": start, "end": end, "step": 2, "variables": variables, "panels": [],
                     "node": self.prom.node}
        for panel in dashboard["panels"]:
            entry = {"id": panel.get("id"), "title": panel.get("title"), "type": panel.get("type"), "targets": []}
            for target in prometheus_targets(panel):  # the logs panel's LogQL is Loki's (tests/deploy/dashboard.py)
                expr = substitute(target["expr"], variables)
                if panel.get("type") == "timeseries":
                    r = self.prom.api("/api/v1/query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                                      step="2")
                else:
                    r = self.prom.api("/api/v1/query", query=expr, time=f"{end:.3f}")
                entry["targets"].append({"expr": expr, "legendFormat": target.get("legendFormat"),
                                         "status": r.get("status"), "error": r.get("error"),
                                         "resultType": (r.get("data") or {}).get("resultType"),
                                         "result": (r.get("data") or {}).get("result")})
            out["panels"].append(entry)
        d.jdump(os.path.join(self.dir, "dashboard-range.json"), out)
        empty = [p["title"] for p in out["panels"] if any(not t["result"] for t in p["targets"])]
        d.log(f"  dashboard over time: {len(out['panels'])} panels, without data: {empty}")

    def finish(self):
        a = self.gt.setdefault("image_agent", {})
        if getattr(self, "prom", None):
            self.prom.stop()
        agent = getattr(self, "agent", None)
        if agent is not None and agent.started:
            agent.kill("TERM")
            t = time.monotonic()
            while agent.state() == "running" and time.monotonic() - t < 30:
                time.sleep(0.5)
            a["state_after_sigterm"] = agent.state()
            a["stop_seconds"] = time.monotonic() - t
            log_path = f"{self.dir}/runc-{agent.id[:12]}.log"  # the container's stdout and stderr
            a["log"] = (d.rfile(log_path) or "")[-20000:]

    def execute(self) -> dict:
        if not asked_for_by_name(self.name):  # its own boot only (see the module's docstring)
            os.rmdir(self.dir)
            return {"name": self.name, "errors": [], "skipped": "runs in its own VM boot"}
        gt = super().execute()  # deletes the containers: then the overlay can go
        if getattr(self, "overlay", None):
            subprocess.run(["umount", self.overlay], capture_output=True, timeout=60, check=False)
        if getattr(self, "made_kubelet_config", False):
            os.unlink(self.kubelet_config)
        return gt
