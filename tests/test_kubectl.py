"""`kubectl oomwatch why` against a local fake API server (real lightkube, real sockets, a real kubeconfig
file): the pod, its node, the agent pod on that node, the agent's /incidents through the pod proxy path. The
agent's answer is the golden agent output of a real group kill (fixtures/golden/k8s-runc) plus four kills
outside Kubernetes (fixtures/golden/memcg-scenarios)."""

from __future__ import annotations

import json
import re
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from oomwatch import kubectl
from oomwatch.kubectl import AGENT_SELECTOR, Agent, kubeconfig_path, pick_agent, pod_incidents, proxy_path
from tests.fakeapi import FakeApiServer

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "fixtures" / "golden"
INCIDENTS = (json.loads((GOLDEN / "k8s-runc" / "expected-incidents.json").read_text())
             + json.loads((GOLDEN / "memcg-scenarios" / "expected-incidents.json").read_text()))
NODE = "gpu-node-7"

# The pod of the golden kill (ml/train-0, container trainer), as the API server shows it after the kill.
TRAIN_POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "train-0", "namespace": "ml", "uid": "0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f"},
    "spec": {"nodeName": NODE, "containers": [{"name": "trainer", "image": "busybox"}]},
    "status": {"phase": "Running", "containerStatuses": [{
        "name": "trainer", "image": "busybox", "imageID": "", "ready": True, "restartCount": 1,
        "state": {"running": {"startedAt": "2026-11-22T20:40:12Z"}},
        "lastState": {"terminated": {
            "exitCode": 137, "reason": "OOMKilled",
            "startedAt": "2026-11-22T20:31:02Z", "finishedAt": "2026-11-22T20:40:10Z"}},
    }]},
}


def agent_pod(name: str, node: str, phase: str = "Running", namespace: str = "oomwatch",
              daemonset: str | None = "oomwatch", labels: dict[str, str] | None = None,
              created: str = "2026-11-22T19:00:00Z") -> dict[str, Any]:
    """An agent pod as the Kustomize base's DaemonSet makes it (its pod template's labels and ports, the
    DaemonSet controller's ownerReference); `daemonset` None: a pod no DaemonSet controls."""
    ds = yaml.safe_load((ROOT / "daemonset" / "daemonset.yaml").read_text())
    template = ds["spec"]["template"]
    owners = [] if daemonset is None else [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": daemonset,
                                            "uid": f"uid-{daemonset}", "controller": True,
                                            "blockOwnerDeletion": True}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {**template["metadata"]["labels"], **(labels or {})},
                         "creationTimestamp": created, "ownerReferences": owners},
            "spec": {"nodeName": node, "containers": [
                {"name": c["name"], "image": "registry.example/oomwatch:0.1.0", "ports": c.get("ports", [])}
                for c in template["spec"]["containers"]]},
            "status": {"phase": phase}}


def cluster_pods() -> list[dict[str, Any]]:
    return [TRAIN_POD, agent_pod("oomwatch-x7k2p", NODE), agent_pod("oomwatch-a1b2c", "cpu-node-1")]


@pytest.fixture(autouse=True)
def plain_environment(monkeypatch) -> None:
    # No proxy may route 127.0.0.1 elsewhere, and the output's width is not the terminal's.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("KUBECONFIG", raising=False)


def why(kubeconfig: Path, *args: str):
    return CliRunner().invoke(kubectl.main, ["why", *args, "--kubeconfig", str(kubeconfig), "--no-color"])


