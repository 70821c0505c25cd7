"""Group kills of thousands of processes (issue 19, item 3): an incident lists at most MAX_KILLED_LISTED of them,
with the exact count and the per-workload counters beside it, so the store, the state file and /incidents stay
the same size however many processes died. The lines are the real 6.1 kernel's group-kill lines (the golden
k8s-runc capture), repeated for 3,000 members as the kernel prints them."""

from __future__ import annotations

import json

from oomwatch.correlator import MAX_KILLED_LISTED
from oomwatch.events import CgroupAdded, KernelLog
from oomwatch.parse.kmsg import parse_kmsg_record
from tests.replay import Replay, live_settings

GROUP = "/kubepods/burstable/pod0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f/4f2a9c1e7b3d5a6c8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d"
KILL = ("Memory cgroup out of memory: Killed process {pid} (worker) total-vm:309460kB, anon-rss:64856kB, "
        "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:168kB oom_score_adj:0")


def group_kill(first_seq: int, first_pid: int, members: int) -> list:
    """The kernel's lines for one group kill: victim, `Tasks in`, every member (the victim reprinted among them)."""
    texts = [KILL.format(pid=first_pid), f"Tasks in {GROUP} are going to be killed due to memory.oom.group set"]
    texts += [KILL.format(pid=first_pid + i) for i in range(members)]
    return [parse_kmsg_record(f"{6 if t.startswith('Tasks') else 3},{first_seq + i},{9_000_000 + first_seq + i},-;"
                              f"{t}".encode()) for i, t in enumerate(texts)]


def test_a_group_kill_of_3000_processes_keeps_a_bounded_list_and_exact_counts() -> None:
    replay = Replay(live_settings(counting=False), now=100.0)
    replay.step(CgroupAdded(GROUP, 7, None, 1, True, ()))
    replay.step(KernelLog(group_kill(1, 1000, 3000), drained_at=100.0), now=100.0)
    replay.advance_to(101.0)
    (incident,) = replay.published
    assert incident.kind == "group"
    assert len(incident.killed) == MAX_KILLED_LISTED
    assert incident.killed_count == 3000 and incident.killed_truncated
    data = incident.to_json()
    assert data["killed_count"] == 3000 and data["killed_truncated"] is True
    assert len(data["killed"]) == MAX_KILLED_LISTED
    # The explanation was written from the whole listing: three names and "2996 more" of the 2,999 others.
    assert "and 2996 more" in incident.explanation, incident.explanation
    # Counters count every process once, as if the list were whole.
    snap = replay.pipeline.view().store
    (counters,) = [c for labels, c in snap.workloads.items() if c.last_kill is not None]
    assert dict(counters.killed) == {"victim": 1, "collateral": 2999}
    assert dict(counters.kills) == {"single": 0, "group": 1}


def test_ninety_huge_group_kills_keep_the_state_small() -> None:
    """The probe's case: 90 group kills of 3,000 processes each made a 75.7 MB state file that the next start
    could not read. Now the state grows with the incidents kept (500 at most), not with the processes: 90 kills of
    300 (the size does not depend on it past the listed 100) stay far below the state reader's cap."""
    replay = Replay(live_settings(counting=False), now=100.0)
    replay.step(CgroupAdded(GROUP, 7, None, 1, True, ()))
    seq = 1
    for n in range(90):
        records = group_kill(seq, 100_000 + n * 10_000, 300)
        seq += len(records)
        replay.step(KernelLog(records, drained_at=100.0 + n), now=100.0 + n)
    replay.advance_to(300.0)
    assert len(replay.published) == 90
    state = json.dumps(replay.pipeline.state())
    assert len(state) < 4 << 20, f"state of {len(state)} bytes"
    snap = replay.pipeline.view().store
    (counters,) = [c for labels, c in snap.workloads.items() if c.last_kill is not None]
    assert dict(counters.killed) == {"victim": 90, "collateral": 90 * 299}


def test_a_killed_process_json_has_every_field() -> None:
    """KilledProcess.to_json is written out by hand (for speed): it must stay every field of the dataclass."""
    from dataclasses import asdict, fields

    from oomwatch.model import KilledProcess

    process = KilledProcess(*range(1, len(fields(KilledProcess)) + 1))
    assert process.to_json() == asdict(process)
