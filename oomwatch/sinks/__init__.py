"""Where published incidents go. Every sink takes the same call, `publish(incident)`; the agent calls each in
turn after the store has counted the incident once, and a sink that fails is logged, never fatal."""

from __future__ import annotations

import logging
from typing import Protocol

from oomwatch.model import Incident


class IncidentSink(Protocol):
    def publish(self, incident: Incident) -> None: ...


class LogSink:
    """One log line per incident: its kind, where it comes from, and the explanation."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger

    def publish(self, incident: Incident) -> None:
        source = "counted from memory.events" if incident.evidence == "memory.events" else "from the kernel log"
        self._log.info("OOM %s kill (%s): %s", incident.kind, source, incident.explanation)


class PodEventSink:
    """A Kubernetes Event on the victim's pod (oomwatch.sinks.k8s_events), for incidents in a pod."""

    def __init__(self, recorder) -> None:
        self._recorder = recorder

    def publish(self, incident: Incident) -> None:
        if incident.workload.pod:
            self._recorder.record(incident)
