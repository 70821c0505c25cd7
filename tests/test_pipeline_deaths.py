"""Deaths through Pipeline.step() (issue 22 item 1): the proc connector's exits of a workload's processes, the
kernel log's incidents and memory.events, replayed on the golden Kubernetes node's tree (tests/replay.py) with
an injected clock. Each death gets one verdict (oomwatch.deaths), counted once per workload in
oomwatch_deaths_total{cause}; only the kernel's kills are incidents and count in oomwatch_oom_kills_total."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterable

from oomwatch.deaths import SIGKILL, SIGTERM, Death
from oomwatch.events import KernelLog, OomdMarksRead, ProcessExeced, ProcessExited, Stop
from oomwatch.model import death_key_of_json, incident_key_of_json
from oomwatch.pipeline import POD_STATUS_WAIT_SECONDS, Effects, Settings
from oomwatch.sinks.events import EventsFile, written_keys
from oomwatch.sources.cgroupfs import Proc
from oomwatch.sources.containerlog import ContainerLogs
from oomwatch.store import Store
from oomwatch.timefmt import parse_iso8601
from oomwatch.workloads import WorkloadResolver
from tests.conftest import BOOT_TIME, DETECTED_AT, FIXTURES, raw_records
from tests.replay import (LiveReader, RecordedTree, Replay, live_settings, pod_updated, pods_listed, saved_log_events,
                          tree_events)
from tests.test_golden import golden_config

K8S = FIXTURES / "golden" / "k8s-runc"
POD_UID = "0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f"
CONTAINER = f"/kubepods/burstable/pod{POD_UID}/4f2a9c1e7b3d5a6c8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d"
TRAINER = ("ml", "train-0", "trainer", "")  # the container's series labels (names from its runtime bundle)
BOOT = 1_000.0
GPULOG = FIXTURES / "gpulogs" / "pytorch-16417-torch2.2-cuda-oom.split.cri.log"


class Deaths(Replay):
    """A Replay that also gathers the deaths its steps published and the logs they asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("answer_wakes", False)  # these tests step the kernel log's reads themselves
        super().__init__(*args, **kwargs)
        self.deaths: list[Death] = []
        self.log_requests: list = []

    def step(self, event: Any, now: float | None = None) -> Effects:
        fx = super().step(event, now)
        self.deaths += fx.deaths
        self.log_requests += fx.read_logs
        return fx


def k8s_node(tmp_path: Path, oom_group: int = 1, **settings: Any) -> tuple[Deaths, RecordedTree]:
    tree = tmp_path / "cgroup"
    shutil.copytree(K8S / "cgroup", tree)
    (tree / CONTAINER.lstrip("/") / "memory.oom.group").write_text(f"{oom_group}\n")
    for name in ("memory.events.local", "memory.events"):  # a new run of the container: no OOM kill in it yet
        (tree / CONTAINER.lstrip("/") / name).write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    recorded = RecordedTree(tree, K8S / "run")
    replay = Deaths(live_settings(boot_time=BOOT, **settings), now=BOOT)
    replay.run(recorded.start())
    replay.step(KernelLog([], drained_at=BOOT))  # the log read to its end: nothing in it
    return replay, recorded


def waits_for(replay: Replay, answer: str) -> bool:
    """A death of the replay's pipeline waits for this answer ("log", "ray", "status")."""
    return answer in replay.pipeline.deaths_waiting().values()


def started(replay: Replay, pid: int, ns_pid: int, comm: str, at: float) -> None:
    replay.step(ProcessExeced(pid, CONTAINER, ns_pid, comm), at)


def log_read(replay: Replay, at: float) -> None:
    """The kernel log's reader reads to its end at `at` (what the pipeline's wake asks for): nothing new."""
    replay.step(KernelLog([], drained_at=at), at)


def no_oom_kills(replay: Replay) -> None:
    store = replay.pipeline.view().store
    assert replay.published == [] and store.incidents == ()
    assert set(store.node_kills.values()) == {0}
    assert all(not any(c.kills.values()) and not any(c.killed.values()) for c in store.workloads.values())


