"""The chart's options for the agent's port: webConfig (a Secret with --web-config-file, HTTPS probes and
ServiceMonitor) and the NetworkPolicy; rendered by the real helm, validated against Kubernetes' schemas."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.conftest import CHART, by_kind, load_all, one, run, tool

pytestmark = pytest.mark.tools
IMAGE = "image.repository=registry.example/oomwatch"


def render(*sets: str) -> list[dict[str, Any]]:
    args = [tool("helm"), "template", "oomwatch", str(CHART), "--namespace", "oomwatch"]
    for s in (IMAGE, *sets):
        args += ["--set", s]
    return load_all(run(args).stdout)


def agent_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container["env"]}


def agent_env_names() -> set[str]:
    from oomwatch.cli import agent

    return {p.envvar for p in agent.params if p.envvar}


def test_defaults_plain_http_and_no_network_policy() -> None:
    objects = render("serviceMonitor.enabled=true")
    assert not by_kind(objects, "NetworkPolicy")
    container = agent_container(objects)
    assert "OOMWATCH_WEB_CONFIG_FILE" not in env_of(container)
    assert "scheme" not in container["readinessProbe"]["httpGet"]
    assert "scheme" not in one(objects, "ServiceMonitor")["spec"]["endpoints"][0]


def test_web_config_secret_is_mounted_and_probes_and_scrapes_use_https() -> None:
    from tests.deploy.test_deploy_kubernetes import validate

    objects = render("webConfig.secretName=oomwatch-web", "webConfig.tls=true", "serviceMonitor.enabled=true",
                     "serviceMonitor.endpointConfig.tlsConfig.serverName=oomwatch")
    for obj in objects:
        validate(obj)
    container = agent_container(objects)
    env = env_of(container)
    assert set(env) <= agent_env_names()
    assert env["OOMWATCH_WEB_CONFIG_FILE"] == "/etc/oomwatch/web/web-config.yml"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "web-config")
    assert mount == {"name": "web-config", "mountPath": "/etc/oomwatch/web", "readOnly": True}
    volumes = one(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "web-config")["secret"]["secretName"] == "oomwatch-web"
    for probe, path in (("readinessProbe", "/healthz"), ("livenessProbe", "/livez")):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics", "scheme": "HTTPS"}
    endpoint = one(objects, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == {"serverName": "oomwatch"}


def test_network_policy_admits_only_the_listed_peers_to_the_metrics_port() -> None:
    from tests.deploy.test_deploy_kubernetes import validate

    prometheus = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    # The chart's own `helm test` pod (tests.enabled, the default) is let in too, from its namespace only.
    helm_test = {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "oomwatch",
                                                 "app.kubernetes.io/component": "helm-test"}}}
    for values, peers in (("tests.enabled=false", [prometheus]), ("tests.enabled=true", [prometheus, helm_test])):
        objects = render("networkPolicy.enabled=true", values)
        policy = one(objects, "NetworkPolicy")
        validate(policy)
        daemonset = one(objects, "DaemonSet")
        assert policy["spec"]["podSelector"]["matchLabels"] == daemonset["spec"]["selector"]["matchLabels"]
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        (rule,) = policy["spec"]["ingress"]
        assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
        assert rule["from"] == peers, values


def test_network_policy_without_peers_is_refused() -> None:
    args = [tool("helm"), "template", "oomwatch", str(CHART), "--set", IMAGE, "--set", "networkPolicy.enabled=true",
            "--set", "networkPolicy.from=null"]
    out = run(args, check=False)
    assert out.returncode != 0 and "networkPolicy.from is empty" in out.stderr
