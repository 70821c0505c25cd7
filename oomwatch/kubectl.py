"""`kubectl oomwatch why POD`: a pod's OOM kills, explained, from the oomwatch agent on the pod's node.

Installed with the package as `kubectl-oomwatch`, which kubectl runs as the plugin `kubectl oomwatch` (krew's
convention: any `kubectl-NAME` on PATH). It uses the caller's kubeconfig, like kubectl, and only reads:

1. GET the pod: its node (`spec.nodeName`) and what Kubernetes says of its containers (`OOMKilled`);
2. list the agent pods on that node in the agent's namespace (`--agent-namespace`, default `oomwatch`: where the
   Kustomize base and the documented `helm install` put it), by the label selector of the chart and the
   Kustomize base (and `app.kubernetes.io/instance=RELEASE` with `--release`), `fieldSelector
   spec.nodeName=NODE`; only a pod a DaemonSet controls is an agent, and agents of two DaemonSets (two releases)
   on the node are refused as ambiguous, not guessed between;
3. GET the agent's `/incidents` through the API server's pod proxy
   (`/api/v1/namespaces/NS/pods/AGENT:PORT/proxy/incidents`: the `pods/proxy` get permission, no
   port-forward);
4. print the incidents whose workload is the pod, newest first, as `oomwatch inspect` prints kills.

Why not every namespace: anyone who may create a pod can give it the agent's labels and serve the operator its
own incidents; only the agent's namespace is trusted (tenants cannot create pods there). Everything printed is
made safe for a terminal first (oomwatch.textsafe): incidents hold names a tenant chose.

The agent keeps its last 500 incidents (node-wide, since it started or from its state file); a kill older than
that, or from before the pod's node ran the agent, is not there.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

import click

from oomwatch import __version__
from oomwatch.inspect import Style, render_text, terminal_width
from oomwatch.textsafe import terminal_text, visible, visible_data
from oomwatch.timefmt import utc_seconds

# The labels both the chart and the Kustomize base put on the agent pods.
AGENT_SELECTOR = "app.kubernetes.io/name=oomwatch,app.kubernetes.io/component=agent"
AGENT_NAMESPACE = "oomwatch"  # the Kustomize base's namespace, and the one `helm install -n` is given in the docs
RELEASE_LABEL = "app.kubernetes.io/instance"  # the chart's: the Helm release's name
AGENT_PORT = 9717


class PluginError(Exception):
    """An answer the user can act on (printed without a traceback, exit status 1)."""


# --- pure: objects in, answers out -----------------------------------------------------------


@dataclass(frozen=True)
class Agent:
    namespace: str
    name: str
    port: int


def release_selector(selector: str, release: Optional[str]) -> str:
    """The agent pods' label selector, narrowed to one Helm release's pods when `release` is given."""
    return f"{selector},{RELEASE_LABEL}={release}" if release else selector


def daemonset_owner(pod: dict[str, Any]) -> Optional[str]:
    """The name of the DaemonSet that controls `pod` (its controller ownerReference), else None."""
    for owner in pod["metadata"].get("ownerReferences") or []:
        if owner.get("controller") and owner.get("kind") == "DaemonSet" and \
                str(owner.get("apiVersion", "")).startswith("apps/"):
            return str(owner.get("name") or "")
    return None


def pick_agent(pods: list[dict[str, Any]], node: str, selector: str, namespace: str = AGENT_NAMESPACE) -> Agent:
    """The running agent pod among `pods` (a PodList's items, listed in `namespace`), with its metrics port: a
    pod of that namespace that a DaemonSet controls. Agents of more than one DaemonSet on the node (two releases,
    or the chart beside the Kustomize base) are ambiguous: refused, never guessed between. Among one
    DaemonSet's pods (a rolling update's surge) the newest."""
    mine = [p for p in pods if p["metadata"].get("namespace") == namespace and daemonset_owner(p)]
    running = [p for p in mine if p.get("status", {}).get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp")]
    if not running:
        states = ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']} "
                           f"{p.get('status', {}).get('phase', '?')}" for p in mine)
        others = len(pods) - len(mine)
        ignored = (f"; {others} pod{'' if others == 1 else 's'} with those labels but no DaemonSet controlling "
                   "it ignored" if others else "")
        raise PluginError(
            f"no running oomwatch agent on node {node} in namespace {namespace} (pods labelled {selector}"
            + (f": {states}{ignored})" if states else f": none{ignored}; is the agent installed in another "
               "namespace (--agent-namespace)? Does the DaemonSet tolerate the node's taints and match its "
               "nodeSelector? Or pass --agent-selector if yours are labelled otherwise)"))
    owners = sorted({daemonset_owner(p) or "" for p in running})
    if len(owners) > 1:
        releases = ", ".join(
            f"DaemonSet {owner}" + "".join(f" (release {r})" for r in sorted({
                p["metadata"].get("labels", {}).get(RELEASE_LABEL, "") for p in running
                if daemonset_owner(p) == owner} - {""})) for owner in owners)
        raise PluginError(f"agents of {len(owners)} DaemonSets run on node {node} in namespace {namespace}: "
                          f"{releases}; name the release with --release (or --agent-selector)")
    pod = sorted(running, key=lambda p: p["metadata"].get("creationTimestamp", ""))[-1]
    port = AGENT_PORT
    for container in pod["spec"].get("containers", []):
        for p in container.get("ports", []):
            if p.get("name") == "metrics":
                port = int(p["containerPort"])
    return Agent(pod["metadata"]["namespace"], pod["metadata"]["name"], port)


def proxy_path(agent: Agent, scheme: str = "http") -> str:
    """The API server's pod proxy path to the agent's /incidents (`https:` prefix for a TLS agent)."""
    target = f"{agent.name}:{agent.port}" if scheme == "http" else f"{scheme}:{agent.name}:{agent.port}"
    return f"/api/v1/namespaces/{agent.namespace}/pods/{target}/proxy/incidents"


def pod_incidents(incidents: list[dict[str, Any]], namespace: str, pod: str,
                  container: Optional[str] = None) -> list[dict[str, Any]]:
    """The incidents whose workload is the pod (or one container of it), newest first (/incidents lists
    newest last)."""
    def mine(incident: dict[str, Any]) -> bool:
        workload = incident.get("workload") or {}
        return (workload.get("namespace") == namespace and workload.get("pod") == pod
                and (container is None or workload.get("container") == container))

    return [i for i in reversed(incidents) if mine(i)]


def kubernetes_says(pod: dict[str, Any]) -> list[str]:
    """What the pod's status says of OOM kills: each container whose current or last state is a termination
    with reason OOMKilled (the kubelet's view, which oomwatch's explains)."""
    lines = []
    statuses = pod.get("status", {}).get("initContainerStatuses", []) + pod.get("status", {}).get(
        "containerStatuses", [])
    for status in statuses:
        for which in ("state", "lastState"):
            terminated = (status.get(which) or {}).get("terminated") or {}
            if terminated.get("reason") == "OOMKilled":
                when = terminated.get("finishedAt")
                # RFC 3339 in whole seconds, as the API server writes it (2026-11-22T20:40:10Z)
                at = ""
                if when:
                    at = f" at {utc_seconds(datetime.fromisoformat(when.replace('Z', '+00:00')).timestamp())}"
                state = "is terminated" if which == "state" else "last terminated"
                lines.append(f"container {status['name']} {state} OOMKilled{at} (exit code "
                             f"{terminated.get('exitCode', '?')}, restarts {status.get('restartCount', 0)})")
    return lines


def render_why(namespace: str, pod: str, node: str, agent: Agent, kills: list[dict[str, Any]],
               kubernetes: list[str], total: int, color: bool = False, width: int = 80) -> str:
    s = Style(color)
    out = [s.bold(f"Pod {namespace}/{pod}") + f" on node {node}, agent {agent.namespace}/{agent.name}"]
    for line in kubernetes:
        out.append(f"  Kubernetes: {line}")
    out.append("")
    if kills:
        # inspect's own rendering of kills (time, kind, scope, explanation, killed pids).
        out.append(render_text({"incidents": kills}, color=color, width=width).rstrip("\n"))
    else:
        out.append(s.bold("Recent OOM kills (0)"))
        out.append(f"  none of the agent's {total} recent incident{'' if total == 1 else 's'} on {node} "
                   f"is in this pod")
    return "\n".join(out) + "\n"


# --- the API server --------------------------------------------------------------------------


def kubeconfig_path(flag: Optional[str], env: Optional[str], home: str) -> Optional[str]:
    """The kubeconfig file kubectl would read: --kubeconfig, else the first existing file of $KUBECONFIG (a
    list, like PATH; kubectl merges them, this reads the first), else ~/.kube/config; None: in-cluster."""
    if flag:
        return flag
    for path in (env or "").split(os.pathsep):
        if path and os.path.exists(path):
            return path
    default = os.path.join(home, ".kube", "config")
    return default if os.path.exists(default) else None


def connect(kubeconfig: Optional[str], context: Optional[str]) -> Any:
    """A lightkube SingleConfig from that file and context (or the pod's service account)."""
    from lightkube import KubeConfig
    from lightkube.core.exceptions import ConfigError

    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account()
        single = config.get(context_name=context)
    except (ConfigError, OSError) as exc:
        where = kubeconfig or "no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a pod"
        raise PluginError(f"kubeconfig: {where}: {exc}") from None
    if single is None:
        raise PluginError(f"kubeconfig {kubeconfig}: no context {context!r}" if context
                          else f"kubeconfig {kubeconfig}: no current context (--context)")
    return single


def _api_error(exc: Exception, what: str) -> PluginError:
    status = getattr(exc, "status", None)
    code = getattr(status, "code", None)
    message = getattr(status, "message", None) or str(exc)
    hint = ""
    if code == 403:
        hint = " (your kubeconfig's user needs get on that resource; `kubectl auth can-i` checks it)"
    return PluginError(f"{what}: {message}{hint}")


class Cluster:
    """The three reads, over lightkube (typed objects, as dicts) and its httpx client for the proxy path."""

    def __init__(self, config: Any, trust_env: bool = True, timeout: float = 15.0) -> None:
        import httpx2
        from lightkube import Client
        from lightkube.config import client_adapter

        self.client = Client(config, trust_env=trust_env, timeout=httpx2.Timeout(timeout))
        self.http = client_adapter.Client(config, client_adapter.ConnectionParams(
            timeout=httpx2.Timeout(timeout), trust_env=trust_env))
        self.default_namespace: str = config.namespace or "default"

    def close(self) -> None:
        self.client.close()
        self.http.close()

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod

        try:
            return self.client.get(Pod, name, namespace=namespace).to_dict()
        except ApiError as exc:
            if exc.status.code == 404:
                raise PluginError(f"pod {namespace}/{name} not found") from None
            raise _api_error(exc, f"get pod {namespace}/{name}") from None
        except Exception as exc:  # noqa: BLE001 - unreachable server, TLS: say which and stop
            raise PluginError(f"API server {self.client.config.cluster.server}: {exc}") from None

    def agents(self, node: str, selector: str, namespace: str) -> list[dict[str, Any]]:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod

        labels = dict(part.split("=", 1) for part in selector.split(",") if part)
        try:
            return [p.to_dict() for p in self.client.list(
                Pod, namespace=namespace, labels=labels, fields={"spec.nodeName": node})]
        except ApiError as exc:
            raise _api_error(exc, f"list agent pods in namespace {namespace}") from None

    def incidents(self, agent: Agent, scheme: str) -> list[dict[str, Any]]:
        path = proxy_path(agent, scheme)
        try:
            response = self.http.get(path)
        except Exception as exc:  # noqa: BLE001
            raise PluginError(f"GET {path}: {exc}") from None
        if response.status_code != 200:
            try:
                message = response.json().get("message") or response.text
            except ValueError:
                message = response.text
            hint = {403: " (the pods/proxy get permission is needed in the agent's namespace)",
                    401: " (an agent with a --web-config-file asks for credentials the pod proxy cannot "
                         "pass)",
                    }.get(response.status_code, "")
            raise PluginError(f"GET {path}: {response.status_code} {message.strip()[:300]}{hint}")
        try:
            incidents = response.json()
        except ValueError:
            raise PluginError(f"GET {path}: not JSON (is {agent.name}:{agent.port} the oomwatch agent?)") \
                from None
        if not isinstance(incidents, list):
            raise PluginError(f"GET {path}: expected a JSON array of incidents")
        return incidents


# --- the command -----------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="kubectl-oomwatch")
def main() -> None:
    """kubectl oomwatch: ask the oomwatch agent on a pod's node why the pod was OOM-killed.

    \b
    Examples:
      kubectl oomwatch why train-0 -n ml            # every kill of the pod the agent still holds
      kubectl oomwatch why train-0 -n ml -c trainer --output json
      kubectl oomwatch why train-0 -n ml --agent-namespace monitoring --release oomwatch

    The agent is looked for in --agent-namespace only (default oomwatch): a pod there that a DaemonSet controls,
    on the pod's node. Agents of two DaemonSets there are refused as ambiguous: name one with --release.
    """


@main.command()
@click.argument("pod")
@click.option("-n", "--namespace", help="The pod's namespace (default: the context's, else default).")
@click.option("-c", "--container", help="Only the kills in this container.")
@click.option("--context", help="The kubeconfig context to use.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False),
              help="Path of the kubeconfig (default: $KUBECONFIG's first file, ~/.kube/config, or "
                   "in-cluster).")
@click.option("--agent-namespace", default=AGENT_NAMESPACE, show_default=True,
              help="The namespace the agent is installed in (`helm install -n`, the Kustomize base's); only its "
                   "pods that a DaemonSet controls are agents.")
@click.option("--release", default=None, metavar="NAME",
              help="The Helm release of the agent, where more than one is installed in that namespace (its pods' "
                   f"{RELEASE_LABEL} label).")
@click.option("--agent-selector", default=AGENT_SELECTOR, show_default=True,
              help="Label selector of the agent pods (key=value,...).")
@click.option("--agent-scheme", type=click.Choice(["http", "https"]), default="http", show_default=True,
              help="https for an agent with TLS (webConfig.tls); the pod proxy does not verify its "
                   "certificate.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: the pod's incidents as the agent serves them, newest first.")
@click.option("--color/--no-color", default=None, help="Colour (default: only on a terminal).")
def why(pod: str, namespace: Optional[str], container: Optional[str], context: Optional[str],
        kubeconfig: Optional[str], agent_namespace: str, release: Optional[str], agent_selector: str,
        agent_scheme: str, output: str, color: Optional[bool]) -> None:
    """Explain POD's OOM kills: the pod's node, the oomwatch agent there, its incidents for the pod."""
    path = kubeconfig_path(kubeconfig, os.environ.get("KUBECONFIG"), os.path.expanduser("~"))
    try:
        cluster = Cluster(connect(path, context))
        try:
            text = why_text(cluster, pod, namespace, container, agent_namespace,
                            release_selector(agent_selector, release), agent_scheme, output,
                            sys.stdout.isatty() if color is None else color)
        finally:
            cluster.close()
    except PluginError as exc:
        raise click.ClickException(visible(str(exc))) from None  # (it may quote the agent's or a pod's text)
    click.echo(text, nl=False, color=color)


def why_text(cluster: Cluster, pod: str, namespace: Optional[str], container: Optional[str],
             agent_namespace: str, selector: str, scheme: str, output: str, color: bool) -> str:
    namespace = namespace or cluster.default_namespace
    obj = cluster.pod(namespace, pod)
    node = obj.get("spec", {}).get("nodeName")
    if not node:
        raise PluginError(f"pod {namespace}/{pod} is not scheduled on a node yet: it cannot have been "
                          "OOM-killed")
    agent = pick_agent(cluster.agents(node, selector, agent_namespace), node, selector, agent_namespace)
    incidents = cluster.incidents(agent, scheme)
    kills = pod_incidents(incidents, namespace, pod, container)
    if output == "json":
        return json.dumps(kills, indent=2) + "\n"  # (json.dumps writes control characters as \\uNNNN)
    # The agent's incidents hold names tenants chose: shown, never sent to the terminal as they are.
    text = render_why(visible(namespace), visible(pod), visible(node), agent, visible_data(kills),
                      visible_data(kubernetes_says(obj)), len(incidents), color=color, width=terminal_width())
    return terminal_text(text, color)


if __name__ == "__main__":
    main()
