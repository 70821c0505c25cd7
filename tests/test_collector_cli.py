"""`oomwatch agent --drop-series` (and OOMWATCH_DROP_SERIES) reach the Config; unknown names are refused."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from oomwatch import cli


@pytest.fixture
def seen(monkeypatch) -> dict:
    import oomwatch.agent as agent_module

    seen: dict = {}

    class FakeAgent:
        def __init__(self, config, **kwargs) -> None:
            seen["config"] = config

        def run_until_signalled(self) -> int:
            return 0

    monkeypatch.setattr(agent_module, "Agent", FakeAgent)
    return seen


def test_drop_series_option_and_env(seen: dict) -> None:
    result = CliRunner().invoke(cli.main, ["agent", "--drop-series", "memory-events, pods"])
    assert result.exit_code == 0, result.output
    assert seen["config"].drop_series == ("memory-events", "pods")
    result = CliRunner().invoke(cli.main, ["agent"], env={"OOMWATCH_DROP_SERIES": "pods"})
    assert result.exit_code == 0, result.output
    assert seen["config"].drop_series == ("pods",)
    result = CliRunner().invoke(cli.main, ["agent"])
    assert seen["config"].drop_series == ()


def test_unknown_series_name_is_a_clear_error(seen: dict) -> None:
    result = CliRunner().invoke(cli.main, ["agent", "--drop-series", "containers"])
    assert result.exit_code == 2
    assert "--drop-series" in result.output and "memory-events" in result.output
    assert "config" not in seen
