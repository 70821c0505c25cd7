"""One fake Kubernetes API server for the tests (real sockets, so the real lightkube client and kubectl's
kubeconfig handling are exercised). It serves what the agent and `kubectl oomwatch` ask for:

- GET /api/v1/pods and /api/v1/namespaces/NS/pods: `pods`, filtered by labelSelector and the
  spec.nodeName fieldSelector as the API server does; `list_status` != 200 answers them with a Forbidden Status.
- GET /api/v1/pods?watch=true: the first watch streams `watch_lines` (JSON lines) and ends; later watches hang
  until the server closes, like a quiet API server.
- GET /api/v1/namespaces/NS/pods/NAME: one pod, or 404.
- GET /api/v1/namespaces/NS/pods/NAME:PORT/proxy/incidents: `incidents[NAME]` (a JSON body, or (status, text)),
  503 for a pod that is not an agent that answers.
- POST /api/v1/namespaces/NS/events: stores the Event by name in `events`; a name seen before gets 409
  AlreadyExists. `hold` (an Event, set by default) cleared makes POSTs wait (a slow API server);
  `refuse(body)` returning a status code (403, 404, 422) answers that Event with it.

Every request is in `requests` (method, path, query, authorization); every POST in `posts`, the status of
each POST answer in `statuses`."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, unquote, urlsplit

import yaml
from lightkube import Client, KubeConfig
from lightkube.config.models import Cluster, User

_REASONS = {403: "Forbidden", 404: "NotFound", 409: "AlreadyExists", 422: "Invalid"}


def selected(pod: dict[str, Any], query: dict[str, str]) -> bool:
    """Whether a list's labelSelector (equality terms) and fieldSelector (spec.nodeName only) take `pod`."""
    labels = pod["metadata"].get("labels", {})
    for term in filter(None, query.get("labelSelector", "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    for term in filter(None, query.get("fieldSelector", "").split(",")):
        key, _, value = term.partition("=")
        assert key == "spec.nodeName", key
        if pod["spec"].get("nodeName") != value:
            return False
    return True


class FakeApiServer:
    def __init__(self, pods: Optional[list[dict[str, Any]]] = None, *, incidents: Optional[dict[str, Any]] = None,
                 watch_lines: Optional[list[str]] = None, resource_version: str = "7",
                 list_status: int = 200) -> None:
        self.pods = list(pods or [])
        self.incidents = dict(incidents or {})
        self.watch_lines = list(watch_lines or [])
        self.resource_version = resource_version
        self.list_status = list_status
        self.requests: list[dict[str, Any]] = []
        self.posts: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.hold = threading.Event()
        self.hold.set()
        self.refuse: Callable[[dict[str, Any]], Optional[int]] = lambda body: None
        self.closing = threading.Event()
        self.watches = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def __enter__(self) -> "FakeApiServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.closing.set()
        self.hold.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def client(self) -> Client:
        config = KubeConfig.from_one(cluster=Cluster(server=self.url), user=User(token="test-token"))
        return Client(config, trust_env=False)

    def kubeconfig(self, path: Path, namespace: Optional[str] = None) -> Path:
        context: dict[str, Any] = {"cluster": "fake", "user": "dev"}
        if namespace:
            context["namespace"] = namespace
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "dev", "user": {"token": "dev-token"}}],
            "contexts": [{"name": "fake", "context": context}]}))
        return path


def status(code: int, message: str, **extra: Any) -> dict[str, Any]:
    """A metav1 Status, as the API server answers a failure."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": _REASONS.get(code, "Failure"), "code": code, **extra}


def _handler(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            pass

        def _request(self) -> tuple[list[str], dict[str, str]]:
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            api.requests.append({"method": self.command, "path": unquote(url.path), "query": query,
                                 "authorization": self.headers.get("Authorization")})
            return unquote(url.path).strip("/").split("/"), query

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            parts, query = self._request()
            listing = parts == ["api", "v1", "pods"] or (len(parts) == 5 and parts[2] == "namespaces"
                                                         and parts[4] == "pods")
            if listing and query.get("watch") == "true":
                self._watch()
            elif listing and api.list_status != 200:
                self._json(api.list_status, status(
                    api.list_status, 'pods is forbidden: User "system:serviceaccount:oomwatch:oomwatch" cannot '
                    'list resource "pods" in API group "" at the cluster scope', details={"kind": "pods"}))
            elif listing:
                namespace = parts[3] if len(parts) == 5 else None
                self._json(200, {"kind": "PodList", "apiVersion": "v1",
                                 "metadata": {"resourceVersion": api.resource_version},
                                 "items": [p for p in api.pods if selected(p, query)
                                           and namespace in (None, p["metadata"]["namespace"])]})
            elif parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 6 and parts[4] == "pods":
                found = [p for p in api.pods if (p["metadata"]["namespace"], p["metadata"]["name"])
                         == (parts[3], parts[5])]
                self._json(200, found[0]) if found else self._json(404, status(404, f'pods "{parts[5]}" not found'))
            elif parts[:3] == ["api", "v1", "namespaces"] and parts[4:5] == ["pods"] and parts[6:] == [
                    "proxy", "incidents"]:
                self._proxy(parts[3], parts[5])
            else:
                self._json(404, status(404, "the server could not find the requested resource"))

        def do_POST(self) -> None:  # noqa: N802
            api.hold.wait(10)
            parts, _ = self._request()
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            api.posts.append({"path": self.path, "body": body})
            if parts[:3] != ["api", "v1", "namespaces"] or parts[4:] != ["events"]:
                return self._answer_post(404, status(404, "the server could not find the requested resource"))
            key = (parts[3], body["metadata"]["name"])
            refused = api.refuse(body)
            if refused is not None:
                reason = _REASONS.get(refused, "Failure")
                return self._answer_post(refused, status(refused, f'events "{key[1]}" is {reason.lower()}'))
            if key in api.events:
                return self._answer_post(409, status(409, f'events "{key[1]}" already exists',
                                                     details={"name": key[1], "kind": "events"}))
            stored = dict(body)
            stored["metadata"] = dict(body["metadata"], uid="5c1e8a9f-0d2b-4c3e-9f1a-2b3c4d5e6f70",
                                      resourceVersion="184480", creationTimestamp="2026-11-22T17:38:22Z")
            api.events[key] = stored
            return self._answer_post(201, stored)

        def _answer_post(self, code: int, body: dict[str, Any]) -> None:
            api.statuses.append(code)
            self._json(code, body)

        def _watch(self) -> None:
            api.watches += 1
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()  # HTTP/1.0: the body ends when the connection closes
            if api.watches == 1:
                for line in api.watch_lines:
                    self.wfile.write(line.encode() + b"\n")
                    self.wfile.flush()
                return
            api.closing.wait(10)

        def _proxy(self, namespace: str, target: str) -> None:
            name, _, port = target.rpartition(":")
            agent = [p for p in api.pods if (p["metadata"]["namespace"], p["metadata"]["name"]) == (namespace, name)]
            if not agent or name not in api.incidents:
                self._json(503, status(503, f"error trying to reach service: dial tcp 10.0.0.9:{port}: connect: "
                                            "connection refused"))
                return
            answer = api.incidents[name]
            if isinstance(answer, tuple):
                code, text = answer
                data = text.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._json(200, answer)

        def _json(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
