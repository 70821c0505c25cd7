"""What the agent writes around the pipeline, without its threads: the state file and the events file as sinks
(oomwatch.sinks) applied to the effects of Pipeline.step() in the agent's order (tests/replay.Replay). State
that is damaged or shared never crashes a start or loses the file; the events file follows the saved state and
stays idempotent across a crash; a full disk is named, counted and loses no incident. And the cgroup source
goes on when one cgroup's event breaks its handler. (The counting itself: tests/test_pipeline_counts.py.)"""

from __future__ import annotations

import json
import logging
import queue
import shutil
import threading
from pathlib import Path

from oomwatch.events import CgroupChanged, KernelLog, Stop
from oomwatch.sinks import EventsFileSink, StateFileSink
from oomwatch.sinks.events import EventsFile
from oomwatch.sources.cgroupfs import CgroupFS
from oomwatch.sources.cgroupsource import CgroupSource
from oomwatch.statefile import StateFile, StateLocked
from oomwatch.store import STATE_VERSION, Store
from oomwatch.workloads import WorkloadResolver
from tests.conftest import wait_for
from tests.replay import BOOT_ID, Replay, cursor_for_restart, live_reads, live_settings
from tests.test_agent import GOLDEN
from tests.test_pipeline_replay import BOOT, upto


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def a_life(tmp_path: Path, raw, *, events_file: str = "", state_dir: str = "", after_seq=None) -> Replay:
    """One start of the agent's writing side: the state loaded (as StateFileSink.load does at start), the
    sinks started with what it holds, the records read and everything due done; not stopped (a SIGKILL ends
    it)."""
    state_sink = StateFileSink(StateFile(state_dir or str(tmp_path / "state")))
    store = Store()
    extra = state_sink.load(store, BOOT_ID)
    file_sink = EventsFileSink(EventsFile(events_file or str(tmp_path / "events.jsonl"), hold=True))
    file_sink.start(store.snapshot().incidents)
    replay = Replay(live_settings(boot_time=BOOT), now=BOOT + 14.0, store=store,
                    accounts=extra.get("accounts"), sinks=[file_sink], state_sink=state_sink)
    for items in live_reads(raw, cursor_for_restart(store.to_state()) if after_seq is None else after_seq):
        replay.step(KernelLog(items, drained_at=replay.now + 0.01), replay.now + 0.01)
    replay.settle()
    return replay


def close(replay: Replay) -> None:
    for sink in [*replay.sinks, replay.state_sink]:
        sink.close()


def test_events_file_lines_follow_the_saved_state(tmp_path: Path) -> None:
    """A line is written only once the state that counts its incident is saved, and a start writes what the
    saved state holds and the file lacks (a crash between the two writes): never a line for a kill the next
    start will publish again, never one missing."""
    path = tmp_path / "events.jsonl"
    seen: list[tuple[str, int, int]] = []  # (when, lines in the file, incidents in the last saved state)
    saved = [0]
    state_sink = StateFileSink(StateFile(str(tmp_path / "state")))
    state_sink.load(Store(), BOOT_ID)
    file_sink = EventsFileSink(EventsFile(str(path), hold=True))
    file_sink.start(())

    class Watching(EventsFileSink):  # what the file holds at each incident handed over and after each save
        def publish(self, incident) -> None:
            file_sink.publish(incident)
            seen.append(("publish", len(events(path)), saved[0]))

        def flush(self, state) -> None:
            saved[0] = len(state["incidents"])
            file_sink.flush(state)
            seen.append(("flush", len(events(path)), saved[0]))

    replay = Replay(live_settings(boot_time=BOOT), now=BOOT + 14.0, sinks=[Watching(file_sink.file)],
                    state_sink=state_sink)
    for items in live_reads(upto(521)):
        replay.step(KernelLog(items, drained_at=replay.now + 0.01), replay.now + 0.01)
    replay.settle()
    assert [w for w, _, _ in seen].count("publish") == 2 and "flush" in [w for w, _, _ in seen]
    assert all(lines == in_state for _, lines, in_state in seen), seen  # a line once its state is saved
    assert [e["victim"]["pid"] for e in events(path)] == [118, 125]
    file_sink.close()
    state_sink.close()
    path.write_text("")  # the crash came after the state was saved, before the lines
    again = a_life(tmp_path, upto(521))
    close(again)
    assert again.published == []
    assert [e["victim"]["pid"] for e in events(path)] == [118, 125]


