"""Deaths' verdicts on a real kernel (issue 22 item 1): the guest's o/p/q scenarios (tests/e2e/guest/deaths_scenario.py)
with the agent and its proc connector running. The kernel's own record (its log, read independently by kmsgtruth,
and memory.events) says which deaths were its kills; the agent's death lines in the events file must agree, and
only the kernel's kills may be incidents or count in oomwatch_oom_kills_total.

One boot for these alone (f_sigkill_not_oom's runc kill too): `flock /tmp/oomwatch-vm.lock .venv/bin/python -m
tests.e2e.vm --only f,o,p,q DIR`, then
`OOMWATCH_E2E_RUN=DIR .venv/bin/python -m pytest -m e2e tests/e2e/test_deaths.py`; the main run has them too."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import E2ERun, ScenarioRun, select

pytestmark = pytest.mark.e2e


def deaths_of(sc: ScenarioRun) -> list[dict]:
    path = sc.dir / "deaths.json"
    assert path.exists(), f"{sc.name} recorded no deaths.json (see driver.log)"
    return json.loads(path.read_text())


def no_errors(sc: ScenarioRun) -> None:
    assert not sc.gt["errors"], sc.gt["errors"]
    assert sc.gt["agent"].get("running_at_end"), "the agent was not running at the end of the scenario"


def container_labels(sc: ScenarioRun) -> dict:
    wl = next(w for w in sc.gt["workloads"].values() if w["type"] == "k8s-container")
    return {"namespace": wl["namespace"], "pod": wl["pod"], "container": wl["container"]}


def oom_kills(sc: ScenarioRun) -> float:
    series = select(sc.metrics, "oomwatch_oom_kills_total", **container_labels(sc))
    assert len(series) == 2, f"oomwatch_oom_kills_total of the container: {series}"
    return sum(s.value for s in series)


def deaths_counted(sc: ScenarioRun) -> dict:
    return {s.labels["cause"]: s.value for s in select(sc.metrics, "oomwatch_deaths_total", **container_labels(sc))}


def test_a_container_sigkilled_by_another_process_is_userspace(e2e: E2ERun) -> None:
    sc = e2e.scenario("o_death_userspace")
    no_errors(sc)
    assert sc.kernel == [], "the kernel logged an OOM kill where none was caused"
    assert sc.gt["main_ns_pid"] == 1
    assert all(not v["alive"] for v in sc.gt["pids_after"].values()), "the container outlived its SIGKILL"
    [death] = deaths_of(sc)
    assert (death["cause"], death["sender"], death["pid"], death["main"], death["signal"]) == (
        "userspace", "unknown", sc.gt["main_pid"], True, 9)
    assert death["processes"] == 3  # the init and its two sleeps (the pid namespace's teardown)
    assert death["workload"]["container"] == "worker" and death["last_exit"]["verdict"] == "no"
    a = sc.gt["agent"]
    assert a["incidents_after"] == a["incidents_before"], "an incident for a SIGKILL the kernel did not send"
    assert oom_kills(sc) == 0
    assert deaths_counted(sc) == {"kernel-oom": 0, "userspace": 1, "gpu-oom": 0, "alloc-failure": 0, "not-oom": 0}
    assert [d for d in e2e.deaths if d["cgroup"] == death["cgroup"]] == [death]  # the events file: once


def test_a_container_killed_by_the_kernel_is_kernel_oom(e2e: E2ERun) -> None:
    sc = e2e.scenario("p_death_kernel")
    no_errors(sc)
    [kill] = sc.kernel
    assert kill.victim_pid == sc.gt["main_pid"], "the kernel did not kill the main process"
    [death] = deaths_of(sc)
    assert (death["cause"], death["pid"], death["main"], death["signal"]) == ("kernel-oom", kill.victim_pid, True,
                                                                              9)
    incident = next(i for i in sc.incidents if (i.get("victim") or {}).get("pid") == kill.victim_pid)
    assert death["incident"] is not None and death["incident"][0] == incident["boot_id"]
    assert death["last_exit"] == {"oom_killed": True, "reported_oom_killed": True, "verdict": "confirmed"}
    # The kill is counted once, as an incident; the death is its verdict, not a second kill.
    assert oom_kills(sc) == 1
    assert deaths_counted(sc)["kernel-oom"] == 1 and sum(deaths_counted(sc).values()) == 1


def test_a_sigterm_exit_after_a_child_oom_kill_is_not_an_oom_kill(e2e: E2ERun) -> None:
    sc = e2e.scenario("q_death_stale")
    no_errors(sc)
    [kill] = sc.kernel
    assert kill.victim_pid != sc.gt["main_pid"], "the kernel killed the init, not its child"
    assert sc.gt["main_pid"] in sc.gt["procs_after_child_kill"], "the init did not outlive its child's kill"
    child, main = deaths_of(sc)
    assert (child["cause"], child["pid"], child["main"]) == ("kernel-oom", kill.victim_pid, False)
    assert (main["cause"], main["pid"], main["main"], main["signal"], main["exit_code"]) == (
        "not-oom", sc.gt["main_pid"], True, None, 143)
    assert main["last_exit"] == {"oom_killed": False, "reported_oom_killed": True, "verdict": "stale"}
    assert "this exit was not an OOM kill" in main["explanation"]
    assert oom_kills(sc) == 1  # the child's kill, once
    assert deaths_counted(sc) == {"kernel-oom": 1, "userspace": 0, "gpu-oom": 0, "alloc-failure": 0, "not-oom": 1}


def test_a_container_stopped_by_runc_kill_is_the_runtimes_stop(e2e: E2ERun) -> None:
    """f_sigkill_not_oom stops its container with `runc kill <id> KILL`, as containerd's shim does: the death's
    sender is the runtime's stop (the source read runc's command line at its exec)."""
    sc = e2e.scenario("f_sigkill_not_oom")
    assert sc.kernel == []
    cgroup = next(c for c, w in sc.gt["workloads"].items() if w["type"] == "k8s-container")
    [death] = [d for d in e2e.deaths if d["cgroup"] == cgroup]
    assert (death["cause"], death["sender"], death["signal"], death["main"]) == ("userspace", "runtime-stop", 9,
                                                                                 True)
    assert any("the runtime ran `kill " in e for e in death["evidence"])
