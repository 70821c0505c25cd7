"""The store's series stay bounded: workloads known only from the log expire like gone ones, and a cap drops the
workloads gone longest first, counted."""

from __future__ import annotations

from oomwatch.model import Incident, KilledProcess, Workload
from oomwatch.store import Store


def kill_in(cgroup: str, n: int) -> Incident:
    victim = KilledProcess(pid=n, comm="x", cgroup=cgroup)
    return Incident(time=float(n), boot_id="b", kernel_seq=n, kind="single", constraint="memcg", scope="cgroup",
                    oom_cgroup=cgroup, group_cgroup=None, trigger=None, memory=None, victim=victim,
                    killed=(victim,), workload=Workload(type="other", cgroup=cgroup), explanation="",
                    detected_at=float(n))


def test_workloads_seen_only_in_the_log_expire_after_the_grace_period() -> None:
    now = [1000.0]
    store = Store(grace_seconds=600.0, clock=lambda: now[0])
    store.seen(("", "", "", "/live"))
    store.publish(kill_in("/live", 1))
    store.publish(kill_in("/replayed", 2))
    now[0] += 601
    store.expire()
    assert set(store.snapshot().workloads) == {("", "", "", "/live")}


def test_the_cap_drops_gone_workloads_first_and_counts_them() -> None:
    now = [0.0]
    store = Store(clock=lambda: now[0], max_workloads=3)
    store.seen(("", "", "", "/live"))
    for n in range(5):
        now[0] = float(n)
        store.publish(kill_in(f"/step{n}", n))
    snap = store.snapshot()
    assert set(snap.workloads) == {("", "", "", "/live"), ("", "", "", "/step3"), ("", "", "", "/step4")}
    assert snap.workloads_dropped == 3


def test_never_killed_workloads_share_zero_counts_and_a_snapshot_keeps_its_values() -> None:
    """Thousands of workloads are never killed: they hold one shared read-only zero count, not two dicts each;
    counts are replaced, not changed in place, so a snapshot taken before a kill still shows the old values."""
    store = Store(grace_seconds=600.0, clock=lambda: 0.0)
    for cgroup in ("/a", "/b"):
        store.seen(("", "", "", cgroup))
    before = store.snapshot().workloads
    a, b = before[("", "", "", "/a")], before[("", "", "", "/b")]
    assert a.kills is b.kills and a.killed is b.killed
    store.publish(kill_in("/a", 1))
    after = store.snapshot().workloads[("", "", "", "/a")]
    assert dict(after.kills) == {"single": 1, "group": 0} and dict(after.killed) == {"victim": 1, "collateral": 0}
    assert dict(a.kills) == {"single": 0, "group": 0}  # the earlier snapshot is unchanged
    assert store.snapshot().workloads[("", "", "", "/b")].kills is b.kills


def test_the_state_is_written_in_pieces_exactly_as_json_dumps_writes_it() -> None:
    """write_json encodes lists and dicts of thousands of entries a piece at a time (with json's C encoder): the
    text is the same as one json.dumps of the whole state, at every size around a piece's."""
    import io
    import json

    from oomwatch.statefile import _PIECE, write_json

    for n in (0, 1, _PIECE - 1, _PIECE, _PIECE + 1, 3 * _PIECE + 7):
        state = {"version": 2, "workloads": [{"labels": ["ns", f"pod-{i}", "c", ""], "kills": {"group": i}}
                                             for i in range(n)],
                 "accounts": {f"/kubepods/pod{i}": {"ino": i, "seen": {"oom_kill": 1}} for i in range(n)},
                 "incidents": [], "kmsg": {}, "cursor_seq": None, "text": "é\"\n"}
        out = io.StringIO()
        write_json(out, state)
        assert out.getvalue() == json.dumps(state, separators=(",", ":")), n


def test_the_stored_incidents_are_encoded_once_and_written_as_json_dumps_writes_them(tmp_path) -> None:
    """A StateFile keeps each stored incident's text between saves (they never change once stored): every save
    is still exactly json.dumps of the whole state, as the store's incidents roll over its cap, and only the
    incidents new since the last save are encoded."""
    import json

    from oomwatch import statefile
    from oomwatch.statefile import StateFile

    store = Store(max_incidents=5)
    state_file = StateFile(str(tmp_path))
    state_file.lock()
    state_file.loaded = True
    encoded: list = []
    real_dumps = json.dumps

    def counting_dumps(v, **kw):
        if isinstance(v, dict) and "kernel_seq" in v:
            encoded.append(v["kernel_seq"])
        return real_dumps(v, **kw)

    try:
        statefile.json.dumps = counting_dumps  # the module's json: write_json's own calls
        for n in range(1, 9):
            store.publish(kill_in(f"/c{n % 3}", n))
            encoded.clear()
            state_file.save(store, {})
            written = (tmp_path / "state.json").read_text()
            assert written == real_dumps(store.to_state(), separators=(",", ":")), n
            assert len(json.loads(written)["incidents"]) == min(n, 5)
            assert encoded == [n], (n, encoded)  # the new one only
    finally:
        statefile.json.dumps = real_dumps
        state_file.unlock()


def test_a_kill_of_a_workload_the_full_store_cannot_take_counts_on_the_node() -> None:
    """Every workload live and the cap reached: a kill in a workload known only from the log gets no series of its
    own (the store cannot drop a live one for it), and is still counted on the node and kept in the incidents."""
    store = Store(clock=lambda: 0.0, max_workloads=2)
    for name in ("/a", "/b"):
        store.seen(("", "", "", name))
    assert store.publish(kill_in("/gone", 1))
    snap = store.snapshot()
    assert set(snap.workloads) == {("", "", "", "/a"), ("", "", "", "/b")}
    assert sum(snap.node_kills.values()) == 1 and len(snap.incidents) == 1
    assert store.count_death(("k",), "userspace", ("", "", "", "/gone"), {"cause": "userspace"})
    assert set(store.snapshot().workloads) == {("", "", "", "/a"), ("", "", "", "/b")}
