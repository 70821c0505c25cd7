"""`oomwatch agent` drains /dev/kmsg before its heavy imports; the kernel-log source takes over that pump and
the pipeline continues exactly after the saved cursor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from oomwatch.early import wants_early_start
from oomwatch.pump import KernelLogPump
from tests.conftest import REPO, SeqpacketKmsg, wait_for
from tests.test_agent import SCENARIOS, seq_of


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
    pump = KernelLogPump(reader)  # no one to emit to yet: it holds what it reads
    pump.start()
    return pump


def test_the_kernel_log_source_takes_over_an_early_pump_and_skips_to_its_cursor() -> None:
    """The early pump read the whole ring from its oldest record before the agent existed; the kernel-log
    source adopts it (no second reader), hands over what it held in order, and says where the saved cursor
    is, so that the pipeline skips what was done (its side: tests/test_pipeline_replay.py)."""
    from oomwatch.events import KernelLog
    from oomwatch.model import KmsgRecord, Skipped
    from oomwatch.sources.kernellog import KernelLogSource
    from tests.replay import Replay, live_settings

    kmsg = SeqpacketKmsg()
    kmsg.send(SCENARIOS)
    pump = started_pump(kmsg)
    assert wait_for(lambda: pump.last_seq == seq_of(SCENARIOS[-1]))
    emitted: list = []
    source = KernelLogSource("/dev/kmsg", emitted.append, early_pump=pump)
    try:
        assert source.open(lambda kind: 521 if kind == "kmsg" else None) == 521
        assert source.pump is pump and source.kind == "kmsg"
        assert emitted == []  # held until the cgroups are known
        source.start()
        assert wait_for(lambda: emitted)
    finally:
        source.stop()
    seqs = [item.seq for event in emitted for item in event.items if isinstance(item, KmsgRecord)]
    assert seqs == sorted(seqs) and seqs[-1] == 604  # in kernel order, to the last OOM line ...
    last = emitted[-1].items[-1]
    assert isinstance(last, Skipped) and last.last_seq == seq_of(SCENARIOS[-1])  # ... and the rest after it
    replay = Replay(live_settings(skip_upto=521), now=30.0)
    replay.run([KernelLog(event.items, drained_at=30.0) for event in emitted])
    replay.settle()
    assert [i.victim.pid for i in replay.published] == [132, 139]
    assert replay.pipeline.view().store.kmsg_lost == 0


def test_the_cli_starts_nothing_early_for_other_commands() -> None:
    out = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['oomwatch', 'inspect']; "
                          "import oomwatch.cli, oomwatch.early; print(oomwatch.early._early)"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.strip() == "None", out.stderr
