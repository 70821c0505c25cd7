"""Identity read more than once (issue 29 item 2): a container whose runtime bundle is written after its cgroup
appears (the read at its appearance finds nothing) is read again when it gets its first process, and when a kill
in it needs its names: the pipeline asks (Effects.read_names), the cgroup source reads the bundle and answers
(NamesRead), and the incident waits for that answer a bounded time (NAMES_WAIT_SECONDS). Fixture trees: the
golden k8s-runc node (its `dd` in container `trainer` of pod ml/train-0 is OOM-killed), its bundles copied in
only when the test says the runtime wrote them."""

from __future__ import annotations

import shutil
from pathlib import Path

from oomwatch.events import CgroupAdded, CgroupChanged, KernelLog, NamesRead, Stop
from oomwatch.stages.identity import NAMES_WAIT_SECONDS
from tests.conftest import FIXTURES, raw_records
from tests.replay import RecordedTree, Replay, live_reads, live_settings
from tests.test_replay_pod_events import single_kill

K8S = FIXTURES / "golden" / "k8s-runc"
CONTAINER = ("/kubepods/burstable/pod0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f/"
             "4f2a9c1e7b3d5a6c8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d")
TRAINER = ("ml", "train-0", "trainer", "")  # the container's series labels, named from its bundle
BOOT = 1_000.0


class Node:
    """The golden node's tree, read by the real cgroup source while the runtime's bundles are not written yet."""

    def __init__(self, tmp_path: Path) -> None:
        shutil.copytree(K8S / "cgroup", tmp_path / "cgroup")
        self.run = tmp_path / "run"
        self.run.mkdir()
        self.recorded = RecordedTree(tmp_path / "cgroup", self.run)
        self.replay = Replay(live_settings(counting=False, read_names=True), now=BOOT)
        self.found = self.recorded.start()
        self.replay.run(self.found)

    def bundles_written(self) -> None:
        shutil.copytree(K8S / "run", self.run, dirs_exist_ok=True)

    def killed(self) -> None:
        """The kernel log with the kill, read to its end, and time past its quiet windows."""
        for items in live_reads(raw_records(K8S / "kmsg")):
            self.replay.step(KernelLog(items, drained_at=BOOT + 1.0), BOOT + 1.0)
        self.replay.advance_to(BOOT + 3.0)

    def labels(self) -> set:
        return {labels for path, labels, _ in self.replay.pipeline.view().workloads if path == CONTAINER}


def test_the_read_at_appearance_finds_no_bundle(tmp_path: Path) -> None:
    node = Node(tmp_path)
    [added] = [e for e in node.found if isinstance(e, CgroupAdded) and e.path == CONTAINER]
    assert added.names is None
    assert node.labels() == {("", "", "", CONTAINER)}  # a workload without names: its series says its cgroup
    node.recorded.close()