def test_a_container_sigkilled_by_a_process_is_userspace_not_an_oom_kill(tmp_path: Path) -> None:
    replay, recorded = k8s_node(tmp_path)
    started(replay, 5001, 1, "python3", BOOT + 1.0)  # the container's init: its main process
    started(replay, 5002, 7, "worker", BOOT + 1.1)
    replay.step(ProcessExited(4000, None, BOOT + 2.0, code=0))  # a process outside any workload: nothing
    replay.step(ProcessExited(5002, SIGKILL, BOOT + 5.0), BOOT + 5.0)
    replay.step(ProcessExited(5001, SIGKILL, BOOT + 5.001), BOOT + 5.001)
    replay.run(recorded.removed(CONTAINER), now=BOOT + 5.3)  # the runtime removes the cgroup before it settles
    recorded.close()
    assert replay.deaths == [] and len(replay.pipeline.deaths) == 1  # collected, not yet complete
    assert replay.pipeline.next_deadline() == BOOT + 5.001 + 2.0  # complete then: the loop wakes for it
    wakes = replay.wakes
    replay.advance_to(BOOT + 8.0)
    # Complete, but the kernel log has not been read since the exits: a kill's lines may be on their way.
    assert replay.deaths == [] and replay.wakes == wakes + 1  # a read is asked for, once
    log_read(replay, BOOT + 8.1)  # (within the gone workload's grace period: its series are still there)
    [death] = replay.deaths
    assert (death.cause, death.sender, death.pid, death.main, death.signal, death.processes) == (
        "userspace", "unknown", 5001, True, SIGKILL, 2)
    assert (death.workload.pod, death.workload.container, death.cgroup) == ("train-0", "trainer", CONTAINER)
    assert "not by the kernel's OOM killer" in death.explanation
    assert death.last_exit is not None and death.last_exit.verdict == "no"
    no_oom_kills(replay)
    store = replay.pipeline.view().store
    assert dict(store.workloads[TRAINER].deaths) == {"kernel-oom": 0, "userspace": 1, "gpu-oom": 0,
                                                     "alloc-failure": 0, "not-oom": 0}
    assert [d["cause"] for d in store.deaths] == ["userspace"]
    # Counted in the state saved after it; a restart keeps the count and knows the death (counted once).
    state = replay.saves[-1]
    again = Replay.restarted(state, live_settings(boot_time=BOOT), now=BOOT + 60.0)
    store = again.pipeline.store
    assert store.snapshot().workloads[TRAINER].deaths["userspace"] == 1
    assert not store.count_death(death.key, death.cause, TRAINER, death.to_json())
    assert store.snapshot().workloads[TRAINER].deaths["userspace"] == 1


def test_the_metrics_count_deaths_apart_from_oom_kills(tmp_path: Path) -> None:
    """oomwatch_deaths_total{cause}: from a workload's first death on, one series per cause (issue 14's budget
    of 16 series per workload holds for the others); the OOM-kill counters stay at 0."""
    replay, recorded = k8s_node(tmp_path)
    config = golden_config(K8S, tmp_path)
    config = config.__class__(**{**config.__dict__, "cgroup_root": str(tmp_path / "cgroup")})
    series = 'cgroup="",container="trainer",namespace="ml",pod="train-0"'
    assert f'oomwatch_deaths_total{{cause="userspace",{series}}}' not in replay.metrics(config).decode()
    started(replay, 5001, 1, "python3", BOOT + 1.0)
    replay.step(ProcessExited(5001, SIGKILL, BOOT + 5.0), BOOT + 5.0)
    replay.settle()
    text = replay.metrics(config).decode()
    recorded.close()
    assert [line for line in text.splitlines() if line.startswith("oomwatch_deaths_total{")] == [
        f'oomwatch_deaths_total{{cause="{cause}",{series}}} {1.0 if cause == "userspace" else 0.0}'
        for cause in ("kernel-oom", "userspace", "gpu-oom", "alloc-failure", "not-oom")]
    for kind in ("single", "group"):
        assert (f'oomwatch_oom_kills_total{{cgroup="",container="trainer",kind="{kind}",namespace="ml",'
                'pod="train-0"} 0.0') in text


def kernel_kill_run(tmp_path: Path, exits: Iterable[tuple[int, int]]) -> Deaths:
    """The golden node's group kill (victim 127 and 119 in the trainer container), its saved log replayed after
    the exits the proc connector reported: (pid, signal) at the kill's time."""
    config = golden_config(K8S, tmp_path)
    replay = Deaths(Settings(boot_id=Proc(config.proc).boot_id(), boot_time=BOOT_TIME, kmsg_source=None,
                             counting=False), now=DETECTED_AT)
    tree = RecordedTree(K8S / "cgroup", K8S / "run")
    replay.run(tree.start())
    tree.close()
    replay.step(ProcessExeced(119, CONTAINER, 1, "python3"))  # the container's init
    replay.step(ProcessExeced(127, CONTAINER, 9, "python3"))
    kill_time = parse_iso8601(json.loads((K8S / "expected-incidents.json").read_text())[0]["time"])
    for pid, signal in exits:
        replay.step(ProcessExited(pid, signal, kill_time + 0.05), DETECTED_AT)
    replay.run(saved_log_events(K8S / "kmsg"))
    replay.settle()
    return replay


