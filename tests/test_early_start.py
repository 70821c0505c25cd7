"""`oomwatch agent` drains /dev/kmsg before its heavy imports; the agent takes over that pump and continues
exactly after its saved cursor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from oomwatch.early import wants_early_start
from oomwatch.pump import KernelLogPump
from tests.conftest import REPO, SeqpacketKmsg, incidents_of, running_agent, wait_for
from tests.test_agent import SCENARIOS, agent_config, events, upto


def test_only_the_agent_on_dev_kmsg_starts_early() -> None:
    assert wants_early_start(["oomwatch", "agent"], {})
    assert wants_early_start(["oomwatch", "agent", "--kmsg", "/dev/kmsg"], {})
    assert not wants_early_start(["oomwatch", "agent", "--kmsg", "saved.log"], {})
    assert not wants_early_start(["oomwatch", "agent", "--kmsg=syslog"], {})
    assert not wants_early_start(["oomwatch", "agent"], {"OOMWATCH_KMSG": "syslog"})
    assert not wants_early_start(["oomwatch", "agent", "--help"], {})
    assert not wants_early_start(["oomwatch", "inspect"], {})
    assert not wants_early_start(["oomwatch"], {})


def test_the_early_reader_decides_what_kmsg_names_as_the_agent_does(tmp_path: Path) -> None:
    """It compared the text with "/dev/kmsg": another name of the device (a symlink) did not start early,
    though the agent reads it live."""
    import os

    from oomwatch.early import early_kmsg_path

    if os.path.exists("/dev/kmsg"):
        link = tmp_path / "kmsg-link"
        link.symlink_to("/dev/kmsg")
        assert early_kmsg_path(["oomwatch", "agent", "--kmsg", str(link)], {}) == str(link)

    saved = tmp_path / "kmsg"
    saved.write_text("[ 1.0] x\n")
    assert early_kmsg_path(["oomwatch", "agent", "--kmsg", str(saved)], {}) is None
    assert early_kmsg_path(["oomwatch", "agent", "--kmsg", "/dev/zero"], {}) is None
    assert early_kmsg_path(["oomwatch", "agent", "--kmsg"], {}) is None
    assert early_kmsg_path(["oomwatch", "agent"], {"OOMWATCH_KMSG": "-"}) is None
    assert early_kmsg_path(["oomwatch", "agent", "--kmsg=/dev/kmsg"], {}) == "/dev/kmsg"


def started_pump(kmsg: SeqpacketKmsg) -> KernelLogPump:
    reader = kmsg.factory("/dev/kmsg")
    reader.open()
    reader.prefilter = True
    pump = KernelLogPump(reader)  # holds what it reads until the agent adopts it
    pump.start()
    return pump


def test_the_agent_takes_over_an_early_pump_and_skips_to_its_cursor(tmp_path: Path) -> None:
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(521))
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 2)
    # Restart: the early pump reads the whole ring again, from its oldest record.
    kmsg = SeqpacketKmsg()
    kmsg.send(SCENARIOS)
    pump = started_pump(kmsg)
    assert wait_for(lambda: pump.backlog() > 0)
    with running_agent(agent_config(tmp_path, kmsg="/dev/kmsg"), early_pump=pump) as agent:
        assert agent.pump is pump
        assert wait_for(lambda: len(incidents_of(agent)) == 4)
        assert agent.store.snapshot().kmsg_lost == 0
    assert [e["victim"]["pid"] for e in events(tmp_path)] == [118, 125, 132, 139]


def test_a_gap_between_the_cursor_and_the_oldest_record_is_lost(tmp_path: Path) -> None:
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(400))
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: agent.store.cursor_seq == 400)
    kmsg = SeqpacketKmsg()
    kmsg.send([r for r in SCENARIOS if int(r.split(b",", 2)[1]) > 450])
    pump = started_pump(kmsg)
    with running_agent(agent_config(tmp_path, kmsg="/dev/kmsg"), early_pump=pump) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 4)
        assert agent.store.snapshot().kmsg_lost == 50


def test_the_cli_starts_nothing_early_for_other_commands() -> None:
    out = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['oomwatch', 'inspect']; "
                          "import oomwatch.cli, oomwatch.early; print(oomwatch.early._early)"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.strip() == "None", out.stderr
