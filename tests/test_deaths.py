"""Every workload death that looks like a memory death gets one verdict (oomwatch.deaths): table-driven over
the cases of issue 22 and the senders the node can name, the grouping of exits into deaths, and the parsers of
what the sources read for it (a runtime's `runc kill` command line, systemd-oomd's xattrs, raylet.out)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

from oomwatch.deaths import (
    CAUSES,
    SENDERS,
    SIGABRT,
    SIGKILL,
    SIGTERM,
    DeathTracker,
    Evidence,
    Exit,
    ExitGroup,
    KernelKill,
    OomdMark,
    PodStatus,
    classify,
    death_json,
    deaths_of,
    kernel_kill_of,
    needs_log,
    runs_ray,
)
from oomwatch.model import Incident, KilledProcess, Workload
from oomwatch.parse.gpulog import parse_log_tail
from oomwatch.parse.oomd import parse_oomd_xattr
from oomwatch.parse.raylet import ray_killed_pids
from oomwatch.parse.runtime import RuntimeKill, runtime_kill_from_argv

GPULOGS = Path(__file__).resolve().parents[1] / "fixtures" / "gpulogs"
CID = "3f1a6c0e9b2d4c8a7e5f1b3d9c0a2e4f6b8d0c2e4a6b8d0f2e4c6a8b0d2f4e6a"
POD = ("/kubepods.slice/kubepods-burstable.slice/"
       "kubepods-burstable-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice")
CONTAINER = f"{POD}/cri-containerd-{CID}.scope"
TRAINER = Workload(type="k8s-container", cgroup=CONTAINER, namespace="ml", pod="train-0", container="trainer",
                   pod_uid="0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", container_id=CID, runtime="containerd",
                   pod_cgroup=POD)
UNIT = Workload(type="systemd", cgroup="/user.slice/user-1000.slice/user@1000.service/app.slice/build.scope",
                unit="build.scope")
T = 1_790_000_000.0


def run(*exits: Exit, settle: float = 2.0) -> ExitGroup:
    """The exits through a tracker, as the pipeline feeds them: one death, due `settle` after the last."""
    tracker = DeathTracker(settle=settle)
    for e in exits:
        assert tracker.add(e, e.time)
    assert tracker.due(max(e.time for e in exits) + settle - 0.01) == []
    groups = tracker.due(max(e.time for e in exits) + settle)
    assert len(groups) == 1 and len(tracker) == 0
    return groups[0]


def container_exits(main_signal: Optional[int] = SIGKILL, code: Optional[int] = None, others: int = 2,
                    at: float = T, workload: str = CONTAINER) -> list[Exit]:
    """The container's init (pid 4100, its pid 1) and `others` processes SIGKILLed as the pid namespace
    ends."""
    main = Exit(pid=4100, time=at, workload=workload, cgroup=workload, signal=main_signal, code=code,
                comm="python", main=True, ns_pid=1)
    rest = [Exit(pid=4101 + n, time=at + 0.001 * (n + 1), workload=workload, cgroup=workload, signal=SIGKILL,
                 comm="pt_data_worker", ns_pid=7 + n) for n in range(others)]
    return [main] + rest


def kill(pids: set[int], at: float, kind: str = "group", counted: bool = False,
         cgroups: tuple[str, ...] = (CONTAINER,)) -> KernelKill:
    return KernelKill(time=at, pids=frozenset(pids), cgroups=cgroups, kind=kind,
                      key=("boot", 517, min(pids or {0})), victim=min(pids) if pids else None,
                      counted=counted)


def log_of(name: str):
    found = parse_log_tail((GPULOGS / name).read_bytes())
    assert found is not None
    return found


# name → (exits, evidence, expected cause, sender, pid the verdict is about, last_exit verdict or None)
CASES = {
    # Issue 22: a container process SIGKILLed by another process: userspace, no incident, no count.
    "sigkill-by-another-process": (
        container_exits(), Evidence(workload=TRAINER, oom_kills_in_window=0, oom_kills_in_run=0),
        "userspace", "unknown", 4100, "no"),
    # Issue 22: a container killed by the kernel (a group kill: memory.oom.group=1, the kubelet's default).
    "kernel-group-kill": (
        container_exits(), Evidence(workload=TRAINER, kernel_kills=(kill({4100, 4101, 4102}, T - 0.2),),
                                    oom_kills_in_window=3, oom_kills_in_run=3),
        "kernel-oom", None, 4100, "confirmed"),
    # A single kill of a data-loader child: the main process is not killed, its status will not be OOMKilled's
    # doing of this death (the child was the victim).
    "kernel-single-kill-of-a-child": (
        [Exit(pid=4102, time=T, workload=CONTAINER, signal=SIGKILL, comm="pt_data_worker")],
        Evidence(workload=TRAINER, kernel_kills=(kill({4102}, T - 0.01, kind="single"),), oom_kills_in_run=1),
        "kernel-oom", None, 4102, None),
    # Issue 22: a SIGTERM exit after an earlier child OOM: the cumulative counter says OOMKilled, this exit
    # was not.
    "sigterm-after-an-earlier-child-oom": (
        container_exits(main_signal=SIGTERM, others=0, at=T + 600),
        Evidence(workload=TRAINER, kernel_kills=(kill({4102}, T, kind="single"),), oom_kills_in_window=0,
                 oom_kills_in_run=1),
        "not-oom", None, 4100, "stale"),
    # The same when a shell traps the signal and exits 143, and when the earlier kill was seconds before.
    "exit-143-after-a-child-oom-seconds-before": (
        container_exits(main_signal=None, code=143, others=0, at=T + 5),
        Evidence(workload=TRAINER, kernel_kills=(kill({4102}, T, kind="single"),), oom_kills_in_window=0,
                 oom_kills_in_run=1),
        "not-oom", None, 4100, "stale"),
    # Children killed by the kernel, then the main process SIGTERMed in the same burst: a kernel kill, and the
    # container's last exit (its main process's) was not an OOM kill although its status will say so.
    "child-oom-then-main-sigterm": (
        [Exit(pid=4102, time=T, workload=CONTAINER, signal=SIGKILL, comm="pt_data_worker"),
         Exit(pid=4100, time=T + 0.5, workload=CONTAINER, signal=SIGTERM, comm="python", main=True)],
        Evidence(workload=TRAINER, kernel_kills=(kill({4102}, T - 0.01, kind="single"),), oom_kills_in_run=1),
        "kernel-oom", None, 4102, "stale"),
    # Issue 22: a CUDA OOM traceback in the tail (real text, pytorch/pytorch#16417) and exit 1: gpu-oom.
    "cuda-oom-in-the-log-tail": (
        container_exits(main_signal=None, code=1, others=0),
        Evidence(workload=TRAINER, log=log_of("pytorch-16417-torch2.2-cuda-oom.split.cri.log"),
                 oom_kills_in_run=0),
        "gpu-oom", None, 4100, "no"),
    # The same with its data-loader workers: the kernel SIGKILLs them as the container's pid namespace ends
    # with its init. Nobody killed them: still gpu-oom.
    "cuda-oom-and-the-pid-namespace-torn-down": (
        container_exits(main_signal=None, code=1, others=4),
        Evidence(workload=TRAINER, log=log_of("pytorch-16417-torch2.2-cuda-oom.txt"), oom_kills_in_run=0),
        "gpu-oom", None, 4100, "no"),
    # A pod that shares its pid namespace (the pause process is init): the others' SIGKILLs are someone's.
    "shared-pid-namespace-others-sigkilled": (
        [Exit(pid=4100, time=T, workload=CONTAINER, code=1, comm="python", main=True, ns_pid=12),
         Exit(pid=4101, time=T + 0.01, workload=CONTAINER, signal=SIGKILL, comm="worker", ns_pid=13)],
        Evidence(workload=TRAINER, log=log_of("pytorch-16417-torch2.2-cuda-oom.txt"), oom_kills_in_run=0),
        "userspace", "unknown", 4101, "no"),
    # An uncaught C++ OutOfMemoryError aborts the process (SIGABRT): the log decides too.
    "hip-oom-abort": (
        container_exits(main_signal=SIGABRT, others=0),
        Evidence(workload=TRAINER, log=log_of("pytorch-175431-hip-gpu7.cri.log"), oom_kills_in_run=0),
        "gpu-oom", None, 4100, "no"),
    # SIGKILL decides, whatever the log says.
    "sigkill-with-a-cuda-oom-in-the-log": (
        container_exits(), Evidence(workload=TRAINER, log=log_of("pytorch-16417-torch2.2-cuda-oom.txt"),
                                    oom_kills_in_run=0),
        "userspace", "unknown", 4100, "no"),
    # The host's memory refused by the process itself: no kill, not the GPU.
    "cpu-allocator-refused": (
        container_exits(main_signal=None, code=1, others=0),
        Evidence(workload=TRAINER, log=log_of("vrt-49-defaultcpuallocator.txt"), oom_kills_in_run=0),
        "alloc-failure", None, 4100, "no"),
    "xla-no-device-named": (
        container_exits(main_signal=None, code=1, others=0),
        Evidence(workload=TRAINER, log=log_of("jax-4994-arm-cpu-resource-exhausted.txt")),
        "alloc-failure", None, 4100, "no"),
    # Issue 22: systemd-oomd marks the cgroup it kills.
    "systemd-oomd-mark": (
        [Exit(pid=900 + n, time=T + 0.001 * n, workload=UNIT.cgroup, signal=SIGKILL, comm="cc1plus",
              main=n == 0) for n in range(4)],
        Evidence(workload=UNIT, oomd=OomdMark(UNIT.cgroup, None, 1, kills=4), oom_kills_in_window=0),
        "userspace", "systemd-oomd", 900, None),
    "kubelet-eviction": (
        container_exits(),
        Evidence(workload=TRAINER, pod_status=PodStatus(
            reason="Evicted", message="The node was low on resource: memory. Threshold quantity: 100Mi, "
            "available: 88Mi. Container trainer was using 14Gi, request is 8Gi, has larger consumption of "
            "memory. "),
            runtime_kills=(RuntimeKill(CID, SIGKILL, True, T - 0.1),), oom_kills_in_run=0),
        "userspace", "kubelet-eviction", 4100, "no"),
    "runtime-stop-after-the-grace-period": (
        container_exits(),
        Evidence(workload=TRAINER, oom_kills_in_run=0,
                 runtime_kills=(RuntimeKill(CID, SIGTERM, False, T - 30.0),
                                RuntimeKill(CID, SIGKILL, True, T - 0.05))),
        "userspace", "runtime-stop", 4100, "no"),
    "pod-being-deleted": (
        container_exits(),
        Evidence(workload=TRAINER, pod_status=PodStatus(deleting=True), oom_kills_in_run=0),
        "userspace", "runtime-stop", 4100, "no"),
    # Ray's memory monitor names the worker by its pid in the Ray container (ns_pid).
    "ray-memory-monitor": (
        [Exit(pid=52000, time=T, workload=CONTAINER, signal=SIGKILL, comm="ray::hungry_hip", ns_pid=3310152)],
        Evidence(workload=TRAINER, ray_killed_pids=ray_killed_pids(
            (GPULOGS / "ray-docs-raylet-memory-monitor.txt").read_text())),
        "userspace", "ray-memory-monitor", 52000, None),
    # In a container, a worker whose exec was not heard (no ns_pid): its host pid is no pid of the container's
    # namespace, even where raylet.out names the same number.
    "ray-kill-of-a-number-not-in-the-container": (
        [Exit(pid=3310152, time=T, workload=CONTAINER, signal=SIGKILL, comm="ray::hungry_hip")],
        Evidence(workload=TRAINER, ray_killed_pids=ray_killed_pids(
            (GPULOGS / "ray-docs-raylet-memory-monitor.txt").read_text())),
        "userspace", "unknown", 3310152, None),
    # Ray on the host (a systemd unit): one pid namespace, the host pid is the one raylet.out names.
    "ray-memory-monitor-on-the-host": (
        [Exit(pid=3310153, time=T, workload=UNIT.cgroup, signal=SIGKILL, comm="ray::hungry_hip")],
        Evidence(workload=UNIT, ray_killed_pids=ray_killed_pids(
            (GPULOGS / "ray-docs-raylet-memory-monitor.txt").read_text())),
        "userspace", "ray-memory-monitor", 3310153, None),
    # The Ray driver that exits 1 because its task was killed so.
    "ray-driver-exits": (
        container_exits(main_signal=None, code=1, others=0),
        Evidence(workload=TRAINER, log=log_of("ray-docs-driver-outofmemoryerror.txt"), oom_kills_in_run=0),
        "userspace", "ray-memory-monitor", 4100, "no"),
    # The kernel log lost the records: memory.events counted the kill (an incident with evidence
    # memory.events).
    "kernel-kill-counted-from-memory-events": (
        container_exits(),
        Evidence(workload=TRAINER, kernel_kills=(kill(set(), T + 1.0, counted=True),), oom_kills_in_run=3),
        "kernel-oom", None, 4100, "confirmed"),
    # …or not yet: the counter moved in the window, no incident yet.
    "kernel-kill-counter-moved": (
        container_exits(), Evidence(workload=TRAINER, oom_kills_in_window=3, oom_kills_in_run=3),
        "kernel-oom", None, 4100, "confirmed"),
    # A kernel kill of someone else's pid does not explain this one.
    "kernel-kill-of-other-pids": (
        container_exits(),
        Evidence(workload=TRAINER, kernel_kills=(kill({777}, T - 0.1, cgroups=("/other",)),),
                 oom_kills_in_window=0, oom_kills_in_run=0),
        "userspace", "unknown", 4100, "no"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_verdicts(name: str) -> None:
    exits, evidence, cause, sender, pid, verdict = CASES[name]
    death = classify(run(*exits), evidence, detected_at=T + 10)
    assert death is not None
    assert (death.cause, death.sender, death.pid) == (cause, sender, pid)
    assert death.last_exit is None if verdict is None else death.last_exit.verdict == verdict
    assert death.cause in CAUSES and (death.sender is None or death.sender in SENDERS)
    assert death.sender is None or death.cause == "userspace"
    assert death.evidence and death.explanation and death.processes == len(exits)
    data = json.loads(json.dumps(death_json(death)))
    assert data["record"] == "death" and data["cause"] == cause and data["sender"] == sender
    assert data["time"].endswith("Z") and data["pid"] == pid


def test_what_the_explanations_say() -> None:
    def say(name: str) -> str:
        exits, evidence, *_ = CASES[name]
        return classify(run(*exits), evidence, T + 10).explanation

    assert say("sigkill-by-another-process") == (
        "ml/train-0 trainer: python (pid 4100) was killed with SIGKILL by another process (the node does not "
        "say which), not by the kernel's OOM killer: no OOM kill of it is in the kernel log or "
        "memory.events.")
    assert say("kernel-group-kill") == \
        "ml/train-0 trainer: python (pid 4100) was killed by the kernel's OOM killer."
    assert say("cuda-oom-in-the-log-tail") == (
        "ml/train-0 trainer: python (pid 4100) exited with code 1 after GPU 0 ran out of memory (22 MiB "
        "asked, 11.1 MiB free of 23.6 GiB); no process was killed for host memory.")
    assert "(the node was low on memory)" in say("kubelet-eviction")
    assert "this exit was not an OOM kill" in say("sigterm-after-an-earlier-child-oom")
    assert "died by signal 15" in say("sigterm-after-an-earlier-child-oom")
    assert "allocation of host memory failed in the process (108.8 GiB asked)" in say("cpu-allocator-refused")


def test_the_kernel_kills_incident_and_evidence() -> None:
    exits, evidence, *_ = CASES["kernel-group-kill"]
    death = classify(run(*exits), evidence, T + 10)
    assert death.incident == ("boot", 517, 4100)
    assert death.evidence[0] == ("the kernel's OOM killer killed python (pid 4100) (group kill) and 2 other "
                                 "processes of the workload")
    assert death_json(death)["incident"] == ["boot", 517, 4100]


def test_the_log_is_kept_in_a_gpu_verdict() -> None:
    exits, evidence, *_ = CASES["cuda-oom-in-the-log-tail"]
    data = death_json(classify(run(*exits), evidence, T + 10))
    assert data["memory"] == "gpu" and data["log"]["device"] == 0 and data["log"]["tried_bytes"] == 22 << 20
    assert data["log"]["time"] == "2024-03-13T09:30:00.000000000Z"


@pytest.mark.parametrize("exits, evidence", [
    # A main process that ended well, in a run without an OOM kill.
    (container_exits(main_signal=None, code=0, others=0), Evidence(workload=TRAINER, oom_kills_in_run=0)),
    # A failure the log does not call an allocation failure.
    (container_exits(main_signal=None, code=1, others=0),
     Evidence(workload=TRAINER, log=parse_log_tail(b"ValueError: bad config\n"), oom_kills_in_run=0)),
    # A SIGTERM stop of a container that never had an OOM kill.
    (container_exits(main_signal=SIGTERM, others=0), Evidence(workload=TRAINER, oom_kills_in_run=0)),
    # Not known whether the run had an OOM kill: no stale verdict is made up.
    (container_exits(main_signal=SIGTERM, others=0), Evidence(workload=TRAINER)),
    # A systemd unit's main process exiting after an OOM earlier in its life: only containers have that
    # status.
    ([Exit(pid=5, time=T, workload=UNIT.cgroup, signal=SIGTERM, main=True)],
     Evidence(workload=UNIT, oom_kills_in_run=2)),
])
def test_deaths_that_do_not_look_like_memory_deaths(exits: list[Exit], evidence: Evidence) -> None:
    assert classify(run(*exits), evidence, T + 10) is None


def test_needs_log() -> None:
    assert needs_log(run(*container_exits(main_signal=None, code=1, others=0)))
    assert needs_log(run(*container_exits(main_signal=SIGABRT, others=0)))
    assert not needs_log(run(*container_exits(main_signal=None, code=0, others=0)))
    assert not needs_log(run(*container_exits(main_signal=SIGTERM, others=0)))
    assert not needs_log(run(*container_exits()))
    assert not needs_log(run(Exit(pid=1, time=T, workload="/w", signal=SIGKILL)))  # no main process


# --- grouping ----------------------------------------------------------------------------------------------


def test_one_death_per_burst_not_per_process() -> None:
    tracker = DeathTracker(settle=2.0)
    for e in container_exits(others=50):
        tracker.add(e, e.time)
    # Not part of a memory death: a child that exited, a child that took a SIGTERM.
    assert not tracker.add(Exit(pid=9, time=T, workload=CONTAINER, code=0), T)
    assert not tracker.add(Exit(pid=8, time=T, workload=CONTAINER, signal=SIGTERM), T)
    assert len(tracker) == 1 and tracker.next_due() == pytest.approx(T + 0.05 + 2.0)
    assert tracker.due(T + 1.0) == []
    [group] = tracker.due(T + 2.06)
    assert group.count == 51 and group.main.pid == 4100 and group.first == T
    assert tracker.next_due() is None
    # The container restarts and dies again a minute later: a second death.
    for e in container_exits(at=T + 60):
        tracker.add(e, e.time)
    [again] = tracker.due(T + 63)
    assert again.first == T + 60 and again.count == 3


def test_deaths_of_two_workloads_at_once_are_two() -> None:
    tracker = DeathTracker()
    for e in container_exits() + container_exits(workload="/kubepods/other"):
        tracker.add(e, e.time)
    groups = tracker.due(T + 5)
    assert sorted(g.key for g in groups) == sorted([CONTAINER, "/kubepods/other"])


def test_a_workload_that_keeps_dying_is_told_after_max_wait() -> None:
    tracker = DeathTracker(settle=2.0, max_wait=15.0)
    told = []
    for n in range(40):  # a SIGKILL every second, forever: never quiet for `settle`
        tracker.add(Exit(pid=100 + n, time=T + n, workload=CONTAINER, signal=SIGKILL), T + n)
        if n == 14:
            assert tracker.next_due() == T + 15.0
        told += [(n, g.count) for g in tracker.due(T + n)]
    # (the exit at T+15 comes before that due: 16 in the first; the second opens at T+16)
    assert told == [(15, 16), (31, 16)] and len(tracker) == 1  # the third still being collected


def test_bounded() -> None:
    tracker = DeathTracker(max_open=3, max_ready=2, max_exits=5)
    for n in range(6):  # six workloads die at once: three open, the oldest finished early, then dropped
        tracker.add(Exit(pid=n, time=T, workload=f"/w{n}", signal=SIGKILL), T)
    assert len(tracker) == 5 and tracker.dropped == 1
    assert tracker.next_due() == T  # the early ones are due at once
    assert [g.key for g in tracker.due(T)] == ["/w0", "/w1"]
    # One workload's thousand exits: five kept, all counted, its main process kept though it came last.
    tracker = DeathTracker(max_exits=5)
    for n in range(1000):
        tracker.add(Exit(pid=10_000 + n, time=T, workload="/big", signal=SIGKILL), T)
    tracker.add(Exit(pid=1, time=T + 0.1, workload="/big", signal=SIGKILL, main=True), T + 0.1)
    [group] = tracker.due(T + 10)
    assert group.count == 1001 and len(group.exits) == 5 and group.exits[-1].pid == 1 and group.main.pid == 1
    death = classify(group, Evidence(), T + 10)
    assert death.processes == 1001 and len(death.pids) == 5 and death.pid == 1


def test_everything_at_stop_and_deaths_of() -> None:
    tracker = DeathTracker()
    for e in container_exits():
        tracker.add(e, e.time)
    groups = tracker.due(T, everything=True)
    assert len(groups) == 1
    deaths = deaths_of(groups, lambda g: Evidence(workload=TRAINER, oom_kills_in_run=0), T)
    assert [d.cause for d in deaths] == ["userspace"]


# --- what the sources read ----------------------------------------------------------------------------


@pytest.mark.parametrize("argv, expected", [
    # containerd's shim (go-runc Runc.Kill), stop signal then SIGKILL --all after the grace period
    (["runc", "--root", "/run/containerd/runc/k8s.io", "--log",
      f"/run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID}/log.json", "--log-format", "json",
      "--systemd-cgroup", "kill", CID, "15"], (CID, 15, False)),
    (["/usr/bin/runc", "--root", "/run/containerd/runc/k8s.io", "kill", "--all", CID, "9"], (CID, 9, True)),
    (["crun", "--root=/run/crun", "kill", "-a", CID, "KILL"], (CID, 9, True)),
    (["runc", "kill", CID, "SIGKILL"], (CID, 9, False)),
    (["runc", "kill", CID], (CID, SIGTERM, False)),  # runc's default signal
    (["runc", "--root", "/run/runc", "state", CID], None),
    (["runc", "--root", "kill", "state", CID], None),  # `kill` as an option's value is not the command
    (["runc", "kill", "../../etc", "9"], None),
    (["runc", "kill", CID, "NOSUCHSIG"], None),
    (["runc", "kill", CID, "999"], None),
    (["kill", "-9", "4100"], None),
    ([], None),
])
def test_runtime_kill_command_lines(argv: list[str], expected) -> None:
    found = runtime_kill_from_argv(argv, T)
    assert (None if found is None else (found.container_id, found.signal, found.all)) == expected


@pytest.mark.parametrize("value, expected", [
    (b"1", 1), (b"12\x00", 12), (b" 3\n", 3), (None, None), (b"", None), (b"-1", None), (b"x", None),
    (b"9" * 30, None),
])
def test_oomd_xattrs(value, expected) -> None:
    assert parse_oomd_xattr(value) == expected


def test_ray_memory_monitor_kills() -> None:
    text = (GPULOGS / "ray-docs-raylet-memory-monitor.txt").read_text()
    assert ray_killed_pids(text) == {3310152, 3310153}  # the selected, not the considered (3310151, …)
    assert ray_killed_pids(text.replace("\n", ";")) == {3310152, 3310153}  # raylet.out's own separator
    assert ray_killed_pids((GPULOGS / "ray-docs-driver-outofmemoryerror.txt").read_text()) == {11362}
    assert ray_killed_pids((GPULOGS / "ray-docs-raylet-summary.txt").read_text()) == frozenset()
    assert ray_killed_pids("worker pid=5 finished\n") == frozenset()


def test_kernel_kill_of_an_incident() -> None:
    def proc(pid: int, cgroup: str) -> KilledProcess:
        return KilledProcess(pid=pid, comm="python", cgroup=cgroup)

    workload = Workload(type="k8s-container", cgroup=CONTAINER)
    incident = Incident(time=T, boot_id="b", kernel_seq=517, kind="group", constraint="memcg",
                        scope="container", oom_cgroup=CONTAINER, group_cgroup=CONTAINER, trigger=None,
                        memory=None, victim=proc(4100, CONTAINER),
                        killed=(proc(4100, CONTAINER), proc(4101, CONTAINER)),
                        workload=workload, explanation="", detected_at=T,
                        died_with=({"pid": 4102, "cgroup": CONTAINER, "signal": SIGKILL},))
    k = kernel_kill_of(incident)
    assert k.pids == {4100, 4101, 4102} and k.cgroups == (CONTAINER,) and k.key == ("b", 517, 4100)
    assert k.victim == 4100 and not k.counted
    counted = Incident(time=T, boot_id="b", kernel_seq=None, kind="single", constraint="memcg",
                       scope="container", oom_cgroup=None, group_cgroup=None, trigger=None, memory=None,
                       victim=None, killed=(),
                       workload=workload, explanation="", detected_at=T, evidence="memory.events",
                       counted_in=(CONTAINER, 77, "oom_kill", 3))
    k = kernel_kill_of(counted)
    assert k.pids == frozenset() and k.cgroups == (CONTAINER,) and k.counted


def test_which_pods_run_ray() -> None:
    """KubeRay's kinds (a pod's job or controlling owner) or its node-type label on the pod."""
    assert runs_ray(["RayCluster"], {})
    assert runs_ray([None, "RayJob"], {})
    assert runs_ray(["RayService"], {"app": "x"})
    assert runs_ray([None, None], {"ray.io/node-type": "head"})
    assert not runs_ray(["JobSet", "Job"], {"app": "ray"})
    assert not runs_ray([], {})
