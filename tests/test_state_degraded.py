"""A state directory that cannot be written degrades the agent, never stops it (issue 19, item 5): the start goes
on without saving, says why once, and the reason is in the pipeline's view (so in /healthz) until a save works."""

from __future__ import annotations

import logging

from oomwatch.events import StateSaved
from oomwatch.sinks import StateFileSink
from oomwatch.statefile import StateFile
from oomwatch.store import Store
from tests.replay import Replay, live_settings


def test_an_uncreatable_state_directory_is_said_once_and_the_agent_runs_on(caplog) -> None:
    sink = StateFileSink(StateFile("/dev/null/state"))  # not a directory, and never can be: like EROFS for root
    with caplog.at_level(logging.ERROR):
        extra = sink.load(Store(), "boot")
    assert extra == {}
    assert sink.error and "/dev/null/state" in sink.error
    assert sum("is not saved" in r.getMessage() for r in caplog.records) == 1
    from oomwatch.pipeline import Pipeline
    from oomwatch.workloads import WorkloadResolver

    pipeline = Pipeline(live_settings(), Store(), WorkloadResolver(), now=1.0, state_error=sink.error)
    assert pipeline.view().state_error == sink.error  # what /healthz shows as "state"


def test_a_failing_then_working_save_is_said_once_each() -> None:
    replay = Replay(live_settings(), now=1.0)
    for n in range(5):  # a full disk at every save of a storm: one line, not one per save
        replay.step(StateSaved("No space left on device"), now=2.0 + n)
    assert replay.pipeline.view().state_error == "No space left on device"
    replay.step(StateSaved(None), now=10.0)
    assert replay.pipeline.view().state_error is None
    said = [message for level, message in replay.logs]
    assert sum("cannot write state" in m for m in said) == 1
    assert said.count("state written again") == 1
    assert replay.pipeline.view().store.state_errors == 5
