"""The real agent keeps the kernel's count: kills that no log record describes come from memory.events, once;
state that is damaged or shared never crashes it or loses the file; the events file stays idempotent."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

from oomwatch.agent import Agent
from oomwatch.statefile import StateFile, StateLocked
from oomwatch.store import STATE_VERSION
from tests.conftest import SeqpacketKmsg, base_url, http_get, incidents_of, running_agent, wait_for
from tests.test_agent import GOLDEN, agent_config, events, upto

K8S = Path(__file__).resolve().parent.parent / "fixtures" / "golden" / "k8s-runc"
CONTAINER = "kubepods/burstable/pod0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f/4f2a9c1e7b3d5a6c8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d"


def k8s_config(tmp_path: Path, tree: Path, **kw):
    return agent_config(tmp_path, cgroup_root=str(tree), proc=str(K8S / "proc"), run_root=str(K8S / "run"),
                        kubelet_config=str(K8S / "kubelet" / "config.yaml"), **kw)


def bump(tree: Path, kill: int, group: int) -> None:
    text = f"low 0\nhigh 0\nmax 9\noom {group}\noom_kill {kill}\noom_group_kill {group}\n"
    (tree / CONTAINER / "memory.events.local").write_text(text)
    (tree / CONTAINER / "memory.events").write_text(text)


def test_group_kills_whose_records_were_lost_are_counted_from_memory_events(tmp_path: Path) -> None:
    tree = tmp_path / "cgroup"
    shutil.copytree(K8S / "cgroup", tree)
    bump(tree, 3, 1)  # one kill before the agent: not ours to count
    kmsg = SeqpacketKmsg()
    with running_agent(k8s_config(tmp_path, tree), kmsg_factory=kmsg.factory) as agent:
        bump(tree, 9, 3)  # two group kills whose kernel log records were overwritten before being read
        assert wait_for(lambda: len(incidents_of(agent)) == 2, timeout=15)
        _, metrics = http_get(base_url(agent) + "/metrics")
        incidents = incidents_of(agent)
    assert {(i["kind"], i["evidence"], i["victim"], tuple(i["killed"])) for i in incidents} == \
        {("group", "memory.events", None, ())}
    assert all(i["workload"]["pod"] == "train-0" and i["workload"]["container"] == "trainer" for i in incidents)
    assert all("no longer describes" in i["explanation"] for i in incidents)
    assert (b'oomwatch_oom_kills_total{cgroup="",container="trainer",kind="group",namespace="ml",pod="train-0"} 2.0'
            in metrics)
    assert [e["evidence"] for e in events(tmp_path)] == ["memory.events"] * 2
    # A restart neither repeats nor loses them.
    with running_agent(k8s_config(tmp_path, tree), kmsg_factory=SeqpacketKmsg().factory) as agent:
        bump(tree, 12, 4)  # and one more while it runs
        assert wait_for(lambda: len(incidents_of(agent)) == 3, timeout=15)
    assert len(events(tmp_path)) == 3


def test_kills_while_the_agent_was_down_are_counted_at_start(tmp_path: Path) -> None:
    tree = tmp_path / "cgroup"
    shutil.copytree(K8S / "cgroup", tree)
    with running_agent(k8s_config(tmp_path, tree), kmsg_factory=SeqpacketKmsg().factory) as agent:
        assert wait_for(lambda: agent.store.cursor_seq is None and agent.reconciler.accounts)
    bump(tree, 6, 2)  # the agent is down; the ring wraps over the record
    with running_agent(k8s_config(tmp_path, tree), kmsg_factory=SeqpacketKmsg().factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 1, timeout=15)
        assert incidents_of(agent)[0]["evidence"] == "memory.events"


def test_logged_kills_are_not_counted_again_from_memory_events(tmp_path: Path) -> None:
    """The golden memcg capture's four incidents, with the same boot's memory.events: nothing is added."""
    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    kmsg = SeqpacketKmsg()
    with running_agent(agent_config(tmp_path, cgroup_root=str(tree), boot_time=None), kmsg_factory=kmsg.factory) \
            as agent:
        # Counters move as the kernel moved them for the four incidents, then the log arrives.
        for path, text in {"a": "oom 1\noom_kill 1\noom_group_kill 0\n", "b": "oom 1\noom_kill 4\noom_group_kill 1\n"}.items():
            (tree / path / "memory.events.local").write_text(text)
        kmsg.send(upto(521))
        assert wait_for(lambda: len(incidents_of(agent)) == 2)
        assert wait_for(lambda: not agent.reconciler.pending(), timeout=5)
    assert [e["evidence"] for e in events(tmp_path)] == ["kmsg", "kmsg"]


def test_damaged_state_files_never_crash_the_agent_and_are_kept(tmp_path: Path) -> None:
    damaged = [
        {"version": STATE_VERSION, "workloads": [{"labels": ["", "", "", "/a"], "kills": [1]}]},
        {"version": STATE_VERSION, "boot_id": "x", "cursor_seq": 1, "cursor_source": "kmsg",
         "workloads": [{"labels": ["", "", "", "/a"], "kills": {"single": -5}, "killed": {}}],
         "node_kills": [], "incidents": [], "keys": [], "kmsg": {}, "latency": {"buckets": [0] * 13, "count": 0,
                                                                            "sum": 0}},
        {"version": STATE_VERSION, "boot_id": "x", "cursor_seq": 1, "cursor_source": "kmsg",
         "workloads": [{"labels": ["", "", "", "/a"], "kills": {}, "killed": {}, "last_kill": "yesterday"}],
         "node_kills": [], "incidents": [], "keys": [], "kmsg": {}, "latency": {"buckets": [0] * 13, "count": 0,
                                                                            "sum": 0}},
        [1, 2, 3],
        "null",
    ]
    for n, state in enumerate(damaged):
        state_dir = tmp_path / f"s{n}"
        state_dir.mkdir()
        text = state if isinstance(state, str) else json.dumps(state)
        (state_dir / "state.json").write_text(text)
        with running_agent(agent_config(tmp_path, state_dir=str(state_dir)),
                           kmsg_factory=SeqpacketKmsg().factory) as agent:
            assert http_get(base_url(agent) + "/healthz")[0] == 200
            assert http_get(base_url(agent) + "/metrics")[0] == 200
        kept = list(state_dir.glob("state.json.corrupt-*"))
        assert len(kept) == 1 and kept[0].read_text() == text, n
        assert json.loads((state_dir / "state.json").read_text())["version"] == STATE_VERSION


def test_a_second_agent_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    first = StateFile(str(tmp_path / "state"))
    first.lock()
    try:
        agent = Agent(agent_config(tmp_path), kmsg_factory=SeqpacketKmsg().factory)
        assert agent.run_until_signalled() == 2
    finally:
        first.unlock()
    second = StateFile(str(tmp_path / "state"))
    second.lock()  # free again once the first is gone
    second.unlock()
    try:
        StateFile(str(tmp_path / "state")).lock()
        third = StateFile(str(tmp_path / "state"))
        third.lock()
        raise AssertionError("a second lock was granted")
    except StateLocked as exc:
        assert "another oomwatch agent" in str(exc)


def test_events_file_is_idempotent_after_a_crash(tmp_path: Path) -> None:
    """A SIGKILL between writing incidents and saving the cursor: the next start reads the same records again
    and must not write them twice."""
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(521))
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 2)
    (tmp_path / "state" / "state.json").unlink()  # as if the agent died before it could save
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(521))
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 2)
    assert [e["victim"]["pid"] for e in events(tmp_path)] == [118, 125]


def test_a_record_that_breaks_processing_is_skipped_and_counted(tmp_path: Path, monkeypatch) -> None:
    from oomwatch import correlator as correlator_module

    real = correlator_module.parse_oom_line
    calls = threading.Lock()

    def flaky(text):
        if "Killed process 118" in text:
            raise RuntimeError("boom")
        return real(text)

    monkeypatch.setattr(correlator_module, "parse_oom_line", flaky)
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(521))
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 1)
        assert http_get(base_url(agent) + "/healthz")[0] == 200
        assert agent.store.snapshot().kmsg_parse_errors >= 1
    assert calls is not None


def test_syslog_mode_does_not_count_a_kill_twice_when_its_lines_come_late(tmp_path: Path, monkeypatch) -> None:
    """syslog(2) is read only when woken: the memory.events move wakes it before the kernel has printed the
    kill's lines. The agent must read again before it believes the counters over the log (found by the image
    test: every kill in the DaemonSet's syslog mode was reported twice)."""
    import errno
    import time

    import oomwatch.sources.klog as klog_module
    from oomwatch.sources.klog import SyslogKmsg
    from oomwatch.sources.kmsg import KmsgUnavailable, LiveKmsg
    from tests.test_klog import FakeKlogctl, syslog_lines

    def refuse(self, after_seq=None):
        raise KmsgUnavailable("/dev/kmsg: permission denied") from PermissionError(errno.EPERM, "denied")

    monkeypatch.setattr(LiveKmsg, "open", refuse)
    kernel = FakeKlogctl(syslog_lines(upto_seq=521))
    monkeypatch.setattr(klog_module, "SyslogKmsg", lambda: SyslogKmsg(syscall=kernel, fallback_interval=3600))
    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    for path in ("p/c1", "p"):  # before the third kill
        (tree / path / "memory.events.local").write_text("max 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    # The third kill (kernel time 18.755 s) happens 2 s from now.
    config = agent_config(tmp_path, kmsg="/dev/kmsg", cgroup_root=str(tree), boot_time=time.time() - 16.75)
    with running_agent(config) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 2)
        assert agent.kmsg_source == "syslog"
        time.sleep(2.0)
        # The counters move (the cue to read: the ring does not hold the kill's lines yet) ...
        (tree / "p/c1/memory.events.local").write_text("max 0\noom 0\noom_kill 3\noom_group_kill 1\n")
        (tree / "p/c1/memory.events").write_text("max 0\noom 0\noom_kill 3\noom_group_kill 1\n")
        time.sleep(0.3)
        kernel.lines = syslog_lines(upto_seq=562)  # ... and the lines come after, with no cue of their own
        assert wait_for(lambda: len(incidents_of(agent)) == 3, timeout=10)
        time.sleep(2.5)  # longer than the settle time: a duplicate would show now
        incidents = incidents_of(agent)
    assert [(i["victim"]["pid"], i["evidence"]) for i in incidents][-1] == (132, "kmsg")
    assert len(incidents) == 3