def test_a_kill_whose_lines_come_after_its_exits_is_still_kernel_oom(tmp_path: Path) -> None:
    """On a slow node in a storm the proc connector's exits come first and the kernel log's lines of the kill
    seconds later: the death waits for the log to be read past its exits (it asks for a read), then is the
    kernel's. The golden node's group kill, its raw records through the live reader."""
    tree = tmp_path / "cgroup"
    shutil.copytree(K8S / "cgroup", tree)
    recorded = RecordedTree(tree, K8S / "run")
    kill_time = parse_iso8601(json.loads((K8S / "expected-incidents.json").read_text())[0]["time"])
    replay = Deaths(live_settings(boot_time=BOOT_TIME), now=kill_time - 60)
    replay.run(recorded.start())
    recorded.close()
    replay.step(KernelLog([], drained_at=kill_time - 60))
    replay.step(ProcessExeced(119, CONTAINER, 1, "python3"), kill_time - 30)
    replay.step(ProcessExeced(127, CONTAINER, 9, "python3"), kill_time - 30)
    replay.step(ProcessExited(127, SIGKILL, kill_time + 0.05), kill_time + 0.05)
    replay.step(ProcessExited(119, SIGKILL, kill_time + 0.06), kill_time + 0.06)
    due = replay.pipeline.next_deadline()
    assert due == kill_time + 0.06 + 2.0
    replay.tick(due)  # as the loop steps it: complete, held, a read of the kernel log asked for
    assert replay.deaths == [] and replay.wakes == 1
    assert replay.pipeline.next_deadline() == due + 10.0  # (no spin: the read wakes it before)
    reader = LiveReader()
    items = reader.read(raw_records(K8S / "kmsg"))
    reader.close()
    replay.step(KernelLog(items, drained_at=kill_time + 5.1), kill_time + 5.1)
    replay.settle()
    [incident] = replay.published
    [death] = replay.deaths
    assert (death.cause, death.pid, death.incident) == ("kernel-oom", 119, incident.key)


def test_a_kernel_kill_is_kernel_oom_and_changes_no_incident(tmp_path: Path) -> None:
    without = kernel_kill_run(tmp_path, ())
    replay = kernel_kill_run(tmp_path, [(127, SIGKILL), (119, SIGKILL)])
    [incident] = replay.published
    [death] = replay.deaths
    assert (death.cause, death.sender, death.pid, death.main, death.processes, death.incident) == (
        "kernel-oom", None, 119, True, 2, incident.key)
    assert "killed by the kernel's OOM killer" in death.explanation
    # The incidents and their counts are those of a run without the proc connector's exits.
    assert replay.pipeline.view().store.incidents == without.pipeline.view().store.incidents
    store = replay.pipeline.view().store
    assert store.node_kills == without.pipeline.view().store.node_kills
    assert store.workloads[TRAINER].kills == without.pipeline.view().store.workloads[TRAINER].kills
    assert store.workloads[TRAINER].deaths["kernel-oom"] == 1 and sum(store.workloads[TRAINER].deaths.values()) == 1


def test_a_sigterm_exit_after_an_earlier_child_oom_is_not_an_oom_kill(tmp_path: Path) -> None:
    replay, recorded = k8s_node(tmp_path, oom_group=0)
    replay.answer_wakes = True  # the reader answers the wake that settles memory.events' count
    started(replay, 5001, 1, "python3", BOOT + 1.0)
    # A child of the main process is killed by the kernel: memory.events counts it (its record lost).
    events = tmp_path / "cgroup" / CONTAINER.lstrip("/")
    for name in ("memory.events.local", "memory.events"):
        (events / name).write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
    replay.run(recorded.changed(CONTAINER), now=BOOT + 10.0)
    replay.settle()
    assert [(i.evidence, i.kind) for i in replay.published] == [("memory.events", "single")]
    kills = dict(replay.pipeline.view().store.workloads[TRAINER].kills)
    # A minute later the pod is deleted: the main process ends by SIGTERM.
    replay.step(ProcessExited(5001, SIGTERM, BOOT + 70.0), BOOT + 70.0)
    replay.settle()
    recorded.close()
    [death] = replay.deaths
    assert (death.cause, death.pid, death.signal, death.main) == ("not-oom", 5001, SIGTERM, True)
    assert death.last_exit is not None and death.last_exit.to_json() == {
        "oom_killed": False, "reported_oom_killed": True, "verdict": "stale"}
    assert "this exit was not an OOM kill" in death.explanation
    store = replay.pipeline.view().store
    assert dict(store.workloads[TRAINER].kills) == kills and len(store.incidents) == 1
    assert store.workloads[TRAINER].deaths["not-oom"] == 1