def test_why_explains_the_pods_kill_as_inspect_does(tmp_path: Path) -> None:
    with FakeApiServer(cluster_pods(), incidents={"oomwatch-x7k2p": INCIDENTS}) as api:
        result = why(api.kubeconfig(tmp_path / "config"), "train-0", "-n", "ml")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"Pod ml/train-0 on node {NODE}, agent oomwatch/oomwatch-x7k2p"
    assert lines[1] == ("  Kubernetes: container trainer last terminated OOMKilled at 2026-11-22 20:40:10Z "
                        "(exit code 137, restarts 1)")
    assert lines[3] == "Recent OOM kills (1, newest first)"
    # The kill itself, line for line as `oomwatch inspect` printed it on the node (the golden report).
    inspect = (GOLDEN / "k8s-runc" / "expected-inspect.txt").read_text().splitlines()
    start = inspect.index("  2026-11-22 20:40:09Z  GROUP kill, scope container, 2 killed")
    assert lines[4:] == inspect[start:]

    pod_get, agents_list, proxy = api.requests
    assert pod_get["path"] == "/api/v1/namespaces/ml/pods/train-0"
    assert agents_list["path"] == "/api/v1/namespaces/oomwatch/pods"  # the agent's namespace only
    assert agents_list["query"]["fieldSelector"] == f"spec.nodeName={NODE}"
    assert agents_list["query"]["labelSelector"] == AGENT_SELECTOR
    assert proxy["path"] == "/api/v1/namespaces/oomwatch/pods/oomwatch-x7k2p:9717/proxy/incidents"
    assert {r["authorization"] for r in api.requests} == {"Bearer dev-token"}


def test_json_output_is_the_agents_incidents_for_the_pod(tmp_path: Path) -> None:
    with FakeApiServer(cluster_pods(), incidents={"oomwatch-x7k2p": INCIDENTS}) as api:
        result = why(api.kubeconfig(tmp_path / "config"), "train-0", "-n", "ml", "-o", "json")
        other = why(api.kubeconfig(tmp_path / "config"), "train-0", "-n", "ml", "-c", "sidecar", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == INCIDENTS[:1]
    assert json.loads(other.output) == []


def test_namespace_defaults_to_the_contexts(tmp_path: Path) -> None:
    with FakeApiServer(cluster_pods(), incidents={"oomwatch-x7k2p": INCIDENTS}) as api:
        result = why(api.kubeconfig(tmp_path / "config", namespace="ml"), "train-0")
    assert result.exit_code == 0, result.output
    assert api.requests[0]["path"] == "/api/v1/namespaces/ml/pods/train-0"


def test_a_pod_without_kills_says_how_many_incidents_were_searched(tmp_path: Path) -> None:
    quiet = deepcopy(TRAIN_POD)
    quiet["metadata"].update(name="web-1", namespace="shop")
    quiet["status"]["containerStatuses"][0]["lastState"] = {}
    with FakeApiServer([*cluster_pods(), quiet], incidents={"oomwatch-x7k2p": INCIDENTS}) as api:
        result = why(api.kubeconfig(tmp_path / "config"), "web-1", "-n", "shop")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1:] == [
        "", "Recent OOM kills (0)", f"  none of the agent's 5 recent incidents on {NODE} is in this pod"]


def test_missing_pod_is_an_error_that_names_it(tmp_path: Path) -> None:
    with FakeApiServer(cluster_pods(), incidents={}) as api:
        result = why(api.kubeconfig(tmp_path / "config"), "train-9", "-n", "ml")
    assert result.exit_code == 1
    assert "Error: pod ml/train-9 not found" in result.output


def test_no_agent_on_the_node_says_what_to_check(tmp_path: Path) -> None:
    pods = [TRAIN_POD, agent_pod("oomwatch-a1b2c", "cpu-node-1")]
    with FakeApiServer(pods, incidents={}) as api:
        result = why(api.kubeconfig(tmp_path / "config"), "train-0", "-n", "ml")
    assert result.exit_code == 1
    assert f"no running oomwatch agent on node {NODE}" in result.output
    assert "tolerate" in result.output


def test_agent_that_does_not_answer_is_reported(tmp_path: Path) -> None:
    with FakeApiServer(cluster_pods(), incidents={}) as api:
        result = why(api.kubeconfig(tmp_path / "config"), "train-0", "-n", "ml")
    assert result.exit_code == 1
    assert ("GET /api/v1/namespaces/oomwatch/pods/oomwatch-x7k2p:9717/proxy/incidents: 503 error trying to "
            "reach service") in result.output


