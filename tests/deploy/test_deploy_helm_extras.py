"""The chart's values schema, its `helm test` pod, its Grafana dashboard ConfigMap and its release notes,
rendered with the real helm (and the test pod's script run against a local HTTP server)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from .conftest import CHART, DASHBOARD, HELM_IMAGE, ROOT, by_kind, load_all, one, run, tool
from .test_deploy_kubernetes import validate

pytestmark = pytest.mark.tools

SCHEMA = CHART / "values.schema.json"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run([tool("helm"), *args], check=check)


def render(*sets: str, tests: bool = True) -> list[dict[str, Any]]:
    args = ["template", "oomwatch", str(CHART), "--namespace", "oomwatch"]
    for s in (HELM_IMAGE, *sets):
        args += ["--set", s]
    if not tests:
        args.append("--skip-tests")
    return load_all(helm(*args).stdout)


# --- values.schema.json ----------------------------------------------------------------------

# (--set or a values file, what helm must name in its complaint)
BAD_VALUES = {
    "misspelled top-level key": ({"porrt": 9000}, "'porrt' not allowed"),
    "misspelled nested key": ({"serviceMonitor": {"enabled": True, "intervall": "15s"}},
                              "'intervall' not allowed"),
    "misspelled dashboard option": ({"grafanaDashboard": {"enable": True}}, "'enable' not allowed"),
    "port as text": ({"port": "metrics"}, "/port"),
    "boolean as text": ({"privileged": "yes"}, "/privileged"),
    "count as text": ({"sizing": {"containers": "many"}}, "/sizing/containers"),
    "tolerations as a map": ({"tolerations": {"operator": "Exists"}}, "/tolerations"),
    "unknown log level": ({"logLevel": "verbose"}, "/logLevel"),
    "runbook base without scheme": ({"prometheusRule": {"runbookBaseURL": "git.example.com/x"}},
                                    "/prometheusRule/runbookBaseURL"),
    "digest without algorithm": ({"image": {"repository": "r/o", "digest": "abc123"}}, "/image/digest"),
}


@pytest.mark.parametrize("command", ["lint", "template"])
@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_schema_rejects_misspelled_and_mistyped_values(tmp_path: Path, command: str, case: str) -> None:
    values, complaint = BAD_VALUES[case]
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    out = helm(command, *(["x"] if command == "template" else []), str(CHART), "--set", HELM_IMAGE,
               "-f", str(values_file), check=False)
    assert out.returncode != 0, f"{case}: helm {command} accepted {values}"
    assert complaint in out.stdout + out.stderr, out.stdout + out.stderr


def test_schema_rejects_a_set_typo() -> None:
    out = helm("template", "x", str(CHART), "--set", HELM_IMAGE, "--set", "servicemonitor.enabled=true",
               check=False)
    assert out.returncode != 0 and "'servicemonitor' not allowed" in out.stderr, out.stderr


def _unknown_and_undocumented(values: dict[str, Any], schema: dict[str, Any],
                              prefix: str = "") -> Iterator[str]:
    """Keys of values.yaml the schema lacks, and keys the schema closes over that values.yaml leaves out (a
    map that values.yaml leaves empty, like resources: {}, documents its keys in its comment instead)."""
    properties = schema.get("properties", {})
    for name in values.keys() - properties.keys():
        yield f"not in the schema: {prefix}{name}"
    if values:
        for name in properties.keys() - values.keys() - {"global"}:
            yield f"not in values.yaml: {prefix}{name}"
    for name, value in values.items():
        sub = properties.get(name, {})
        if isinstance(value, dict) and sub.get("additionalProperties") is False:
            yield from _unknown_and_undocumented(value, sub, f"{prefix}{name}.")


def test_schema_and_values_name_the_same_keys() -> None:
    schema = json.loads(SCHEMA.read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert list(_unknown_and_undocumented(values, schema)) == []
    # The check can fail: a key the schema lacks is reported.
    assert list(_unknown_and_undocumented({**values, "extra": 1}, schema)) == ["not in the schema: extra"]


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["maintainers"] and all(m["name"] and "@" in m["email"] for m in chart["maintainers"])
    assert chart["annotations"]["artifacthub.io/license"] == "Apache-2.0"


# --- helm test -------------------------------------------------------------------------------


def hook_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pods = [o for o in by_kind(objects, "Pod") if o["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    assert len(pods) == 1, pods
    return pods[0]


def test_helm_test_pod_is_a_hook_that_runs_unprivileged() -> None:
    objects = render()
    pod = hook_pod(objects)
    validate(pod)
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 65532
    (container,) = spec["containers"]
    agent = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == agent["image"]
    sc = container["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert container["command"][-4:] == ["oomwatch.oomwatch.svc", "9717", "http", "true"]


def test_helm_test_pod_is_not_selected_as_an_agent() -> None:
    objects = render()
    labels = hook_pod(objects)["metadata"]["labels"]
    for selector in (one(objects, "Service")["spec"]["selector"],
                     one(objects, "DaemonSet")["spec"]["selector"]["matchLabels"]):
        assert not selector.items() <= labels.items(), selector


def test_helm_test_pod_follows_web_config() -> None:
    pod = hook_pod(render("webConfig.secretName=oomwatch-web", "webConfig.tls=true", "port=9443"))
    # HTTPS, and /metrics left out: the web config's auth covers it and the test has no credentials.
    assert pod["spec"]["containers"][0]["command"][-3:] == ["9443", "https", "false"]


def test_helm_test_pod_can_be_left_out() -> None:
    assert not by_kind(render("tests.enabled=false"), "Pod")
    assert not by_kind(render(tests=False), "Pod")


def test_network_policy_admits_the_helm_hook_pod() -> None:
    objects = render("networkPolicy.enabled=true")
    labels = hook_pod(objects)["metadata"]["labels"]
    peers = one(objects, "NetworkPolicy")["spec"]["ingress"][0]["from"]
    assert any("namespaceSelector" not in p and p["podSelector"]["matchLabels"].items() <= labels.items()
               for p in peers), peers
    policy = one(render("networkPolicy.enabled=true", "tests.enabled=false"), "NetworkPolicy")
    assert len(policy["spec"]["ingress"][0]["from"]) == 1


class _Agent(BaseHTTPRequestHandler):
    health = 200
    metrics = b'oomwatch_build_info{version="0.1.0"} 1.0\n'

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        status, body = (self.health, b"{}") if self.path == "/healthz" else (200, self.metrics)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_agent() -> Iterator[tuple[type[_Agent], int]]:
    handler = type("Agent", (_Agent,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, server.server_address[1]
    server.shutdown()
    server.server_close()


def _run_test_script(port: int, metrics: str = "true") -> subprocess.CompletedProcess[str]:
    command = hook_pod(render())["spec"]["containers"][0]["command"]
    assert command[:2] == ["python3", "-c"]
    # The pod's own script and arguments, with the Service's name replaced by the local server's address.
    return subprocess.run([sys.executable, "-c", command[2], "127.0.0.1", str(port), "http", metrics],
                          capture_output=True, text=True, timeout=60)


def test_helm_test_script_passes_a_healthy_agent(fake_agent) -> None:
    _handler, port = fake_agent
    out = _run_test_script(port)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"http://127.0.0.1:{port}/metrics: 200" in out.stdout
    assert "1 agent(s) listed by 127.0.0.1, 0 failed check(s)" in out.stdout


@pytest.mark.parametrize("fault", ["unhealthy", "not oomwatch"])
def test_helm_test_script_fails_a_bad_agent(fake_agent, fault: str) -> None:
    handler, port = fake_agent
    if fault == "unhealthy":
        handler.health = 503
    else:
        handler.metrics = b"node_load1 0.5\n"
    out = _run_test_script(port)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed check(s)" in out.stdout


def test_helm_test_script_skips_metrics_behind_auth(fake_agent) -> None:
    handler, port = fake_agent
    handler.metrics = b"401 would come back here\n"
    out = _run_test_script(port, metrics="false")
    assert out.returncode == 0 and "/metrics" not in out.stdout, out.stdout


# --- Grafana dashboard ConfigMap -------------------------------------------------------------


def test_dashboard_configmap_is_off_by_default() -> None:
    assert not by_kind(render(), "ConfigMap")


def test_dashboard_configmap_for_the_grafana_sidecar() -> None:
    objects = render("grafanaDashboard.enabled=true",
                     "grafanaDashboard.annotations.grafana_folder=Kubernetes")
    cm = one(objects, "ConfigMap")
    validate(cm)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Kubernetes"}
    assert cm["metadata"]["namespace"] == "oomwatch"
    # The repository's dashboard, byte for byte: Helm does not template it ({{node}} legends survive).
    assert cm["data"] == {"oomwatch-dashboard.json": DASHBOARD.read_text()}


def test_dashboard_configmap_namespace_and_labels() -> None:
    cm = one(render("grafanaDashboard.enabled=true", "grafanaDashboard.namespace=monitoring",
                    "grafanaDashboard.labels.grafana_dashboard=null",
                    "grafanaDashboard.labels.dashboards=oomwatch"), "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["labels"]["dashboards"] == "oomwatch"


def test_chart_dashboard_is_the_repository_dashboard() -> None:
    assert (CHART / "files/oomwatch-dashboard.json").read_bytes() == DASHBOARD.read_bytes()


# --- release notes ---------------------------------------------------------------------------


def notes(*sets: str) -> str:
    args = ["install", "--dry-run=client", "oomwatch", str(CHART), "--namespace", "oomwatch"]
    for s in (HELM_IMAGE, *sets):
        args += ["--set", s]
    out = helm(*args).stdout
    return out[out.index("NOTES:"):]


def test_notes_ask_for_the_runbook_base_url() -> None:
    assert "set prometheusRule.runbookBaseURL" in notes("prometheusRule.enabled=true")
    linked = notes("prometheusRule.enabled=true", "prometheusRule.runbookBaseURL=https://git.example.com/o")
    assert "runbookBaseURL" not in linked


def test_notes_name_helm_test() -> None:
    assert "helm test oomwatch -n oomwatch" in notes()
    assert "helm test" not in notes("tests.enabled=false")


def test_runbook_example_names_a_runbook_that_exists() -> None:
    text = (CHART / "values.yaml").read_text()
    (example,) = [line for line in text.splitlines() if "-> runbook_url:" in line]
    assert (ROOT / example.split("/blob/v0.1.0/")[1]).is_file(), example


# --- kubectl oomwatch ------------------------------------------------------------------------


def test_kubectl_plugin_finds_the_charts_agent_pods() -> None:
    """`kubectl oomwatch why` lists agent pods by AGENT_SELECTOR: the chart's pods carry it (and the test pod
    does not)."""
    from oomwatch.kubectl import AGENT_SELECTOR, RELEASE_LABEL

    objects = render()
    wanted = dict(term.split("=") for term in AGENT_SELECTOR.split(","))
    labels = one(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert wanted.items() <= labels.items()
    assert labels[RELEASE_LABEL] == one(objects, "DaemonSet")["metadata"]["labels"][RELEASE_LABEL]  # --release
    assert not wanted.items() <= hook_pod(objects)["metadata"]["labels"].items()
