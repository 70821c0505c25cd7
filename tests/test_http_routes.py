"""The agent's routes through the new server: the same responses as before, keep-alive as Prometheus uses it.
The agent writes the text format itself (issue 12: the cost of a scrape) and answers it whatever the scraper
prefers, as node_exporter may: Prometheus takes it. A registry-backed sink negotiates OpenMetrics, checked by
prometheus_client's strict parser."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from oomwatch.sinks.http import HttpSink, metrics_from_registry
from tests.conftest import CAPTURES, raw_records
from tests.test_agent import agent_config

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;"
                     "q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


def test_agent_routes_with_keep_alive(tmp_path: Path) -> None:
    """The HTTP sink as the agent wires it: /metrics from the collector over the pipeline's snapshot (here a
    replay of the memcg capture over its tree), /incidents from the snapshot, /healthz from the health check.
    """
    from oomwatch.events import KernelLog
    from tests.conftest import BOOT_TIME
    from tests.replay import Replay, live_reads, live_settings, tree_events
    from tests.test_agent import GOLDEN

    replay = Replay(live_settings(boot_time=BOOT_TIME), now=BOOT_TIME + 24.0)
    replay.run(tree_events(GOLDEN / "cgroup"))
    for items in live_reads(raw_records(CAPTURES / "linux-6.1-memcg-scenarios.kmsg")):
        replay.step(KernelLog(items, drained_at=replay.now))
    replay.settle()
    health = {"kmsg": "ok", "cgroups": "ok"}
    sink = HttpSink("127.0.0.1:0", replay.collector(agent_config(tmp_path)).metrics, replay.pipeline.view(),
                    lambda: (True, health))
    sink.start()
    try:
        conn = http.client.HTTPConnection(*sink.address, timeout=10)
        answers = {}
        for path, accept in (("/metrics", "text/plain;version=0.0.4"), ("/metrics", PROMETHEUS_ACCEPT),
                             ("/healthz", ""), ("/incidents", ""), ("/", ""), ("/nothing", "")):
            conn.request("GET", path, headers={"Accept": accept})
            response = conn.getresponse()
            answers[path, accept] = (response.status, response.getheader("Content-Type"), response.read())
            assert not response.will_close  # one connection for all of them, as Prometheus keeps it
        conn.close()
    finally:
        sink.stop()
    status, ctype, text = answers["/metrics", "text/plain;version=0.0.4"]
    assert (status, ctype) == (200, "text/plain; version=0.0.4; charset=utf-8")
    assert b'oomwatch_node_oom_kills_total{kind="group",scope="cgroup"} 3.0' in text
    status, ctype, preferred = answers["/metrics", PROMETHEUS_ACCEPT]
    assert (status, ctype) == (200, "text/plain; version=0.0.4; charset=utf-8") and preferred == text
    assert answers["/healthz", ""][:2] == (200, "application/json")
    assert json.loads(answers["/healthz", ""][2]) == health
    assert len(json.loads(answers["/incidents", ""][2])) == 4
    assert answers["/", ""] == (200, "text/plain; charset=utf-8", b"oomwatch: /metrics /healthz /incidents\n")
    assert answers["/nothing", ""] == (404, "text/plain; charset=utf-8", b"not found\n")


def test_unhealthy_is_503_with_the_reason() -> None:
    class Store:
        def snapshot(self):
            raise AssertionError("not needed")

    sink = HttpSink("127.0.0.1:0", CollectorRegistry(), Store(), lambda: (False, {"kmsg": "not running"}))
    sink.start()
    try:
        conn = http.client.HTTPConnection(*sink.address, timeout=5)
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        assert (response.status, response.read()) == (503, b'{"kmsg": "not running"}\n')
    finally:
        sink.stop()


def test_metrics_from_registry_negotiates_like_prometheus_client() -> None:
    registry = CollectorRegistry()
    Counter("things", "Things.", registry=registry).inc()
    body = metrics_from_registry(registry)
    ctype, chunks = body("")
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    assert b"things_total 1.0\n" in b"".join(chunks)
    ctype, chunks = body("application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text; version=1.0.0")
    assert b"".join(chunks).endswith(b"# EOF\n")


def test_ipv6_dual_stack_listen() -> None:
    try:
        sink = HttpSink("[::]:0", CollectorRegistry(), None, lambda: (True, {}))
    except OSError as exc:
        pytest.skip(f"no IPv6 on this machine: {exc}")
    sink.start()
    try:
        for host in ("::1", "127.0.0.1"):
            conn = http.client.HTTPConnection(host, sink.address[1], timeout=5)
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200
            conn.close()
        assert sink.address[0] == "::"  # one IPv6 socket answers both: an IPv4 one cannot be bound to ::
    finally:
        sink.stop()
