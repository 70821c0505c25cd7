"""Kustomize base and Helm chart: render with the real kubectl and helm, validate every object against
the Kubernetes schemas, and check the DaemonSet's security settings one by one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from .conftest import (
    AGENT_ENV,
    CHART,
    HELM_IMAGE,
    HELM_VARIANTS,
    KUSTOMIZE_BASE,
    by_kind,
    kustomize_with_components,
    one,
    run,
    tool,
)

pytestmark = pytest.mark.tools

# Oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the kubectl we render with.
K8S_VERSIONS = ("1.25.0", "1.35.0")
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
BASE_OBJECTS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "DaemonSet",
    "Service",
    "ServiceMonitor",
    "PrometheusRule",
}


# --- rendering -------------------------------------------------------------------------------


def test_kustomize_base_renders_every_object(kustomize_base) -> None:
    assert {o["kind"] for o in kustomize_base} == BASE_OBJECTS
    for obj in kustomize_base:
        if obj["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
            assert obj["metadata"]["namespace"] == "oomwatch", obj["kind"]


def test_kustomize_component_without_prometheus_operator(tmp_path) -> None:
    objects = kustomize_with_components(tmp_path, "no-prometheus-operator")
    assert {o["kind"] for o in objects} == BASE_OBJECTS - CRD_KINDS


def test_kustomize_component_privileged_kmsg(tmp_path) -> None:
    ds = one(kustomize_with_components(tmp_path, "privileged-kmsg"), "DaemonSet")
    sc = container(ds)["securityContext"]
    assert sc["privileged"] is True
    # Kubernetes rejects allowPrivilegeEscalation=false with privileged=true.
    assert "allowPrivilegeEscalation" not in sc
    validate(ds)


@pytest.mark.parametrize("strict", [False, True], ids=["lint", "lint-strict"])
@pytest.mark.parametrize("variant", list(HELM_VARIANTS))
def test_helm_lint(variant: str, strict: bool) -> None:
    args = [tool("helm"), "lint", str(CHART)]
    for s in (HELM_IMAGE, *HELM_VARIANTS[variant]):
        args += ["--set", s]
    if strict:
        args.append("--strict")
    out = run(args)
    assert "0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout, out.stdout


def test_helm_defaults_leave_operator_objects_out(helm_renders) -> None:
    kinds = {o["kind"] for o in helm_renders["defaults"]}
    assert kinds == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "Service"}
    kinds = {o["kind"] for o in helm_renders["monitoring"]}
    assert CRD_KINDS <= kinds


def test_helm_rejects_unknown_kube_api_mode() -> None:
    out = run([tool("helm"), "template", "x", str(CHART), "--set", HELM_IMAGE, "--set", "kubeApi.mode=maybe"],
              check=False)
    assert out.returncode != 0 and "kubeApi.mode must be auto or off" in out.stderr


def test_helm_without_an_image_says_how_to_set_one() -> None:
    """No image is published, so the chart has no default: installing without one stops with the fix."""
    out = run([tool("helm"), "template", "x", str(CHART)], check=False)
    assert out.returncode != 0
    assert "image.repository is not set" in out.stderr and "--set image.repository=REGISTRY/oomwatch" in out.stderr


def test_kustomize_image_is_a_placeholder_that_cannot_pull(kustomize_base) -> None:
    """The base names an image on the reserved .invalid domain (RFC 2606): it never pulls someone else's
    image, and the pod's ErrImagePull shows the name, which says what to do."""
    image = container(one(kustomize_base, "DaemonSet"))["image"]
    host, _, rest = image.partition("/")
    assert host.endswith(".invalid") and "set-image" in rest and "docs-release-md" in rest, image


# --- schema validation -----------------------------------------------------------------------


def validate(obj: dict[str, Any]) -> None:
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            # kubernetes-validate has no Prometheus Operator CRD schemas; those objects are checked by
            # hand below (and the PrometheusRule's rules by promtool in test_deploy_rules).
            assert obj["kind"] in CRD_KINDS, f"no schema for {obj['kind']}"
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {version}: {e.message}")


def test_kustomize_objects_validate(kustomize_base) -> None:
    for obj in kustomize_base:
        validate(obj)


@pytest.mark.parametrize("variant", list(HELM_VARIANTS))
def test_helm_objects_validate(helm_renders, variant: str) -> None:
    for obj in helm_renders[variant]:
        validate(obj)


# --- DaemonSet security ----------------------------------------------------------------------