def test_a_cgroup_that_breaks_its_handler_does_not_stop_the_watch(tmp_path: Path, monkeypatch) -> None:
    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    with running_agent(agent_config(tmp_path, cgroup_root=str(tree)), kmsg_factory=SeqpacketKmsg().factory) as agent:
        real = agent.node.events_changed

        def breaks_on_a(path, local):
            if path == "/a":
                raise RuntimeError("a bug")
            return real(path, local)

        monkeypatch.setattr(agent.node, "events_changed", breaks_on_a)
        for name in ("memory.events.local", "memory.events"):  # inotify watches memory.events
            (tree / "a" / name).write_text("max 1\noom 1\noom_kill 1\noom_group_kill 0\n")
        assert wait_for(lambda: agent.watcher.callback_errors >= 1)
        for name in ("memory.events.local", "memory.events"):
            (tree / "b" / name).write_text("max 1\noom 1\noom_kill 9\noom_group_kill 1\n")
        assert wait_for(lambda: "/b" in agent._oom_kill_at)
        assert http_get(base_url(agent) + "/healthz")[0] == 200


def test_a_thread_that_dies_for_good_makes_the_agent_exit_nonzero(tmp_path: Path, monkeypatch) -> None:
    import oomwatch.agent as agent_module
    from oomwatch.sources.cgroupfs import CgroupWatcher

    def dies(self):
        self.alive = False
        self.error = "cgroup watcher stopped: the inotify descriptor went bad"

    monkeypatch.setattr(CgroupWatcher, "run", dies)
    monkeypatch.setattr(agent_module, "FATAL_GRACE_SECONDS", 0.5)
    agent = Agent(agent_config(tmp_path), kmsg_factory=SeqpacketKmsg().factory)
    assert agent.run_until_signalled() == 1
    assert agent.health()[1]["cgroups"].startswith("cgroup watcher stopped")