def test_the_runtimes_kill_of_the_container_is_named_as_its_sender(tmp_path: Path) -> None:
    """containerd's shim stops a container with `runc --root … kill <id> 9` (the proc connector sees the exec,
    the source reads its command line at once): the SIGKILL is the runtime's stop, not a mystery."""
    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    started(replay, 5001, 1, "python3", BOOT + 1.0)
    container_id = CONTAINER.rsplit("/", 1)[1]
    other = ("runc", "--root", "/run/containerd/runc/k8s.io", "kill", "a" * 64, "9")  # another container's
    replay.step(ProcessExeced(7000, "/system.slice/containerd.service", None, "runc", other), BOOT + 4.8)
    argv = ("runc", "--root", "/run/containerd/runc/k8s.io", "--log", "/run/x/log.json", "kill", container_id, "9")
    replay.step(ProcessExeced(7001, "/system.slice/containerd.service", None, "runc", argv), BOOT + 4.9)
    replay.step(ProcessExited(5001, SIGKILL, BOOT + 5.0), BOOT + 5.0)
    replay.settle()
    [death] = replay.deaths
    assert (death.cause, death.sender) == ("userspace", "runtime-stop")
    assert f"the runtime ran `kill {container_id[:12]} 9`" in " ".join(death.evidence)
    assert "its container runtime, stopping the container" in death.explanation
    no_oom_kills(replay)


def test_a_cuda_oom_in_the_log_of_a_main_process_that_exited_1_is_gpu_oom(tmp_path: Path) -> None:
    replay, recorded = k8s_node(tmp_path, read_logs=True)
    recorded.close()
    started(replay, 5001, 1, "python3", BOOT + 1.0)
    replay.step(ProcessExited(5001, None, BOOT + 30.0, code=1), BOOT + 30.0)
    replay.advance_to(BOOT + 32.4)
    log_read(replay, BOOT + 32.5)
    # Only the container's log can tell: the pipeline asks for it, and waits.
    [request] = replay.log_requests
    assert (request.key, request.namespace, request.pod, request.pod_uid, request.container) == (
        CONTAINER, "ml", "train-0", POD_UID, "trainer")
    assert replay.deaths == []
    # The agent reads the kubelet's layout: <root>/<namespace>_<pod>_<uid>/<container>/<restart>.log, the latest.
    pods = tmp_path / "pods"
    folder = pods / f"ml_train-0_{POD_UID}" / "trainer"
    folder.mkdir(parents=True)
    (folder / "0.log").write_text("2026-11-26T10:00:00.000000000Z stdout F an earlier run ended well\n")
    shutil.copy(GPULOG, folder / "1.log")
    answer = ContainerLogs(str(pods)).read(request)
    assert answer.key == request.key and answer.finding is not None
    replay.step(answer, BOOT + 32.6)
    [death] = replay.deaths
    assert (death.cause, death.memory, death.pid, death.exit_code, death.signal) == ("gpu-oom", "gpu", 5001, 1,
                                                                                     None)
    assert death.log is not None and death.log.device == 0
    assert "GPU 0 ran out of memory" in death.explanation
    no_oom_kills(replay)
    assert replay.pipeline.view().store.workloads[TRAINER].deaths["gpu-oom"] == 1
    replay.settle()
    assert replay.pipeline.next_deadline() is None


def test_a_log_that_never_comes_leaves_an_exit_1_unjudged(tmp_path: Path) -> None:
    replay, recorded = k8s_node(tmp_path, read_logs=True)
    recorded.close()
    started(replay, 5001, 1, "python3", BOOT + 1.0)
    replay.step(ProcessExited(5001, None, BOOT + 30.0, code=1), BOOT + 30.0)
    replay.settle()
    assert len(replay.log_requests) == 1 and replay.deaths == []  # exit 1, nothing said why: not a memory death
    assert replay.pipeline.next_deadline() is None


