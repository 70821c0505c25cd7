"""Where published incidents go. Every sink has the same lifecycle: `start(published)` (the incidents the saved
state already holds, for a sink that must catch up), `publish(incident)` for each incident the store counted
once, `flush(state)` after the pipeline asked for a save (the state file writes it; the events file then writes
the lines it held back, so that a line never precedes the state that counts it), and `close()`. The agent calls
them in turn; a sink that fails is logged, never fatal. A sink that shows deaths' verdicts (oomwatch.deaths:
the events file, pod Events, the log) also has `publish_death(death)`, called once per death the store counted. The HTTP sink is the other kind: it serves the
pipeline's latest snapshot and never sees an incident go by."""

from __future__ import annotations

import logging
from typing import Any, Optional, Protocol, Sequence

from oomwatch.deaths import Death
from oomwatch.model import Incident

log = logging.getLogger(__name__)


class Sink(Protocol):
    def start(self, published: Sequence[dict[str, Any]]) -> None: ...

    def publish(self, incident: Incident) -> None: ...

    def publish_death(self, death: Death) -> None: ...

    def flush(self, state: Optional[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...

    def health(self) -> dict[str, str]:
        """What is wrong with it now, for /healthz: {check: why}; {} while nothing is. Read from the HTTP thread:
        only what the sink's own thread replaced whole."""
        ...


class NoLifecycle:
    """No-ops for the parts of the lifecycle a sink does not need."""

    def start(self, published: Sequence[dict[str, Any]]) -> None:
        pass

    def publish(self, incident: Incident) -> None:
        pass

    def publish_death(self, death: Death) -> None:
        pass

    def flush(self, state: Optional[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass

    def health(self) -> dict[str, str]:
        return {}


class LogSink(NoLifecycle):
    """One log line per incident: its kind, where it comes from, and the explanation."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger

    def publish(self, incident: Incident) -> None:
        source = "counted from memory.events" if incident.evidence == "memory.events" else "from the kernel log"
        self._log.info("OOM %s kill (%s): %s", incident.kind, source, incident.explanation)

    def publish_death(self, death: Death) -> None:
        sender = f", sent by {death.sender}" if death.sender else ""
        self._log.info("death: %s%s: %s", death.cause, sender, death.explanation)


class PodEventSink(NoLifecycle):
    """A Kubernetes Event on the victim's pod (oomwatch.sinks.k8s_events), for incidents in a pod."""

    def __init__(self, recorder) -> None:
        self._recorder = recorder

    def start(self, published: Sequence[dict[str, Any]]) -> None:
        self._recorder.start()

    def publish(self, incident: Incident) -> None:
        if incident.workload.pod:
            self._recorder.record(incident)

    def publish_death(self, death: Death) -> None:
        # A kernel-oom death's kill has its incident's Event already: one Event per kill, not two.
        if death.cause != "kernel-oom" and death.workload is not None and death.workload.pod:
            self._recorder.record_death(death)

    def close(self) -> None:
        self._recorder.stop()


class EventsFileSink(NoLifecycle):
    """The JSON-lines events file (oomwatch.sinks.events.EventsFile): at start it writes what the saved state
    holds and the file lacks (a crash between the two writes)."""

    def __init__(self, events_file) -> None:
        self.file = events_file

    def start(self, published: Sequence[dict[str, Any]]) -> None:
        self.file.open()
        caught_up = self.file.catch_up(list(published))
        if caught_up:
            log.info("events file: %d incident(s) the saved state holds were written now", caught_up)

    def publish(self, incident: Incident) -> None:
        self.file.publish(incident)

    def publish_death(self, death: Death) -> None:
        self.file.publish_death(death.to_json())

    def flush(self, state: Optional[dict[str, Any]]) -> None:
        self.file.flush()  # after the state that counts them (or after trying: never held for ever)

    def close(self) -> None:
        self.file.flush()  # whatever a failed state save left held
        self.file.close()

    def health(self) -> dict[str, str]:  # reported, not fatal: the incidents stay in /incidents and the state
        failing = self.file.failing
        return {"events_file": failing} if failing else {}

    @property
    def errors(self) -> int:
        """Incidents that could not be written when published."""
        return self.file.errors


class StateFileSink(NoLifecycle):
    """The state directory (oomwatch.statefile.StateFile): writes each state the pipeline hands over. `error`
    is the last save's failure (None: written), for the pipeline to hear as a StateSaved event."""

    def __init__(self, state_file) -> None:
        self.file = state_file
        self.error: Optional[str] = None

    def load(self, store, boot_id: str) -> dict[str, Any]:
        """Lock the directory (StateLocked: another agent has it) and restore `store`; the extra sections."""
        self.file.lock()
        outcome, extra = self.file.load(store, boot_id)
        (log.error if outcome.startswith(("corrupt", "kept")) else log.info)("state in %s: %s", self.file.dir,
                                                                             outcome)
        self.error = self.file.problem  # a read-only or full directory: the agent runs on, without saving
        if self.error and self.error not in outcome:  # (a state file kept as it is said so already)
            log.error("state in %s is not saved: %s", self.file.dir, self.error)
        return extra

    def flush(self, state: Optional[dict[str, Any]]) -> None:
        if state is None:
            return
        try:
            self.file.save(_Prepared(state), {})
            self.error = None
        except OSError as exc:
            self.error = str(exc.strerror or exc)

    def close(self) -> None:
        self.file.unlock()


class _Prepared:
    """A state already built by the pipeline, in the shape StateFile.save takes (a store's to_state())."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def to_state(self) -> dict[str, Any]:
        return dict(self._state)