def test_agent_behind_web_config_auth_is_explained(tmp_path: Path) -> None:
    with FakeApiServer(cluster_pods(), incidents={"oomwatch-x7k2p": (401, "Unauthorized\n")}) as api:
        result = why(api.kubeconfig(tmp_path / "config"), "train-0", "-n", "ml")
    assert result.exit_code == 1
    assert "401 Unauthorized" in result.output and "--web-config-file" in result.output


def test_agent_namespace_names_where_the_agent_is(tmp_path: Path) -> None:
    pods = [TRAIN_POD, agent_pod("oomwatch-m0n1t", NODE, namespace="monitoring")]
    with FakeApiServer(pods, incidents={"oomwatch-m0n1t": INCIDENTS}) as api:
        result = why(api.kubeconfig(tmp_path / "config"), "train-0", "-n", "ml", "--agent-namespace", "monitoring")
        default = why(api.kubeconfig(tmp_path / "config"), "train-0", "-n", "ml")
    assert result.exit_code == 0, result.output
    assert api.requests[1]["path"] == "/api/v1/namespaces/monitoring/pods"
    assert result.output.splitlines()[0] == f"Pod ml/train-0 on node {NODE}, agent monitoring/oomwatch-m0n1t"
    assert default.exit_code == 1
    assert f"no running oomwatch agent on node {NODE} in namespace oomwatch" in default.output
    assert "--agent-namespace" in default.output


# --- a tenant's look-alike agent ----------------------------------------------------------------------

FORGED = [{**deepcopy(INCIDENTS[0]), "explanation": "nothing to see here: the node ran out of memory"}]


def test_a_tenants_pod_with_the_agents_labels_is_never_asked(tmp_path: Path) -> None:
    """A tenant may give its own pod the agent's labels (and even a DaemonSet ownerReference: the API server
    does not check it) on the same node, newer than the real agent: only the agent's namespace is searched."""
    fake = agent_pod("oomwatch-fake", NODE, namespace="ml", created="2026-11-22T21:00:00Z")
    bare = agent_pod("oomwatch-bare", NODE, daemonset=None, created="2026-11-22T21:00:00Z")
    with FakeApiServer([*cluster_pods(), fake, bare],
                       incidents={"oomwatch-x7k2p": INCIDENTS, "oomwatch-fake": FORGED,
                                  "oomwatch-bare": FORGED}) as api:
        result = why(api.kubeconfig(tmp_path / "config"), "train-0", "-n", "ml")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == f"Pod ml/train-0 on node {NODE}, agent oomwatch/oomwatch-x7k2p"
    assert "nothing to see here" not in result.output
    assert [r["path"] for r in api.requests if r["path"].endswith("/proxy/incidents")] == [
        "/api/v1/namespaces/oomwatch/pods/oomwatch-x7k2p:9717/proxy/incidents"]


def test_agents_of_two_releases_on_the_node_are_refused_until_one_is_named(tmp_path: Path) -> None:
    first = agent_pod("oomwatch-a-x1", NODE, daemonset="a-oomwatch", labels={"app.kubernetes.io/instance": "a"})
    second = agent_pod("oomwatch-b-x2", NODE, daemonset="b-oomwatch", labels={"app.kubernetes.io/instance": "b"})
    with FakeApiServer([TRAIN_POD, first, second],
                       incidents={"oomwatch-a-x1": INCIDENTS, "oomwatch-b-x2": FORGED}) as api:
        ambiguous = why(api.kubeconfig(tmp_path / "config"), "train-0", "-n", "ml")
        named = why(api.kubeconfig(tmp_path / "config"), "train-0", "-n", "ml", "--release", "a")
    assert ambiguous.exit_code == 1
    assert (f"agents of 2 DaemonSets run on node {NODE} in namespace oomwatch: DaemonSet a-oomwatch (release a), "
            "DaemonSet b-oomwatch (release b); name the release with --release") in ambiguous.output
    assert not [r for r in api.requests if r["path"].endswith("/proxy/incidents") and r["path"].find("-b-") > 0]
    assert named.exit_code == 0, named.output
    assert named.output.splitlines()[0] == f"Pod ml/train-0 on node {NODE}, agent oomwatch/oomwatch-a-x1"