def test_a_stop_judges_the_deaths_being_collected(tmp_path: Path) -> None:
    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    started(replay, 5001, 1, "python3", BOOT + 1.0)
    replay.step(ProcessExited(5001, SIGKILL, BOOT + 5.0), BOOT + 5.0)
    fx = replay.step(Stop(), BOOT + 5.5)
    assert [d.cause for d in fx.deaths] == ["userspace"]
    assert fx.save is not None and fx.save["death_keys"] == [list(fx.deaths[0].key)]


def test_a_stop_asks_for_no_log_it_would_never_read(tmp_path: Path) -> None:
    replay, recorded = k8s_node(tmp_path, read_logs=True)
    recorded.close()
    started(replay, 5001, 1, "python3", BOOT + 1.0)
    replay.step(ProcessExited(5001, None, BOOT + 5.0, code=1), BOOT + 5.0)  # only its log could tell why
    assert len(replay.pipeline.deaths) == 1
    fx = replay.step(Stop(), BOOT + 5.5)
    assert fx.read_logs == [] and not waits_for(replay, "log") and len(replay.pipeline.deaths) == 0
    assert fx.deaths == []  # an exit 1 with nothing to say it was memory: no verdict


def test_death_lines_in_the_events_file_are_not_incidents(tmp_path: Path) -> None:
    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    started(replay, 5001, 1, "python3", BOOT + 1.0)
    replay.step(ProcessExited(5001, SIGKILL, BOOT + 5.0), BOOT + 5.0)
    replay.settle()
    [death] = replay.deaths
    line = death.to_json()
    assert line["record"] == "death" and incident_key_of_json(line) is None
    path = tmp_path / "events.jsonl"
    events = EventsFile(str(path))
    events.open()
    events.publish_death(line)
    events.publish_death(line)  # once
    events.close()
    assert len(path.read_text().splitlines()) == 1
    assert written_keys(str(path)) == {death_key_of_json(json.loads(path.read_text()))}
    again = EventsFile(str(path))
    again.open()
    again.publish_death(line)  # a restart knows it is written
    again.close()
    assert len(path.read_text().splitlines()) == 1
    assert Store().count_death(death.key, "no-such-cause", TRAINER, line) is False


UNIT = "/system.slice/containerd.service"  # a systemd unit of the golden node's tree


def test_systemd_oomd_is_named_when_it_marked_the_unit_it_killed(tmp_path: Path) -> None:
    """systemd-oomd increments user.oomd_ooms on the unit's cgroup before its SIGKILLs: the pipeline asks for the
    marks at the unit's first SIGKILL (the agent reads them at once, before the cgroup goes) and names it."""
    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    replay.step(ProcessExeced(6001, UNIT, None, None), BOOT + 1.0)
    replay.step(ProcessExeced(6002, UNIT, None, None), BOOT + 1.0)
    fx = replay.step(ProcessExited(6001, SIGKILL, BOOT + 5.0), BOOT + 5.0)
    assert fx.read_marks == [UNIT]
    assert replay.step(ProcessExited(6002, SIGKILL, BOOT + 5.01), BOOT + 5.01).read_marks == []  # once a death
    replay.step(OomdMarksRead(UNIT, 1, 2), BOOT + 5.02)
    replay.settle()
    [death] = replay.deaths
    assert (death.cause, death.sender, death.processes, death.workload.unit) == (
        "userspace", "systemd-oomd", 2, "containerd.service")
    assert "systemd-oomd marked /system.slice/containerd.service: user.oomd_ooms 0 → 1, user.oomd_kill 2" in (
        death.evidence)
    assert "systemd-oomd, under memory pressure" in death.explanation
    no_oom_kills(replay)


def test_a_mark_older_than_the_agent_is_not_taken_for_this_kill(tmp_path: Path) -> None:
    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    [added] = [e for e in tree_events(tmp_path / "cgroup") if e.path == UNIT]
    replay.step(added._replace(oomd_ooms=1), BOOT + 0.5)  # marked already when the agent found it
    replay.step(ProcessExeced(6001, UNIT, None, None), BOOT + 1.0)
    replay.step(ProcessExited(6001, SIGKILL, BOOT + 5.0), BOOT + 5.0)
    replay.step(OomdMarksRead(UNIT, 1, None), BOOT + 5.02)
    replay.settle()
    assert [(d.cause, d.sender) for d in replay.deaths] == [("userspace", "unknown")]


