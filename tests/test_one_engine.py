"""Issue 33 item 2: one engine. `oomwatch inspect` reads a log through the agent's own pipeline
(oomwatch.replay), so every capture gives the same incidents whether the live agent reads it from /dev/kmsg or a
person pastes it: same kills, kind, cgroups, breakdown, holders, verdict and explanation."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from oomwatch.config import Config
from oomwatch.events import KernelLog
from oomwatch.inspect import build_report
from tests.conftest import FIXTURES, raw_records
from tests.replay import Replay, live_reads, live_settings

CAPTURES = sorted((FIXTURES / "kmsg").glob("*.kmsg"))
# What only a live read can know (when it was read, on which boot) or says only of a live read
LIVE_ONLY = ("boot_id", "detected_at", "latency_seconds")


def as_the_agent_publishes(path: Path) -> list[dict]:
    """The capture's records printed on a live /dev/kmsg and read by the agent's reader, 32 at a time, each read
    to the log's end 10 ms after the last; then time passes until nothing is due."""
    agent = Replay(live_settings(boot_time=0.0, counting=False, persist=False))
    now = 1.0
    for items in live_reads(raw_records(path)):
        now += 0.01
        agent.step(KernelLog(items, drained_at=now), now)
    agent.settle()
    return [strip(i.to_json()) for i in agent.published]


def as_inspect_reports(path: Path) -> list[dict]:
    report = build_report(Config(kmsg=str(path), boot_time=0.0), node_view=False, clock=lambda: 0.0,
                          tz=dt.timezone.utc, limit=None)
    return [strip(i) for i in reversed(report["incidents"])]  # (newest first there)


def strip(incident: dict) -> dict:
    return {k: v for k, v in incident.items() if k not in LIVE_ONLY}


def test_there_are_captures() -> None:
    assert len(CAPTURES) >= 6


@pytest.mark.parametrize("path", CAPTURES, ids=[p.stem for p in CAPTURES])
def test_inspect_and_the_agent_give_the_same_incidents(path: Path) -> None:
    agent, inspect = as_the_agent_publishes(path), as_inspect_reports(path)
    assert agent, "the capture holds kills"
    assert len(inspect) == len(agent)
    for mine, theirs in zip(inspect, agent):
        assert mine == theirs
