"""The workload cap covers live workloads too (issue 19, item 7): beyond it a live workload gets no series, and
the agent says so (one log line when it starts and one when it ends, a count in its view, /healthz), instead of
exporting some and silently not others. Room made by gone workloads expiring is given to those left out."""

from __future__ import annotations

import logging

from oomwatch.events import CgroupAdded, CgroupRemoved
from oomwatch.store import Store
from tests.replay import Replay, live_settings


def limited(path: str) -> CgroupAdded:
    return CgroupAdded(path, 1, None, 0, True, ())  # a cgroup with a memory limit: a workload


def test_live_workloads_over_the_cap_are_left_out_and_said() -> None:
    replay = Replay(live_settings(), store=Store(max_workloads=3, grace_seconds=60.0), now=10.0)
    replay.run(limited(f"/w{i}") for i in range(5))
    view = replay.pipeline.view()
    assert [path for path, _, _ in view.workloads] == ["/w0", "/w1", "/w2"]
    assert view.workloads_over_cap == 2
    errors = [m for level, m in replay.logs if level == logging.ERROR]
    assert len(errors) == 1 and "more than 3 live workloads" in errors[0]
    # /w0 goes away: its series stay for the grace period, then make room for one left out.
    replay.step(CgroupRemoved("/w0"), now=20.0)
    assert replay.pipeline.view().workloads_over_cap == 2
    replay.advance_to(81.0)
    view = replay.pipeline.view()
    assert sorted(path for path, _, _ in view.workloads) == ["/w1", "/w2", "/w3"]
    assert view.workloads_over_cap == 1
    replay.step(CgroupRemoved("/w4"), now=82.0)
    assert replay.pipeline.view().workloads_over_cap == 0
    assert replay.logs[-1] == (logging.INFO, "every live workload is exported again")
