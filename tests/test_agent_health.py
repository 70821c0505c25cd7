"""/healthz says what the agent cannot see, from each part's own word (no threads needed: the parts are stood in
for by what they report)."""

from __future__ import annotations

from types import SimpleNamespace

from oomwatch.agent import health_of
from oomwatch.config import Config


def agent(**overrides):
    parts = dict(
        kernel_log=SimpleNamespace(health=lambda: (True, "ok")),
        cgroups=SimpleNamespace(watcher=SimpleNamespace(alive=True, error=None, blind=None,
                                                        unwatched_counts=lambda: {})),
        sinks=[],
        blind=None, fatal=None, config=Config(),
        view=SimpleNamespace(state_error=None, workloads_over_cap=0),
        http=SimpleNamespace(server=SimpleNamespace(last_scrape_failed=False, last_scrape_error=None)),
        connector=None)
    parts.update(overrides)
    parts["latest"] = SimpleNamespace(view=parts.pop("view"))  # (the agent's latest view holder)
    return SimpleNamespace(**parts)


def test_healthy_when_every_part_sees() -> None:
    assert health_of(agent()) == (True, {"kmsg": "ok", "cgroups": "ok"})


def test_each_blindness_is_a_503_with_its_reason() -> None:
    cases = {
        "cgroups": agent(blind="memory is on a cgroup v1 hierarchy on this host (hybrid): …"),
        "cgroups ": agent(cgroups=SimpleNamespace(watcher=SimpleNamespace(
            alive=True, error=None, blind="2 cgroup(s) unreadable to this agent (uid 65534), e.g. /x: memory.events",
            unwatched_counts=lambda: {"inotify_watches": 0, "unreadable": 2}))),
        "kmsg": agent(kernel_log=SimpleNamespace(health=lambda: (False, "/bin/ls holds binary data, not a kernel "
                                                                        "log"))),
        "scrape": agent(http=SimpleNamespace(server=SimpleNamespace(last_scrape_failed=True,
                                                                    last_scrape_error="UnicodeEncodeError: …"))),
        "workloads": agent(view=SimpleNamespace(state_error=None, workloads_over_cap=7)),
        "fatal": agent(fatal="the cgroup watcher stopped"),
    }
    for key, broken in cases.items():
        ok, detail = health_of(broken)
        assert not ok, key
        assert detail[key.strip()] != "ok", (key, detail)


def test_degradations_that_still_see_are_said_but_healthy() -> None:
    """Cgroups inotify cannot watch are still read (at each scrape; their directories listed every 30 s), and a
    restart would give no watches back: said, not a 503 (a liveness probe would restart the agent in a loop)."""
    starved = agent(cgroups=SimpleNamespace(watcher=SimpleNamespace(
        alive=True, error=None, blind="3 cgroup(s) not fully watched: out of inotify watches (raise the sysctl "
                                      "fs.inotify.max_user_watches, now 8192)",
        unwatched_counts=lambda: {"inotify_watches": 3, "unreadable": 0})),
        sinks=[SimpleNamespace(file=SimpleNamespace(failing="/var/log/oomwatch.jsonl: No space left on device"))])
    ok, detail = health_of(starved)
    assert ok and detail["cgroups"] == "ok"
    assert "fs.inotify.max_user_watches" in detail["cgroup_watch"]
    assert detail["events_file"].endswith("No space left on device")


def test_a_state_that_is_not_saved_is_said_but_not_fatal() -> None:
    ok, detail = health_of(agent(view=SimpleNamespace(state_error="Read-only file system", workloads_over_cap=0)))
    assert ok and detail["state"] == "Read-only file system"


def test_the_same_checks_are_series() -> None:
    """oomwatch_agent_healthy{check}: what /healthz says, for alerts; a blind agent is 0 on its check."""
    from oomwatch.agent import status_of

    blind = agent(blind="memory is on a cgroup v1 hierarchy on this host (hybrid): …",
                  http=SimpleNamespace(server=SimpleNamespace(last_scrape_failed=False, last_scrape_error=None,
                                                              failed_scrapes=3)),
                  cgroups=SimpleNamespace(watcher=SimpleNamespace(
                      alive=True, error=None, blind=None,
                      unwatched_counts=lambda: {"inotify_watches": 2, "unreadable": 0})))
    status = status_of(blind)
    assert status.checks == {"kmsg": True, "cgroups": False, "scrape": True, "workloads": True, "state": True,
                             "cgroup_watch": True, "events_file": True}
    assert status.failed_scrapes == 3 and status.unwatched == {"inotify_watches": 2, "unreadable": 0}