def test_the_marks_are_read_as_systemd_oomd_writes_them(tmp_path: Path) -> None:
    """user.* xattrs (cgroupfs has them since 5.7; a temporary directory stands in here): decimal text, read by
    the cgroup source when the pipeline asks (Effects.read_marks)."""
    import os

    from oomwatch.sources.cgroupfs import CgroupFS
    from oomwatch.sources.cgroupsource import CgroupSource

    unit = tmp_path / "unit.service"
    unit.mkdir()
    source = CgroupSource(CgroupFS(str(tmp_path)), WorkloadResolver(), lambda event: None)
    try:
        assert source.read_oomd_marks("/unit.service") == OomdMarksRead("/unit.service", None, None)
        os.setxattr(unit, "user.oomd_ooms", b"3")
        os.setxattr(unit, "user.oomd_kill", b"12")
        assert source.read_oomd_marks("/unit.service") == OomdMarksRead("/unit.service", 3, 12)
        assert source.read_oomd_marks("/gone.service") == OomdMarksRead("/gone.service", None, None)
    finally:
        source.watcher.close()


def evicted_pod(reason: str | None) -> dict:
    """The container's pod as the API server returns it; after an eviction the kubelet sets its status to
    phase Failed, reason Evicted and the eviction manager's message (pkg/kubelet/eviction/helpers.go)."""
    status: dict = {"phase": "Running"}
    if reason:
        status = {"phase": "Failed", "reason": reason,
                  "message": "The node was low on resource: memory. Threshold quantity: 100Mi, available: 92564Ki. "
                             "Container trainer was using 2097152Ki, request is 0, has larger consumption of memory. "}
    return {"metadata": {"uid": POD_UID, "namespace": "ml", "name": "train-0"}, "status": status}


def with_pod_index(replay: Replay) -> None:
    """The pod source's first list: the pod, running."""
    replay.step(pods_listed(evicted_pod(None)))


def runtime_stop_in_an_indexed_pod(tmp_path: Path) -> Deaths:
    """The runtime's `runc kill <id> 9` of the container of a pod the index knows, the main process's SIGKILL,
    and the kernel log read past it: the death is complete, its sender so far the runtime's stop."""
    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    with_pod_index(replay)
    started(replay, 5001, 1, "python3", BOOT + 1.0)
    container_id = CONTAINER.rsplit("/", 1)[1]
    argv = ("runc", "--root", "/run/containerd/runc/k8s.io", "kill", container_id, "9")
    replay.step(ProcessExeced(7001, "/system.slice/containerd.service", None, "runc", argv), BOOT + 4.9)
    replay.step(ProcessExited(5001, SIGKILL, BOOT + 5.0), BOOT + 5.0)
    replay.advance_to(BOOT + 8.0)
    log_read(replay, BOOT + 8.1)
    return replay


def test_the_kubelets_eviction_is_named_once_the_pods_status_says_it(tmp_path: Path) -> None:
    """The kubelet stops an evicted pod's containers (through the runtime) before the API shows "Evicted": a
    SIGKILL death of a pod the index knows waits for its status, and is the kubelet's eviction once it comes."""
    replay = runtime_stop_in_an_indexed_pod(tmp_path)
    assert replay.deaths == []  # complete, but the pod's status may still say who sent it
    replay.step(pod_updated(evicted_pod("Evicted")))  # the pod source hears the eviction
    replay.settle()
    [death] = replay.deaths
    assert (death.cause, death.sender) == ("userspace", "kubelet-eviction")
    assert any("the pod's status: Evicted: The node was low on resource: memory." in e for e in death.evidence)
    no_oom_kills(replay)


def test_a_pod_that_is_not_evicted_keeps_the_runtimes_stop_after_the_wait(tmp_path: Path) -> None:
    replay = runtime_stop_in_an_indexed_pod(tmp_path)
    assert replay.deaths == [] and replay.pipeline.next_deadline() == BOOT + 8.1 + POD_STATUS_WAIT_SECONDS
    replay.settle()
    [death] = replay.deaths
    assert (death.cause, death.sender) == ("userspace", "runtime-stop")
    assert death.detected_at == BOOT + 8.1 + POD_STATUS_WAIT_SECONDS


def test_a_stop_judges_a_death_waiting_for_its_pods_status(tmp_path: Path) -> None:
    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    with_pod_index(replay)
    started(replay, 5001, 1, "python3", BOOT + 1.0)
    replay.step(ProcessExited(5001, SIGKILL, BOOT + 5.0), BOOT + 5.0)
    replay.advance_to(BOOT + 8.0)
    log_read(replay, BOOT + 8.1)
    assert replay.deaths == []
    replay.step(Stop(), BOOT + 9.0)
    [death] = replay.deaths
    assert (death.cause, death.sender) == ("userspace", "unknown")


# --- Ray's memory monitor (its raylet.out) ----------------------------------------------------------------------

