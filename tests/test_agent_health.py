"""/healthz says what the agent cannot see, from each part's own word (no threads needed: the parts are stood in
for by what they report)."""

from __future__ import annotations

from types import SimpleNamespace

from oomwatch.agent import health_of
from oomwatch.config import Config
from oomwatch.sources.cgroupfs import WatchHealth

SEEING = WatchHealth(alive=True)


def said(value):
    """A part that says `value` when asked."""
    return lambda: value


def agent(**overrides):
    parts = dict(
        starting=None,
        kernel_log=SimpleNamespace(health=said((True, "ok")), starting=said(None), saved=False),
        cgroups=SimpleNamespace(health=said(SEEING)),
        sinks=[],
        blind=None, fatal=None, config=Config(),
        view=SimpleNamespace(state_error=None, workloads_over_cap=0, kernel_log_live=True),
        http=SimpleNamespace(health=said({}), failed_scrapes=0),
        connector=None)
    parts.update(overrides)
    parts["latest"] = SimpleNamespace(view=parts.pop("view"))  # (the agent's latest view holder)
    return SimpleNamespace(**parts)


def test_healthy_when_every_part_sees() -> None:
    assert health_of(agent()) == (True, {"kmsg": "ok", "cgroups": "ok"})


def test_each_blindness_is_a_503_with_its_reason() -> None:
    cases = {
        "cgroups": agent(blind="memory is on a cgroup v1 hierarchy on this host (hybrid): …"),
        "cgroups ": agent(cgroups=SimpleNamespace(health=said(SEEING._replace(
            blind="2 cgroup(s) unreadable to this agent (uid 65534), e.g. /x: memory.events",
            unwatched={"inotify_watches": 0, "unreadable": 2})))),
        "cgroups  ": agent(cgroups=SimpleNamespace(health=said(WatchHealth(False, "cgroup watcher stopped: …")))),
        "kmsg": agent(kernel_log=SimpleNamespace(health=said((False, "/bin/ls holds binary data, not a kernel log")),
                                                 starting=said(None), saved=True)),
        "scrape": agent(http=SimpleNamespace(health=said({"scrape": "the last scrape failed: UnicodeEncodeError: …"}))),
        "workloads": agent(view=SimpleNamespace(state_error=None, workloads_over_cap=7, kernel_log_live=True)),
        "fatal": agent(fatal="the cgroup watcher stopped"),
    }
    for key, broken in cases.items():
        ok, detail = health_of(broken)
        assert not ok, key
        assert detail[key.strip()] != "ok", (key, detail)


def test_degradations_that_still_see_are_said_but_healthy() -> None:
    """Cgroups inotify cannot watch are still read (at each scrape; their directories listed every 30 s), and a
    restart would give no watches back: said, not a 503 (a liveness probe would restart the agent in a loop)."""
    starved = agent(cgroups=SimpleNamespace(health=said(SEEING._replace(
        blind="3 cgroup(s) not fully watched: out of inotify watches (raise the sysctl fs.inotify.max_user_watches, "
              "now 8192)", unwatched={"inotify_watches": 3, "unreadable": 0}))),
        sinks=[SimpleNamespace(health=said({"events_file": "/var/log/oomwatch.jsonl: No space left on device"}))])
    ok, detail = health_of(starved)
    assert ok and detail["cgroups"] == "ok"
    assert "fs.inotify.max_user_watches" in detail["cgroup_watch"]
    assert detail["events_file"].endswith("No space left on device")


def test_a_state_that_is_not_saved_is_said_but_not_fatal() -> None:
    ok, detail = health_of(agent(view=SimpleNamespace(state_error="Read-only file system", workloads_over_cap=0,
                                                      kernel_log_live=True)))
    assert ok and detail["state"] == "Read-only file system"


def test_the_same_checks_are_series() -> None:
    """oomwatch_agent_healthy{check}: what /healthz says, for alerts; a blind agent is 0 on its check."""
    from oomwatch.agent import status_of

    blind = agent(blind="memory is on a cgroup v1 hierarchy on this host (hybrid): …",
                  http=SimpleNamespace(health=said({}), failed_scrapes=3),
                  cgroups=SimpleNamespace(health=said(SEEING._replace(unwatched={"inotify_watches": 2,
                                                                                 "unreadable": 0}))))
    status = status_of(blind)
    assert status.checks == {"kmsg": True, "cgroups": False, "scrape": True, "workloads": True, "state": True,
                             "cgroup_watch": True, "events_file": True}
    assert status.failed_scrapes == 3 and status.unwatched == {"inotify_watches": 2, "unreadable": 0}


def test_starting_until_the_tree_and_the_kernel_log_s_backlog_are_read_and_published() -> None:
    assert health_of(agent(starting="reading the cgroup tree")) == (False, {"starting": "reading the cgroup tree"})
    backlog = agent(kernel_log=SimpleNamespace(health=said((True, "ok")), saved=False,
                                               starting=said("reading the kernel log's backlog")))
    assert health_of(backlog) == (False, {"starting": "reading the kernel log's backlog"})
    # read, and its incidents not all published yet (a kill made now would wait behind them)
    publishing = agent(view=SimpleNamespace(state_error=None, workloads_over_cap=0, kernel_log_live=False))
    assert health_of(publishing) == (False, {"starting": "publishing what the kernel log held at start"})
    # no kernel log at all: that is what /healthz says, not "starting"
    blind = agent(kernel_log=SimpleNamespace(health=said((False, "/dev/kmsg: Permission denied")),
                                             starting=said(None), saved=False),
                  view=SimpleNamespace(state_error=None, workloads_over_cap=0, kernel_log_live=False))
    assert health_of(blind) == (False, {"kmsg": "/dev/kmsg: Permission denied", "cgroups": "ok"})
    # a saved log is all backlog: ready once read (a FIFO's writer may wait for that)
    saved = agent(kernel_log=SimpleNamespace(health=said((True, "ok")), starting=said(None), saved=True),
                  view=SimpleNamespace(state_error=None, workloads_over_cap=0, kernel_log_live=False))
    assert health_of(saved) == (True, {"kmsg": "ok", "cgroups": "ok"})


def test_the_events_file_sink_says_why_it_cannot_write(tmp_path) -> None:
    """The real sink's word, as /healthz reads it: {} while it writes, its reason (not a 503) while it cannot."""
    from oomwatch.sinks import EventsFileSink
    from oomwatch.sinks.events import EventsFile
    from tests.test_events_file import incident

    writes = EventsFileSink(EventsFile(str(tmp_path / "events.jsonl")))
    writes.start([incident(1)])
    refused = EventsFileSink(EventsFile(str(tmp_path)))  # a directory
    refused.start([incident(1)])
    assert writes.health() == {} and writes.errors == 0
    ok, detail = health_of(agent(sinks=[writes, refused]))
    assert ok and str(tmp_path) in detail["events_file"] and refused.errors == 1
    for sink in (writes, refused):
        sink.close()