def test_events_file_is_idempotent_after_a_crash(tmp_path: Path) -> None:
    """A SIGKILL between writing incidents and saving the cursor: the next start reads the same records again
    and must not write them twice."""
    first = a_life(tmp_path, upto(521))
    close(first)
    (tmp_path / "state" / "state.json").unlink()  # as if the agent died before it could save
    second = a_life(tmp_path, upto(521))
    close(second)
    assert [i.victim.pid for i in second.published] == [118, 125]  # published again: the state did not know
    assert [e["victim"]["pid"] for e in events(tmp_path / "events.jsonl")] == [118, 125]


def test_a_full_disk_names_the_file_counts_it_and_loses_no_incident(tmp_path: Path, monkeypatch) -> None:
    """/dev/full answers every write with ENOSPC: as the events file, and under the state file's temp file."""
    import os as os_module

    import oomwatch.statefile as statefile_module

    def full_temp_file(directory):
        return os_module.open("/dev/full", os_module.O_WRONLY), os_module.path.join(directory, ".state-full")

    monkeypatch.setattr(statefile_module, "new_temp_file", full_temp_file)
    replay = a_life(tmp_path, upto(521), events_file="/dev/full")
    view = replay.pipeline.view()
    assert len(view.store.incidents) == 2
    assert view.store.state_errors >= 1
    assert "state.json" in view.state_error and "No space left" in view.state_error
    errors = [m for level, m in replay.logs if level == logging.ERROR and "cannot write state" in m]
    assert len(errors) == 1, "one line when saves start failing, not one per save"
    (file_sink,) = replay.sinks
    assert file_sink.file.errors == 2 and "/dev/full" in file_sink.file.last_error
    # The disk has room again: the next save works, is said once, and the view says nothing is wrong.
    monkeypatch.undo()
    replay.step(Stop(), replay.now + 1.0)
    assert (logging.INFO, "state written again") in replay.logs
    assert replay.pipeline.view().state_error is None
    close(replay)
    assert len(json.loads((tmp_path / "state" / "state.json").read_text())["incidents"]) == 2


def test_damaged_state_files_never_crash_a_start_and_are_kept(tmp_path: Path, caplog) -> None:
    damaged = [
        '{"version": 1, "boot_id": ',
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
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            replay = a_life(tmp_path / f"life{n}", upto(521), state_dir=str(state_dir))
        assert any("corrupt" in r.getMessage() for r in caplog.records), n
        assert [i.victim.pid for i in replay.published] == [118, 125], n  # counted from zero
        close(replay)
        kept = list(state_dir.glob("state.json.corrupt-*"))
        assert len(kept) == 1 and kept[0].read_text() == text, n
        assert json.loads((state_dir / "state.json").read_text())["version"] == STATE_VERSION


def test_a_second_lock_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    """(That the agent then exits 2 without touching the state: the smoke test in tests/test_agent.py.)"""
    first = StateFile(str(tmp_path / "state"))
    first.lock()
    try:
        refused = StateFileSink(StateFile(str(tmp_path / "state")))
        try:
            refused.load(Store(), BOOT_ID)
            raise AssertionError("a second lock was granted")
        except StateLocked as exc:
            assert "another oomwatch agent" in str(exc)
    finally:
        first.unlock()
    second = StateFile(str(tmp_path / "state"))
    second.lock()  # free again once the first is gone
    second.unlock()


def test_held_lines_are_written_on_flush_only() -> None:
    import tempfile

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


def test_a_cgroup_that_breaks_its_handler_does_not_stop_the_watch(tmp_path: Path) -> None:
    """The real watcher on its thread: one cgroup's event that raises is counted and logged, the others are
    still reported."""
    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    got: queue.SimpleQueue = queue.SimpleQueue()

    def emit(event) -> None:
        if isinstance(event, CgroupChanged) and event.path == "/a":
            raise RuntimeError("a bug")
        got.put(event)

    source = CgroupSource(CgroupFS(str(tree)), WorkloadResolver(), emit)
    source.start()
    thread = threading.Thread(target=source.run)
    thread.start()
    try:
        for name in ("memory.events.local", "memory.events"):  # inotify watches memory.events
            (tree / "a" / name).write_text("max 99\noom 9\noom_kill 9\noom_group_kill 0\n")
        assert wait_for(lambda: source.watcher.callback_errors >= 1, timeout=60)
        for name in ("memory.events.local", "memory.events"):
            (tree / "b" / name).write_text("max 99\noom 9\noom_kill 99\noom_group_kill 9\n")

        def b_changed() -> bool:
            while not got.empty():
                event = got.get()
                if isinstance(event, CgroupChanged) and event.path == "/b" and event.local["oom_kill"] == 99:
                    return True
            return False

        assert wait_for(b_changed, timeout=60)
        assert source.watcher.alive and source.watcher.error is None
    finally:
        source.stop()
        thread.join()
        source.watcher.close()