def test_a_full_disk_names_the_file_counts_it_and_loses_no_incident(tmp_path: Path, monkeypatch) -> None:
    """/dev/full answers every write with ENOSPC: as the events file, and under the state file's temp file."""
    import os as os_module

    import oomwatch.statefile as store_module

    def full_mkstemp(prefix="", dir=None):
        return os_module.open("/dev/full", os_module.O_WRONLY), os_module.path.join(dir, prefix + "full")

    monkeypatch.setattr(store_module.tempfile, "mkstemp", full_mkstemp)
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(521))
    config = agent_config(tmp_path, events_file="/dev/full")
    with running_agent(config, kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 2)
        assert wait_for(lambda: agent.store.snapshot().state_errors >= 1)
        status, body = http_get(base_url(agent) + "/healthz")
        health = json.loads(body)
        assert status == 200 and "state.json" in health["state"] and "No space left" in health["state"]
        assert agent.events_file.errors == 2 and "/dev/full" in agent.events_file.last_error


def test_events_file_lines_follow_the_saved_state(tmp_path: Path) -> None:
    """A line is written only once the state that counts its incident is saved, and a start writes what the
    saved state holds and the file lacks (a crash between the two writes): never a line for a kill the next
    start will publish again, never one missing."""
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(521))
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 2)
        assert agent.events_file.hold
        assert wait_for(lambda: len(events(tmp_path)) == 2)  # flushed with the save when the log went quiet
    (tmp_path / "events.jsonl").write_text("")  # the crash came after the state was saved, before the lines
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(521))
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(events(tmp_path)) == 2)
        time.sleep(0.5)
    assert [e["victim"]["pid"] for e in events(tmp_path)] == [118, 125]