GPULOGS = FIXTURES / "gpulogs"
RAYLET_KILLS = GPULOGS / "ray-docs-raylet-memory-monitor.txt"  # selects pids 3310152 and 3310153 (Ray's docs)
RAY_OTHER_KILL = GPULOGS / "ray-docs-driver-outofmemoryerror.txt"  # names pid=11362
RAY_SUMMARY = GPULOGS / "ray-docs-raylet-summary.txt"  # raylet's periodic summary: names no pid


def ray_pod(labels: dict | None = None, owner_kind: str | None = "RayCluster") -> dict:
    """A KubeRay worker pod as the API server returns it: owned by its RayCluster, labelled with its node type."""
    metadata: dict = {"uid": POD_UID, "namespace": "ml", "name": "train-0",
                      "labels": {"ray.io/node-type": "worker", "ray.io/cluster": "raycluster-kuberay"}
                      if labels is None else labels}
    if owner_kind:
        metadata["ownerReferences"] = [{"kind": owner_kind, "name": "raycluster-kuberay", "controller": True,
                                        "apiVersion": "ray.io/v1", "uid": "7d0f4c55-0000-4000-8000-00000000aaaa"}]
    return {"metadata": metadata, "status": {"phase": "Running"}}


def with_ray_pod(replay: Replay, pod: dict | None = None) -> None:
    """The pod source's first list: the Ray pod."""
    replay.step(pods_listed(pod or ray_pod()))


def ray_worker_sigkilled(replay: Deaths) -> Effects:
    """The Ray container's init and a worker (pid 3310152 in the container), exec'd; the worker SIGKILLed; the
    death complete and the kernel log read past it: returns that read's effects (where the death is judged)."""
    started(replay, 5001, 1, "ray", BOOT + 1.0)
    started(replay, 5100, 3310152, "ray::hungry_hip", BOOT + 2.0)
    replay.step(ProcessExited(5100, SIGKILL, BOOT + 5.0), BOOT + 5.0)
    replay.advance_to(BOOT + 8.0)
    return replay.step(KernelLog([], drained_at=BOOT + 8.1), BOOT + 8.1)


def test_a_ray_worker_killed_by_rays_memory_monitor_is_named_from_raylet_out(tmp_path: Path) -> None:
    """A SIGKILL in a Ray pod with no sender known: the pipeline asks for raylet.out (once), the agent's reader
    finds it through a live process of the container, and raylet.out names the worker by its pid in the
    container: the sender is Ray's memory monitor, and no OOM kill is counted."""
    from oomwatch.pipeline import RAY_LOG_WAIT_SECONDS, RayLogRequest
    from oomwatch.sources.cgroupfs import CgroupFS
    from oomwatch.sources.raylet import RayletLogs

    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    with_ray_pod(replay)
    fx = ray_worker_sigkilled(replay)
    assert fx.read_ray_logs == [RayLogRequest(CONTAINER, CONTAINER)] and fx.deaths == []
    assert replay.pipeline.next_deadline() == BOOT + 8.1 + RAY_LOG_WAIT_SECONDS  # never waits longer for it
    # The container as the agent sees it: the raylet (pid 5003) still lives; raylet.out behind Ray's absolute
    # session_latest link, in the container's own file tree.
    (tmp_path / "cgroup" / CONTAINER.lstrip("/") / "cgroup.procs").write_text("5001\n5003\n")
    session = tmp_path / "proc" / "5001" / "root" / "tmp" / "ray" / "session_2026-11-26_14-00-00_123456_1"
    (session / "logs").mkdir(parents=True)
    (session / "logs" / "raylet.out").write_text(RAY_SUMMARY.read_text() + "\n" + RAYLET_KILLS.read_text())
    (session.parent / "session_latest").symlink_to("/tmp/ray/session_2026-11-26_14-00-00_123456_1")
    [request] = fx.read_ray_logs  # read by the raylet source, as the agent has it
    read = RayletLogs(CgroupFS(str(tmp_path / "cgroup")), str(tmp_path / "proc")).read(request)
    assert read.killed_pids == {3310152, 3310153} and read.error is None
    fx = replay.step(read, BOOT + 8.2)
    assert fx.read_ray_logs == []  # once per death
    replay.settle()  # (then the pod's status: an eviction would still be the more specific sender)
    [death] = replay.deaths
    assert (death.cause, death.sender, death.pid, death.comm, death.main) == (
        "userspace", "ray-memory-monitor", 5100, None, False)
    assert ("raylet.out: Ray's memory monitor killed pid 5100 (pid 3310152 in its container, as raylet.out "
            "names it)") in death.evidence
    assert "was killed with SIGKILL by Ray's memory monitor, not by the kernel's OOM killer" in death.explanation
    no_oom_kills(replay)