def test_the_plugin_shows_a_tenants_control_characters_never_sends_them(tmp_path: Path) -> None:
    """The agent's incidents carry names a tenant chose (a process name, a cgroup): ESC, BEL, a C1 CSI and a
    bidi override are printed as escapes, in colour too (only the renderer's own colour sequences are sent)."""
    hostile = deepcopy(INCIDENTS[0])
    hostile["victim"]["comm"] = "\x1b]0;PWNED\x07\x9b\u202e"
    hostile["explanation"] = "dd \x1b]52;c;cHduZWQ=\x07 was killed\r\u2066"
    for flags in ([], ["--color"]):
        with FakeApiServer(cluster_pods(), incidents={"oomwatch-x7k2p": [hostile]}) as api:
            result = CliRunner().invoke(kubectl.main, ["why", "train-0", "-n", "ml", "--kubeconfig",
                                                       str(api.kubeconfig(tmp_path / "config")), *flags])
        assert result.exit_code == 0, result.output
        text = re.sub(r"\x1b\[[0-9;]*m", "", result.output) if flags else result.output
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text), ascii(text)
        assert "\\x1b]52;c;cHduZWQ=\\x07 was killed\\x0d\\u2066" in text



def test_unreachable_api_server(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}], "contexts": [{"name": "c", "context": {
            "cluster": "c", "user": "u"}}]}))
    result = why(config, "train-0", "-n", "ml")
    assert result.exit_code == 1 and "API server http://127.0.0.1:9" in result.output


# --- the pure parts --------------------------------------------------------------------------


def test_pick_agent_prefers_a_running_pod_and_reads_its_port() -> None:
    pending = agent_pod("oomwatch-new", NODE, phase="Pending")
    running = agent_pod("oomwatch-old", NODE)
    running["spec"]["containers"][0]["ports"] = [{"name": "metrics", "containerPort": 9443}]
    assert pick_agent([pending, running], NODE, AGENT_SELECTOR) == Agent("oomwatch", "oomwatch-old", 9443)
    with pytest.raises(kubectl.PluginError, match="oomwatch/oomwatch-new Pending"):
        pick_agent([pending], NODE, AGENT_SELECTOR)


def test_proxy_path_for_a_tls_agent() -> None:
    agent = Agent("oomwatch", "oomwatch-x7k2p", 9717)
    assert proxy_path(agent, "https") == (
        "/api/v1/namespaces/oomwatch/pods/https:oomwatch-x7k2p:9717/proxy/incidents")


def test_pod_incidents_newest_first() -> None:
    older, newer = deepcopy(INCIDENTS[0]), deepcopy(INCIDENTS[0])
    older["time"], newer["time"] = "2026-11-22T20:00:00.000000Z", "2026-11-22T21:00:00.000000Z"
    assert pod_incidents([older, *INCIDENTS[1:], newer], "ml", "train-0") == [newer, older]
    assert pod_incidents(INCIDENTS, "ml", "train-1") == []


def test_kubeconfig_path_follows_kubectl(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    first, second = tmp_path / "a", tmp_path / "b"
    second.write_text("")
    assert kubeconfig_path("/x/flag", str(second), str(home)) == "/x/flag"
    assert kubeconfig_path(None, f"{first}:{second}", str(home)) == str(second)
    assert kubeconfig_path(None, None, str(home)) is None  # in-cluster
    (home / ".kube" / "config").write_text("")
    assert kubeconfig_path(None, None, str(home)) == str(home / ".kube" / "config")


def test_agent_selector_matches_the_kustomize_daemonset() -> None:
    ds = yaml.safe_load((ROOT / "daemonset" / "daemonset.yaml").read_text())
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert dict(term.split("=") for term in AGENT_SELECTOR.split(",")).items() <= labels.items()