def test_held_lines_are_written_on_flush_only() -> None:
    import tempfile

    from oomwatch.sinks.events import EventsFile
    from tests.test_store_cap import kill_in

    path = Path(tempfile.mkdtemp()) / "events.jsonl"
    sink = EventsFile(str(path), hold=True)
    sink.open()
    sink.publish(kill_in("/a", 1))
    assert path.read_text() == ""
    sink.flush()
    sink.publish(kill_in("/a", 1))  # the same incident again (a re-read record): not written twice
    sink.flush()
    sink.close()
    assert len(path.read_text().splitlines()) == 1


def test_counter_readings_do_not_pile_up_without_a_kernel_log_processor(tmp_path: Path) -> None:
    """A saved log replayed, or no kernel log at all: nothing takes the memory.events readings, so none are
    queued (they would grow with every cgroup and every kill for as long as the agent runs)."""
    tree = tmp_path / "cgroup"
    shutil.copytree(K8S / "cgroup", tree)
    for kmsg in (str(K8S / "kmsg"), str(tmp_path / "no-such-kmsg")):
        with running_agent(k8s_config(tmp_path / Path(kmsg).name, tree, kmsg=kmsg)) as agent:
            assert wait_for(lambda: agent.watcher is not None and agent.watcher.known())
            for n in range(1, 6):
                bump(tree, n, n)
            # The watcher saw the kills (the scrape reads memory.events again only when inotify says it moved).
            oom_kill = (b'oomwatch_memory_events_total{cgroup="",container="trainer",event="oom_kill",'
                        b'namespace="ml",pod="train-0"} 5.0')
            assert wait_for(lambda: oom_kill in http_get(base_url(agent) + "/metrics")[1], timeout=10), kmsg
            assert len(agent._observations) == 0, kmsg