def test_raylet_out_naming_another_pid_leaves_the_sender_unknown(tmp_path: Path) -> None:
    from oomwatch.events import RayLogRead
    from oomwatch.parse.raylet import ray_killed_pids

    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    with_ray_pod(replay)
    assert ray_worker_sigkilled(replay).read_ray_logs
    replay.step(RayLogRead(CONTAINER, ray_killed_pids(RAY_OTHER_KILL.read_text())), BOOT + 8.2)  # pid=11362
    replay.settle()
    assert [(d.cause, d.sender) for d in replay.deaths] == [("userspace", "unknown")]
    no_oom_kills(replay)


def test_no_raylet_out_judges_without_it(tmp_path: Path) -> None:
    """No Ray session where Ray puts it by default (or the container gone): the read says None, and the death is
    judged at once with what else is known; no answer at all: judged when the wait ends."""
    from oomwatch.pipeline import RAY_LOG_WAIT_SECONDS
    from oomwatch.sources.cgroupfs import CgroupFS
    from oomwatch.sources.raylet import RayletLogs

    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    with_ray_pod(replay, ray_pod(labels={"ray.io/node-type": "head"}, owner_kind=None))  # the label alone
    [request] = ray_worker_sigkilled(replay).read_ray_logs
    (tmp_path / "cgroup" / CONTAINER.lstrip("/") / "cgroup.procs").write_text("5001\n")
    (tmp_path / "proc" / "5001" / "root" / "tmp").mkdir(parents=True)
    read = RayletLogs(CgroupFS(str(tmp_path / "cgroup")), str(tmp_path / "proc")).read(request)
    assert read.killed_pids is None and read.error is None  # a missing file is normal: nothing to say
    fx = replay.step(read, BOOT + 8.2)
    assert fx.logs == [] and not waits_for(replay, "ray")
    replay.settle()
    assert [(d.cause, d.sender) for d in replay.deaths] == [("userspace", "unknown")]

    again, recorded = k8s_node(tmp_path / "again")
    recorded.close()
    with_ray_pod(again)
    assert ray_worker_sigkilled(again).read_ray_logs
    again.advance_to(BOOT + 8.1 + RAY_LOG_WAIT_SECONDS)  # no RayLogRead came: waited no longer
    assert not waits_for(again, "ray")
    again.settle()
    assert [(d.cause, d.sender) for d in again.deaths] == [("userspace", "unknown")]


def test_a_refused_read_of_raylet_out_is_said_once(tmp_path: Path) -> None:
    from oomwatch.events import RayLogRead

    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    with_ray_pod(replay)
    ray_worker_sigkilled(replay)
    refused = "Permission denied reading /proc/5001/root (…)"
    fx = replay.step(RayLogRead(CONTAINER, None, refused), BOOT + 8.2)
    assert [message for _, message in fx.logs] == [
        f"cannot read Ray's raylet.out: {refused}; deaths in Ray pods are judged without it (said once)"]
    assert replay.step(RayLogRead("/elsewhere", None, refused), BOOT + 8.3).logs == []
    replay.settle()
    assert [(d.cause, d.sender) for d in replay.deaths] == [("userspace", "unknown")]


def test_a_pod_without_ray_asks_for_no_raylet_out(tmp_path: Path) -> None:
    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    with_ray_pod(replay, ray_pod(labels={"app": "trainer"}, owner_kind="StatefulSet"))
    assert ray_worker_sigkilled(replay).read_ray_logs == []
    replay.settle()
    assert [(d.cause, d.sender) for d in replay.deaths] == [("userspace", "unknown")]
    # Nor without the Kubernetes API (nothing says the pod runs Ray).
    bare, recorded = k8s_node(tmp_path / "bare")
    recorded.close()
    assert ray_worker_sigkilled(bare).read_ray_logs == []
    [death] = bare.deaths
    assert (death.cause, death.sender) == ("userspace", "unknown")


def test_a_stop_judges_a_death_waiting_for_raylet_out(tmp_path: Path) -> None:
    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    with_ray_pod(replay)
    assert ray_worker_sigkilled(replay).read_ray_logs
    fx = replay.step(Stop(), BOOT + 8.5)
    assert fx.read_ray_logs == [] and [(d.cause, d.sender) for d in fx.deaths] == [("userspace", "unknown")]
    assert not waits_for(replay, "ray") and not waits_for(replay, "status")