def container(ds: dict[str, Any]) -> dict[str, Any]:
    containers = ds["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def hardened_daemonsets(kustomize_base, helm_renders) -> list[tuple[str, dict[str, Any]]]:
    out = [("kustomize", one(kustomize_base, "DaemonSet"))]
    for variant in HELM_VARIANTS:
        if variant != "privileged":
            out.append((f"helm-{variant}", one(helm_renders[variant], "DaemonSet")))
    return out


@pytest.fixture(scope="module")
def daemonsets(kustomize_base, helm_renders) -> list[tuple[str, dict[str, Any]]]:
    return hardened_daemonsets(kustomize_base, helm_renders)


def test_tolerates_every_taint(daemonsets) -> None:
    for name, ds in daemonsets:
        assert {"operator": "Exists"} in ds["spec"]["template"]["spec"]["tolerations"], name


def test_priority_class_system_node_critical(daemonsets) -> None:
    for name, ds in daemonsets:
        assert ds["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical", name


def test_guaranteed_qos(daemonsets) -> None:
    for name, ds in daemonsets:
        res = container(ds)["resources"]
        for r in ("cpu", "memory"):
            assert res["requests"][r] == res["limits"][r], (name, r)


def test_not_privileged(daemonsets) -> None:
    for name, ds in daemonsets:
        assert container(ds)["securityContext"]["privileged"] is False, name


def test_capabilities_drop_all_add_syslog(daemonsets) -> None:
    for name, ds in daemonsets:
        caps = container(ds)["securityContext"]["capabilities"]
        assert caps["drop"] == ["ALL"], name
        expected = ["SYSLOG", "NET_ADMIN"] if name == "helm-proc-connector" else ["SYSLOG"]
        assert caps["add"] == expected, name


def test_net_admin_and_host_network_only_with_proc_connector(daemonsets) -> None:
    for name, ds in daemonsets:
        spec = ds["spec"]["template"]["spec"]
        if name == "helm-proc-connector":
            assert spec["hostNetwork"] is True
            assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        else:
            assert not spec.get("hostNetwork"), name
            assert "NET_ADMIN" not in container(ds)["securityContext"]["capabilities"]["add"], name


def test_read_only_root_filesystem(daemonsets) -> None:
    for name, ds in daemonsets:
        assert container(ds)["securityContext"]["readOnlyRootFilesystem"] is True, name


def test_no_privilege_escalation(daemonsets) -> None:
    for name, ds in daemonsets:
        assert container(ds)["securityContext"]["allowPrivilegeEscalation"] is False, name


def test_runs_as_root_on_purpose(daemonsets) -> None:
    """uid 0 (CAP_SYSLOG must be effective; see the manifest's comment), said explicitly."""
    for name, ds in daemonsets:
        sc = container(ds)["securityContext"]
        assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False, name


def test_seccomp_runtime_default(daemonsets) -> None:
    for name, ds in daemonsets:
        assert ds["spec"]["template"]["spec"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name


def test_host_pid_with_reason(daemonsets) -> None:
    for name, ds in daemonsets:
        assert ds["spec"]["template"]["spec"]["hostPID"] is True, name
    for text in (
        (KUSTOMIZE_BASE / "daemonset.yaml").read_text(),
        (CHART / "templates/daemonset.yaml").read_text(),
    ):
        before = text.split("hostPID: true")[0].splitlines()[-3:]
        assert any("/proc/<pid>/cgroup" in line for line in before), "hostPID needs a comment saying why"


def host_paths(ds: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = ds["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in container(ds)["volumeMounts"]}
    assert set(mounts) == set(vols), "every volume mounted, every mount backed by a volume"
    return {
        v["hostPath"]["path"]: {"type": v["hostPath"].get("type"), **mounts[name]}
        for name, v in vols.items()
        if "hostPath" in v
    }


def test_host_paths_read_only_but_state_dir(daemonsets) -> None:
    for name, ds in daemonsets:
        paths = host_paths(ds)
        assert paths["/var/lib/oomwatch"].get("readOnly") is not True, name
        for path, m in paths.items():
            if path != "/var/lib/oomwatch":
                assert m.get("readOnly") is True, (name, path)


def test_expected_host_paths(daemonsets) -> None:
    for name, ds in daemonsets:
        paths = host_paths(ds)
        assert paths["/sys/fs/cgroup"]["type"] == "Directory"
        assert paths["/dev/kmsg"]["type"] == "CharDevice"
        assert paths["/dev/kmsg"]["mountPath"] == "/dev/kmsg"
        assert "/run/containerd/io.containerd.runtime.v2.task" in paths, name
        assert "/run/containers/storage" in paths, name
        assert "/var/log/pods" in paths, name
        assert paths["/var/lib/kubelet/config.yaml"]["type"] == "File", name
        # Never the kubelet's whole directory: it holds every pod's Secret volumes.
        assert "/var/lib/kubelet" not in paths, name
        assert paths["/var/lib/oomwatch"]["type"] == "DirectoryOrCreate", name


def env(ds: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container(ds)["env"]}


def test_node_name_from_downward_api(daemonsets) -> None:
    for name, ds in daemonsets:
        node = env(ds)["OOMWATCH_NODE_NAME"]
        assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", name


def test_env_names_are_agent_options(daemonsets) -> None:
    for name, ds in daemonsets:
        assert set(env(ds)) <= AGENT_ENV, (name, set(env(ds)) - AGENT_ENV)


def test_env_points_into_mounts(daemonsets) -> None:
    """Every path the agent is told to read is where the DaemonSet mounts the host's."""
    for _name, ds in daemonsets:
        e = {k: v.get("value") for k, v in env(ds).items()}
        mounts = {m["mountPath"] for m in container(ds)["volumeMounts"]}
        assert e["OOMWATCH_CGROUP_ROOT"] in mounts
        assert e["OOMWATCH_KMSG"] in mounts
        assert e["OOMWATCH_STATE_DIR"] in mounts
        assert e["OOMWATCH_POD_LOG_DIR"] in mounts
        assert e["OOMWATCH_KUBELET_CONFIG"] in mounts
        assert e["OOMWATCH_RUN_ROOT"] + "/containerd/io.containerd.runtime.v2.task" in mounts
        assert e["OOMWATCH_RUN_ROOT"] + "/containers/storage" in mounts
        assert e["OOMWATCH_PROC"] == "/proc"  # hostPID: the container's /proc is the host's pid namespace
        assert e["OOMWATCH_LISTEN"].endswith(":9717")


def test_metrics_port_and_probes(daemonsets) -> None:
    for name, ds in daemonsets:
        c = container(ds)
        assert {"name": "metrics", "containerPort": 9717, "protocol": "TCP"} in c["ports"], name
        # Liveness never on /healthz: "starting" and over-cap are not mended by a restart (issue 31).
        for probe, path in (("readinessProbe", "/healthz"), ("livenessProbe", "/livez")):
            assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}, (name, probe)


def test_runs_the_agent(daemonsets) -> None:
    for name, ds in daemonsets:
        c = container(ds)
        assert c["args"] == ["agent"] and "command" not in c, name


def test_kube_api_auto_mounts_token_and_binds_rbac(kustomize_base, helm_renders) -> None:
    for objects in (kustomize_base, helm_renders["defaults"]):
        ds = one(objects, "DaemonSet")
        assert env(ds)["OOMWATCH_KUBE_API"]["value"] == "auto"
        assert env(ds)["OOMWATCH_POD_EVENTS"]["value"] == "true"
        assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
        sa = one(objects, "ServiceAccount")
        assert ds["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]
        binding = one(objects, "ClusterRoleBinding")
        assert binding["roleRef"]["name"] == one(objects, "ClusterRole")["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "oomwatch"}
        ]


def test_kube_api_off_has_no_token_and_no_rbac(helm_renders) -> None:
    objects = helm_renders["kubeapi-off"]
    ds = one(objects, "DaemonSet")
    assert env(ds)["OOMWATCH_KUBE_API"]["value"] == "off"
    assert env(ds)["OOMWATCH_POD_EVENTS"]["value"] == "false"
    assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "ClusterRoleBinding")


def test_rbac_rules(kustomize_base, helm_renders) -> None:
    expected = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    for objects in (kustomize_base, helm_renders["defaults"]):
        assert one(objects, "ClusterRole")["rules"] == expected


def test_helm_pod_events_off_drops_events_permissions() -> None:
    from .conftest import helm_template

    objects = helm_template("kubeApi.podEvents=false")
    assert env(one(objects, "DaemonSet"))["OOMWATCH_POD_EVENTS"]["value"] == "false"
    assert one(objects, "ClusterRole")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]


def test_env_names_match_the_agent_cli(daemonsets) -> None:
    """Every OOMWATCH_* variable the manifests set is one the real `oomwatch agent` reads."""
    import click

    from oomwatch import cli

    agent = cli.main.commands.get("agent") if isinstance(cli.main, click.Group) else None
    assert agent is not None, "oomwatch.cli has no `agent` command"
    envvars = {p.envvar for p in agent.params if isinstance(p.envvar, str)}
    assert AGENT_ENV <= envvars, AGENT_ENV - envvars
    for name, ds in daemonsets:
        assert set(env(ds)) <= envvars, (name, set(env(ds)) - envvars)


def test_helm_privileged_value(helm_renders) -> None:
    sc = container(one(helm_renders["privileged"], "DaemonSet"))["securityContext"]
    assert sc["privileged"] is True and "allowPrivilegeEscalation" not in sc


def test_namespace_pod_security_admission(kustomize_base) -> None:
    labels = one(kustomize_base, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


# --- Service and ServiceMonitor --------------------------------------------------------------


@pytest.mark.parametrize("source", ["kustomize", "helm"])
def test_service_and_servicemonitor_select_the_agent(kustomize_base, helm_renders, source: str) -> None:
    objects = kustomize_base if source == "kustomize" else helm_renders["monitoring"]
    ds, svc, sm = one(objects, "DaemonSet"), one(objects, "Service"), one(objects, "ServiceMonitor")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9717, "targetPort": "metrics", "protocol": "TCP"}]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    [endpoint] = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    # The workload's namespace/pod/container labels must survive the scrape.
    assert endpoint["honorLabels"] is True
    relabel = endpoint["relabelings"][0]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_node_name"] and relabel["targetLabel"] == "node"
    # The job label must match the alerts' up{job=~".*oomwatch.*"}.
    assert "oomwatch" in svc["metadata"]["labels"][sm["spec"]["jobLabel"]]


# --- the two renderings agree ----------------------------------------------------------------


def test_helm_and_kustomize_daemonsets_agree(kustomize_base, helm_renders) -> None:
    k, h = one(kustomize_base, "DaemonSet"), one(helm_renders["defaults"], "DaemonSet")
    kc, hc = container(k), container(h)
    assert kc["securityContext"] == hc["securityContext"]
    assert kc["resources"] == hc["resources"]
    assert kc["readinessProbe"] == hc["readinessProbe"] and kc["livenessProbe"] == hc["livenessProbe"]
    assert {m["mountPath"]: m.get("readOnly") for m in kc["volumeMounts"]} == {
        m["mountPath"]: m.get("readOnly") for m in hc["volumeMounts"]
    }
    assert host_paths(k).keys() == host_paths(h).keys()
    ke, he = env(k), env(h)
    for name in ke:
        assert ke[name] == he[name], name
    for key in ("hostPID", "tolerations", "priorityClassName", "securityContext", "automountServiceAccountToken"):
        assert k["spec"]["template"]["spec"][key] == h["spec"]["template"]["spec"][key], key


def test_helm_values_reach_the_daemonset(tmp_path: Path) -> None:
    from .conftest import helm_template

    objects = helm_template(
        "image.repository=registry.example/oomwatch",
        "image.tag=9.9.9",
        "nodeSelector.pool=gpu",
        "resources.requests.cpu=200m",
        "resources.limits.cpu=200m",
        "hostPaths.kubeletConfig=",
        "containerRuntimes.crio=false",
        "port=9999",
    )
    ds = one(objects, "DaemonSet")
    c = container(ds)
    assert c["image"] == "registry.example/oomwatch:9.9.9"
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert c["resources"]["requests"]["cpu"] == c["resources"]["limits"]["cpu"] == "200m"
    assert "/var/lib/kubelet/config.yaml" not in host_paths(ds)
    assert "OOMWATCH_KUBELET_CONFIG" not in env(ds)
    assert "/run/containers/storage" not in host_paths(ds)
    assert env(ds)["OOMWATCH_LISTEN"]["value"] == "0.0.0.0:9999"
    assert one(objects, "Service")["spec"]["ports"][0]["port"] == 9999
    v6 = container(one(helm_template("listenHost=::"), "DaemonSet"))
    assert {e["name"]: e.get("value") for e in v6["env"]}["OOMWATCH_LISTEN"] == "[::]:9717"


# --- sizing (docs/deploy.md, "Sizing") ---------------------------------------------------------------


def sized_memory_mib(containers: int) -> int:
    """docs/deploy.md: 96 MiB + 64 KiB per container, rounded up to 16 MiB."""
    mib = 96 + -(-containers * 64 // 1024)
    return -(-mib // 16) * 16


@pytest.mark.parametrize("containers", [100, 1000, 5000])
def test_helm_resources_follow_the_container_count(containers: int) -> None:
    from .conftest import helm_template

    res = container(one(helm_template(f"sizing.containers={containers}"), "DaemonSet"))["resources"]
    want = {"cpu": "1", "memory": f"{sized_memory_mib(containers)}Mi"}
    assert res == {"requests": want, "limits": want}


def test_defaults_do_not_throttle_a_scrape_at_1000_containers(kustomize_base, helm_renders) -> None:
    """A scrape is one thread: a CPU limit under one core throttles it (CFS quota per 100 ms period) as soon as
    it runs longer than limit x 100 ms, which a 1,000-container scrape does (about 0.5 s of CPU)."""
    for ds in (one(kustomize_base, "DaemonSet"), one(helm_renders["defaults"], "DaemonSet")):
        limits = container(ds)["resources"]["limits"]
        cpu = limits["cpu"]
        cores = int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
        assert cores >= 1, limits
        assert limits["memory"] == f"{sized_memory_mib(1000)}Mi"


def test_helm_resources_override_key_by_key() -> None:
    from .conftest import helm_template

    res = container(one(helm_template("resources.requests.memory=1Gi", "resources.limits.memory=1Gi"),
                        "DaemonSet"))["resources"]
    assert res == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
