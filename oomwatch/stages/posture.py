"""The node's posture as the kubelet's config says it (`singleProcessOOMKill`): it changes how an incident is
explained, so the stages that build incidents take `explain` from here."""

from __future__ import annotations

from typing import Any, Optional

from oomwatch.events import PostureRead
from oomwatch.explain import explain
from oomwatch.model import Incident
from oomwatch.stages import Effects

VIEWS = ()


class PostureStage:
    TAKES = (PostureRead,)

    def __init__(self, single_process_oom_kill: str) -> None:
        self.single_process_oom_kill = single_process_oom_kill

    def step(self, event: Any, now: float, fx: Effects) -> list:
        fx.changed = self.single_process_oom_kill != event.single_process_oom_kill
        self.single_process_oom_kill = event.single_process_oom_kill
        return []

    def advance(self, now: float, fx: Effects) -> list:
        return []

    def next_deadline(self) -> Optional[float]:
        return None

    def explain(self, incident: Incident) -> str:
        return explain(incident, self.single_process_oom_kill)
