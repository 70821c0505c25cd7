"""Replaying a saved log with a state directory is idempotent however long the log (issue 19, item 4): the cursor
saved with the state (each record's place in the log), not a window of remembered incident keys, decides what
was counted. A log of more kills than the store remembers keys for (10,000) was counted again at every restart."""

from __future__ import annotations

import json
from pathlib import Path

from oomwatch.sources.kernellog import KernelLogSource
from oomwatch.store import Store
from tests.replay import Replay, live_settings

KILLS = 10_500  # more than the 10,000 incident keys the store remembers


def write_log(path: Path, kills: int) -> None:
    lines = [f"[{100 + i * 0.001:12.6f}] Memory cgroup out of memory: Killed process {1000 + i} (worker) "
             "total-vm:309460kB, anon-rss:64856kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:168kB "
             "oom_score_adj:0" for i in range(kills)]
    path.write_text("\n".join(lines) + "\n")


def replay_once(log: Path, state: dict | None) -> tuple[int, dict]:
    """One agent life over the saved log: the source as the agent opens it, the pipeline restored from `state`;
    returns (incidents published in this life, the state it saved last)."""
    store = Store()
    if state is not None:
        store.load_state(state)
    events: list = []
    source = KernelLogSource(str(log), events.append)
    cursor = source.open(lambda kind: store.cursor_seq if state is not None and store.cursor_source == kind
                         else None)
    source.start()
    source.join(60)
    replay = Replay(live_settings(kmsg_source=None, counting=False, saved_log=True, skip_upto=cursor), store=store,
                    accounts=(state or {}).get("accounts"), now=1000.0)
    replay.run(events)
    return len(replay.published), replay.saves[-1]


def test_replaying_a_long_saved_log_again_counts_nothing_twice(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.txt"
    write_log(log, KILLS)
    first, state = replay_once(log, None)
    assert first == KILLS
    assert state["cursor_source"] == "file" and state["cursor_seq"] == KILLS - 1
    second, state = replay_once(log, json.loads(json.dumps(state)))
    assert second == 0
    assert sum(n for kind, scope, n in state["node_kills"]) == KILLS
    # The log grew while the agent was down: only the new kills are counted.
    write_log(log, KILLS + 5)
    third, state = replay_once(log, json.loads(json.dumps(state)))
    assert third == 5
    assert sum(n for kind, scope, n in state["node_kills"]) == KILLS + 5