def test_a_bundle_written_later_is_read_at_the_first_process(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.bundles_written()
    [changed] = [e for e in node.recorded.populated(CONTAINER) if isinstance(e, CgroupChanged)]
    assert changed.names is not None and (changed.names.namespace, changed.names.pod) == ("ml", "train-0")
    node.replay.step(changed, BOOT + 0.5)
    assert node.labels() == {TRAINER}
    assert node.recorded.populated(CONTAINER)[0].names is None  # named now: not read again
    node.recorded.close()


def test_a_kill_asks_for_the_names_and_its_incident_waits_for_them(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.killed()
    # complete, and waiting for the names it asked for
    assert node.replay.names_asked == [CONTAINER] and node.replay.published == []
    node.bundles_written()  # (the runtime wrote it late: it is there when the kill needs it)
    [answer] = node.recorded.read_names(CONTAINER)
    assert isinstance(answer, NamesRead) and answer.names is not None
    answered_at = node.replay.now + 0.01
    node.replay.step(answer, answered_at)
    [incident] = node.replay.published
    assert (incident.workload.namespace, incident.workload.pod, incident.workload.container) == (
        "ml", "train-0", "trainer")
    assert "train-0" in incident.explanation and incident.detected_at == answered_at
    assert node.labels() == {TRAINER}
    node.recorded.close()


def test_names_that_never_come_are_waited_for_a_bounded_time(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.killed()
    waited_until = node.replay.pipeline.next_deadline()
    assert node.replay.published == [] and BOOT + 1.0 + NAMES_WAIT_SECONDS <= waited_until
    assert waited_until <= BOOT + 3.0 + NAMES_WAIT_SECONDS
    node.replay.settle()
    [incident] = node.replay.published
    assert incident.workload.pod is None and incident.detected_at == waited_until
    node.recorded.close()


def test_a_bundle_that_is_gone_answers_at_once(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.killed()
    [answer] = node.recorded.read_names(CONTAINER)
    assert answer == NamesRead(CONTAINER, None)
    node.replay.step(answer, node.replay.now + 0.01)
    [incident] = node.replay.published
    assert incident.workload.pod is None
    node.recorded.close()


def test_a_stop_publishes_an_incident_waiting_for_its_names(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.killed()
    assert node.replay.published == []
    node.replay.step(Stop(), node.replay.now + 0.01)  # nothing would answer any more
    [incident] = node.replay.published
    assert incident.workload.pod is None and node.replay.done
    node.recorded.close()


def test_an_incident_waiting_for_its_names_is_not_counted_again_from_memory_events(tmp_path: Path) -> None:
    """memory.events counted the kill before the log printed it; the incident waits for its names past the
    counters' settle time, the log read to its end meanwhile: the counts stage must not take the kill for one no
    record describes (its lines are accounted only once it is named and published)."""
    events = tmp_path / "cgroup" / CONTAINER.lstrip("/") / "memory.events.local"
    shutil.copytree(K8S / "cgroup", tmp_path / "cgroup")
    counted = events.read_text()  # the kernel's counters after the kill: oom_kill 3, oom_group_kill 1
    events.write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    recorded = RecordedTree(tmp_path / "cgroup", tmp_path / "run")
    replay = Replay(live_settings(read_names=True), now=BOOT)
    replay.run(recorded.start())
    replay.step(KernelLog([], drained_at=BOOT))
    events.write_text(counted)
    # (as if the source had not read the bundle at the counters' move: the kill's incident asks and waits)
    moved = recorded.changed(CONTAINER)
    replay.run([CgroupChanged(e.path, e.ino, e.local, e.oom_group, e.limited, e.pids) for e in moved], now=BOOT + 0.5)
    for items in live_reads(raw_records(K8S / "kmsg")):
        replay.step(KernelLog(items, drained_at=BOOT + 1.0), BOOT + 1.0)
    for now in (BOOT + 3.0, BOOT + 4.0, BOOT + 5.0):  # past the settle time, the log read to its end each time
        replay.advance_to(now)
        replay.step(KernelLog([], drained_at=now), now)
    assert replay.names_asked == [CONTAINER] and replay.published == []
    replay.settle()
    [incident] = replay.published
    assert incident.evidence == "kmsg" and incident.kind == "group"
    assert len(replay.pipeline.view().store.incidents) == 1  # (nothing counted from memory.events)
    recorded.close()


def test_a_container_whose_bundle_named_nothing_at_a_kill_is_not_asked_again(tmp_path: Path) -> None:
    """A container with no bundle at all (a runtime without one, a cgroup made by hand): its first kill asks, the
    answer says nothing; its next kills are published without asking or waiting."""
    node = Node(tmp_path)
    node.killed()
    [answer] = node.recorded.read_names(CONTAINER)
    node.replay.step(answer, node.replay.now + 0.01)
    assert len(node.replay.published) == 1 and node.replay.names_asked == [CONTAINER]
    node.replay.step(KernelLog(single_kill(900, 4242, CONTAINER), drained_at=BOOT + 10.0), BOOT + 10.0)
    node.replay.advance_to(BOOT + 12.0)
    first, second = node.replay.published
    assert [p.pid for p in second.killed] == [4242] and second.workload.pod is None
    assert node.replay.names_asked == [CONTAINER]
    node.recorded.close()


def kill_counted(node: Node, tmp_path: Path) -> list:
    """memory.events.local of the container as the kernel leaves it after the kill (it counts before it prints):
    what the cgroup source emits."""
    events = tmp_path / "cgroup" / CONTAINER.lstrip("/") / "memory.events.local"
    counted = events.read_text()
    events.write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    node.recorded.changed(CONTAINER)  # (the source's last reading: before the kill)
    events.write_text(counted)
    return node.recorded.changed(CONTAINER)


def test_a_bundle_written_late_is_read_when_the_kill_is_counted(tmp_path: Path) -> None:
    """The kernel counts the kill (memory.events) before it prints it: the source reads the bundle then, and the
    incident is named without asking or waiting."""
    node = Node(tmp_path)
    node.bundles_written()
    [changed] = [e for e in kill_counted(node, tmp_path) if isinstance(e, CgroupChanged)]
    assert changed.names is not None and changed.names.pod == "train-0" and not changed.nameless
    node.replay.step(changed, BOOT + 0.5)
    node.killed()
    [incident] = node.replay.published
    assert node.replay.names_asked == [] and (incident.workload.namespace, incident.workload.pod) == (
        "ml", "train-0")
    node.recorded.close()


def test_a_kill_in_a_container_without_a_bundle_does_not_wait(tmp_path: Path) -> None:
    """No bundle when the kill is counted (a runtime without one, a cgroup made by hand): its incident is
    published as soon as it is complete, without names."""
    node = Node(tmp_path)
    [changed] = [e for e in kill_counted(node, tmp_path) if isinstance(e, CgroupChanged)]
    assert changed.names is None and changed.nameless
    node.replay.step(changed, BOOT + 0.5)
    node.killed()
    [incident] = node.replay.published
    assert node.replay.names_asked == [] and incident.workload.pod is None
    node.recorded.close()


def test_the_bundle_is_read_at_the_first_counted_kill_only(tmp_path: Path) -> None:
    node = Node(tmp_path)
    [first] = [e for e in kill_counted(node, tmp_path) if isinstance(e, CgroupChanged)]
    events = tmp_path / "cgroup" / CONTAINER.lstrip("/") / "memory.events.local"
    events.write_text(events.read_text().replace("oom_kill 3", "oom_kill 4"))
    node.bundles_written()  # (too late: a container killed without its bundle is taken to have none)
    [second] = [e for e in node.recorded.changed(CONTAINER) if isinstance(e, CgroupChanged)]
    assert first.nameless and second.names is None and not second.nameless
    node.recorded.close()
