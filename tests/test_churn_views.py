"""Churn costs what changed (issue 31, item 2): the view a scrape reads is taken after every change, so taking it
must not copy what did not change. 118 s of CPU went into rebuilding it whole for each of 10,000 removals among
20,000 workloads; benchmarks/churn.py measures the agent, these check the structure (nothing is timed)."""

from __future__ import annotations

from oomwatch.cowmap import CHUNK, CowMap
from oomwatch.events import CgroupAdded, CgroupRemoved
from oomwatch.store import Store
from tests.replay import Replay, live_settings


def test_a_frozen_copy_never_changes_and_later_changes_copy_one_chunk() -> None:
    cow = CowMap((f"/w{i}", i) for i in range(5 * CHUNK))
    before = cow.frozen()
    cow["/w3"] = "changed"
    del cow[f"/w{CHUNK + 1}"]
    cow["/new"] = -1
    after = cow.frozen()
    assert dict(before.items()) == {f"/w{i}": i for i in range(5 * CHUNK)}  # untouched by what came after
    assert list(after)[:4] == ["/w0", "/w1", "/w2", "/w3"] and after["/w3"] == "changed"  # a change keeps its place
    assert f"/w{CHUNK + 1}" not in after and list(after)[-1] == "/new" and len(after) == 5 * CHUNK
    shared = [a is b for a, b in zip(before.chunks, after.chunks)]
    assert shared == [False, False, True, True, True]  # only the chunks changed were copied
    assert len(after.chunks) == 6  # (the appended entry in a chunk of its own: the others were full)


def test_removals_are_packed_away_and_order_kept() -> None:
    cow = CowMap((i, str(i)) for i in range(10_000))
    for i in range(10_000):
        if i % 10:
            del cow[i]
        elif i % 20 == 0:
            cow[i] = "x"
    frozen = cow.frozen()
    expected = {i: ("x" if i % 20 == 0 else str(i)) for i in range(0, 10_000, 10)}
    assert list(frozen.items()) == list(expected.items())
    assert sum(len(chunk) for chunk in frozen.chunks) < 10_000  # packed: the removed slots are gone


def test_a_snapshot_shares_the_counters_nothing_changed() -> None:
    """A snapshot is the store's counters as they are, not a copy of each: a kill in one workload replaces that
    workload's counters, and the next snapshot shares every other workload's with the last."""
    store = Store(clock=lambda: 0.0)
    for i in range(1000):
        store.seen(("", "", "", f"/w{i}"))
    first = store.snapshot().workloads
    store.gone(("", "", "", "/w7"))
    second = store.snapshot().workloads
    assert first[("", "", "", "/w7")].gone_since is None and second[("", "", "", "/w7")].gone_since == 0.0
    assert all(first[labels] is second[labels] for labels in first if labels[3] != "/w7")


def test_views_follow_adds_removals_and_relabels() -> None:
    """The pipeline keeps its view's rows as workloads come and go (one row each, in the order they came), and
    two views in a row share what did not change."""
    replay = Replay(live_settings(), store=Store(grace_seconds=60.0), now=10.0)
    replay.run(CgroupAdded(f"/w{i}", i + 1, None, 0, True, ()) for i in range(3 * CHUNK))
    before = replay.pipeline.view()
    replay.step(CgroupRemoved("/w5"), now=11.0)
    after = replay.pipeline.view()
    assert [path for path, _, _ in after.workloads] == [f"/w{i}" for i in range(3 * CHUNK) if i != 5]
    assert len(before.workloads) == 3 * CHUNK and len(after.workloads) == 3 * CHUNK - 1
    assert before.workloads.mapping.chunks[1] is after.workloads.mapping.chunks[1]


def test_expiry_drops_in_the_order_workloads_went_whatever_came_back_between() -> None:
    now = [0.0]
    store = Store(clock=lambda: now[0], grace_seconds=10.0)
    for name in ("/a", "/b", "/c"):
        store.seen(("", "", "", name))
    store.gone(("", "", "", "/a"))
    now[0] = 1.0
    store.gone(("", "", "", "/b"))
    store.seen(("", "", "", "/a"))  # back (a cgroup of the same name made again)
    now[0] = 5.0
    store.gone(("", "", "", "/a"))
    now[0] = 11.5
    assert store.expire() == 1 and {k[3] for k in store.snapshot().workloads} == {"/a", "/c"}
    assert store.next_expiry() == 15.0
    now[0] = 15.0
    assert store.expire() == 1 and {k[3] for k in store.snapshot().workloads} == {"/c"}
    assert store.next_expiry() is None
