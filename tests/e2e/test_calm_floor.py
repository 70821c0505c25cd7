"""The calm single kill after the floor (issue 30's Done-when: "≤ 100 ms after the floor, in the real-kernel tier"):
the guest's r_calm_floor (tests/e2e/guest/calm_floor_scenario.py) fires single kills one at a time, each in a
64 MiB container of its own (memory.oom.group=0), with the C floor watcher (tests/e2e/guest/oomfloor.c) beside the
agent. Per kill: the agent's publish (its own `detected_at`, in the events file) less the moment the floor read the
same kernel record (the incident's `kernel_seq`, its `oom-kill:` summary), both on the guest's CLOCK_REALTIME, as
the storm's figure of record (tests/e2e/test_storm.py).

Part of the main boot; alone: `flock /tmp/oomwatch-vm.lock .venv/bin/python -m tests.e2e.vm --only r DIR`, then
`OOMWATCH_E2E_RUN=DIR .venv/bin/python -m pytest -m e2e tests/e2e/test_calm_floor.py -s`.
"""

from __future__ import annotations

import json
import os
import statistics
from datetime import datetime

import pytest

from tests.e2e.conftest import E2ERun
from tests.e2e.guest import floorwatch

pytestmark = pytest.mark.e2e
NAME = "r_calm_floor"
MAX_AFTER_FLOOR = float(os.environ.get("OOMWATCH_E2E_MAX_CALM_AFTER_FLOOR", "0.1"))  # seconds, each kill


def wall(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def calm(e2e: E2ERun) -> dict:
    sc = e2e.scenario(NAME)
    assert not sc.gt["errors"], sc.gt["errors"]
    rows_path, floor_path = sc.dir / "calm-floor.json", sc.dir / "floor.txt"
    assert rows_path.exists() and floor_path.exists(), f"{NAME} left no calm-floor.json or floor.txt"
    assert e2e.events is not None, "the agent wrote no events file"
    return {"sc": sc, "rows": json.loads(rows_path.read_text()), "read": floorwatch.records_read(floor_path),
            "moves": floorwatch.counter_moves(floor_path), "dir": e2e.dir, "events": e2e.events}


def test_each_kill_is_a_single_kill_in_a_cgroup_of_its_own(calm) -> None:
    sc, rows = calm["sc"], calm["rows"]
    want = sc.gt["expect"]["kills"]
    assert want >= 5 and len(rows) == want and len(sc.kernel) == want, [k.summary() for k in sc.kernel]
    by_seq = {k.seq: k for k in sc.kernel}
    for row in rows:
        k = by_seq[row["kernel_seq"]]
        assert (k.kind, k.task_memcg, k.oom_memcg, k.victim_pid) == ("single", row["cgroup"], row["cgroup"],
                                                                       row["victim_pid"]), k.summary()
    assert len({row["cgroup"] for row in rows}) == want
    # each was the node's only kill while it was being published: the one before it fully done (death line)
    assert all(row["death_line"] for row in rows)


def test_the_agent_published_each_kill_once_from_the_log(calm) -> None:
    for row in calm["rows"]:
        mine = [e for e in calm["events"] if e.get("kernel_seq") == row["kernel_seq"]]
        assert len(mine) == 1, f"seq {row['kernel_seq']}: {len(mine)} incidents"
        e = mine[0]
        assert (e["kind"], e["evidence"], e["victim"]["pid"]) == ("single", "kmsg", row["victim_pid"])


def test_the_calm_single_kill_after_the_floor(calm) -> None:
    """Issue 30: each calm single kill published at most 100 ms (OOMWATCH_E2E_MAX_CALM_AFTER_FLOOR) after the floor
    first saw it: its read of the kill's record or the move of the cgroup's memory.events oom_kill, whichever came
    first (under load the kernel's wake-up of log readers can come after the counter's: 226 ms once, in the main
    boot of 2026-11-28 03:08). Printed and kept in the run directory (calm-after-floor.txt) per kill, with the agent's
    publish after the floor's read of the record beside it (the storm's figure)."""
    read, moves, lines, after = calm["read"], calm["moves"], [], []
    for row in calm["rows"]:
        assert row["kernel_seq"] in read, f"the floor did not read record {row['kernel_seq']}"
        [e] = [e for e in calm["events"] if e.get("kernel_seq") == row["kernel_seq"]]
        published, record = wall(e["detected_at"]), read[row["kernel_seq"]]
        counter = min((t for i, t, kill, _ in moves if i == row["index"] and kill >= 1), default=record)
        floor = min(record, counter)
        after.append(published - floor)
        ms = {k: round(v * 1000) for k, v in (("read", record - row["fired_wall"]), ("counter", counter - record),
                                                  ("after", published - floor), ("record", published - record))}
        lines.append(f"  kill {row['index']} seq {row['kernel_seq']}: the floor read the record {ms['read']} ms "
                     f"after the trigger, saw the counter move {ms['counter']:+d} ms from it; the agent published "
                     f"{ms['after']} ms after the floor's first sight ({ms['record']} ms after its read of the record)")
    p50 = statistics.median(after)
    figure = (f"calm single kills: the agent's publish after the floor over {len(after)} kills: "
              f"p50 {p50 * 1000:.0f} ms, max {max(after) * 1000:.0f} ms (bound {MAX_AFTER_FLOOR * 1000:.0f} ms)")
    print("\n" + "\n".join([figure, *lines]))
    (calm["dir"] / "calm-after-floor.txt").write_text("\n".join([figure, *lines]) + "\n")
    assert max(after) <= MAX_AFTER_FLOOR
