"""The events file against what its path can name and what a disk can do: FIFOs, devices, symlinks and
directories are refused without blocking, a torn last line is repaired, and a full disk is one log line when it
starts failing and one when it works again, never one per incident; what could not be written is written once
writing works again (up to UNWRITTEN_KEPT lines)."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import pytest

from oomwatch.sinks.events import EventsFile
from tests.test_statefile import fill, tmpfs


def incident(n: int) -> dict:
    return {"boot_id": "b0", "kernel_seq": n, "victim": {"pid": 1000 + n}, "kind": "single", "cgroup": "/a"}


def opened_within(events: EventsFile, seconds: float = 5.0) -> None:
    opener = threading.Thread(target=events.open, daemon=True)
    opener.start()
    opener.join(seconds)
    assert not opener.is_alive(), "open() blocked"


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


def test_a_fifo_without_a_reader_is_refused_at_once(tmp_path: Path, caplog) -> None:
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo)
    events = EventsFile(str(fifo))
    with caplog.at_level(logging.ERROR):
        opened_within(events)
        assert events.catch_up([incident(n) for n in range(3)]) == 0
    events.close()
    assert "a FIFO" in events.failing and events.errors == 3
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1


@pytest.mark.parametrize("device", ["/dev/null", "/dev/full", "/dev/zero"])
def test_a_device_is_refused(device: str) -> None:
    events = EventsFile(device)
    opened_within(events)
    assert not events.write(incident(1))
    events.close()
    assert "a character device, not a regular file" in events.failing and events.errors == 1


def test_a_directory_is_refused(tmp_path: Path) -> None:
    events = EventsFile(str(tmp_path))
    events.open()
    assert not events.write(incident(1))
    events.close()
    assert str(tmp_path) in events.failing and events.errors == 1


def test_a_symlink_is_not_followed(tmp_path: Path) -> None:
    decoy = tmp_path / "decoy"
    decoy.write_text("precious\n")
    link = tmp_path / "events.jsonl"
    link.symlink_to(decoy)
    events = EventsFile(str(link))
    events.open()
    assert not events.write(incident(1))
    events.close()
    assert decoy.read_text() == "precious\n"
    assert "symlink" in events.failing and events.errors == 1


def test_a_torn_last_line_gets_its_newline_before_the_next(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(json.dumps(incident(1)).encode() + b"\n" + b'{"boot_id":"b0","kernel_se')  # crash mid-line
    events = EventsFile(str(path))
    events.open()
    assert events.catch_up([incident(1), incident(2)]) == 1  # 1 is in the file: not written again
    events.close()
    written = lines(path)
    assert written[1] == b'{"boot_id":"b0","kernel_se'  # the torn line stays as it was, on its own
    assert [json.loads(line)["kernel_seq"] for line in written[0:1] + written[2:-1]] == [1, 2]
    assert written[-1] == b""


def test_stdout_is_still_allowed(capsys) -> None:
    events = EventsFile("-")
    events.open()
    assert events.write(incident(1))
    events.close()
    assert json.loads(capsys.readouterr().out)["kernel_seq"] == 1


def test_a_full_disk_is_one_line_when_it_fails_and_one_when_it_works_again(tmp_path: Path, caplog) -> None:
    with tmpfs(tmp_path / "small", size="64k") as root:
        path = root / "events.jsonl"
        events = EventsFile(str(path))
        events.open()
        assert events.write(incident(0))  # the file's last page has room left, as a real file's does
        fill(root / "filler")
        with caplog.at_level(logging.INFO):
            written = events.catch_up([incident(n) for n in range(1, 201)])
            assert 0 < written < 200 and events.errors == 200 - written and events.failing
            assert "No space left on device" in events.failing
            os.unlink(root / "filler")
            # What could not be written is written first, once, before the next incident.
            events.catch_up([incident(n) for n in range(1, 202)])
        events.close()
        messages = [(r.levelno, r.getMessage()) for r in caplog.records]
        assert [level for level, _ in messages] == [logging.ERROR, logging.WARNING], messages
        assert "writing again" in messages[1][1] and events.failing is None
        parsed = []
        for line in lines(path):
            try:
                parsed.append(json.loads(line)["kernel_seq"])
            except ValueError:
                assert line == b"" or not line.endswith(b"}")  # the one line the disk cut short, or the end
        assert sorted(parsed) == list(range(202))  # every incident on a line of its own, once
        assert events.dropped == 0


def test_a_file_that_cannot_be_created_is_retried_and_said_once(tmp_path: Path, caplog) -> None:
    path = tmp_path / "missing-dir" / "events.jsonl"
    events = EventsFile(str(path))
    with caplog.at_level(logging.INFO):
        events.open()
        assert not events.write(incident(1)) and not events.write(incident(2))
        path.parent.mkdir()
        assert events.write(incident(3))
    events.close()
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.WARNING]
    assert [json.loads(line)["kernel_seq"] for line in lines(path) if line] == [1, 2, 3]  # kept ones first
    assert events.errors == 2


def test_lines_kept_while_failing_are_bounded_oldest_dropped(tmp_path: Path, monkeypatch) -> None:
    import oomwatch.sinks.events as events_module

    monkeypatch.setattr(events_module, "UNWRITTEN_KEPT", 5)
    path = tmp_path / "missing-dir" / "events.jsonl"
    events = EventsFile(str(path))
    events.open()
    for n in range(12):
        assert not events.write(incident(n))
    path.parent.mkdir()
    assert events.write(incident(12))
    events.close()
    assert [json.loads(line)["kernel_seq"] for line in lines(path) if line] == [7, 8, 9, 10, 11, 12]
    assert (events.errors, events.dropped) == (12, 7)


def test_the_keys_it_remembers_are_bounded_whatever_is_replayed_through_it(tmp_path: Path) -> None:
    """Issue 31 item 3: a replay of 200k kills with an events file remembered 200k keys (about 130 bytes each,
    for as long as the agent ran). It remembers the last WRITTEN_KEYS_KEPT: what it holds after 3x that many
    lines is what it held after that many, and a recent line is still not written twice."""
    import tracemalloc

    from oomwatch.model import incident_key_of_json
    from oomwatch.sinks.events import WRITTEN_KEYS_KEPT

    path = tmp_path / "events.jsonl"
    events = EventsFile(str(path))
    events.open()

    def write(first: int, count: int) -> None:
        for n in range(first, first + count):
            data = incident(n)
            events.write(data, incident_key_of_json(data))

    tracemalloc.start()
    try:
        write(0, WRITTEN_KEYS_KEPT)
        held_at_the_bound = tracemalloc.get_traced_memory()[0]
        write(WRITTEN_KEYS_KEPT, 2 * WRITTEN_KEYS_KEPT)
        held_after_three_times = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # before: three times as much (about 130 bytes a key, every key kept)
    assert held_after_three_times < 1.5 * held_at_the_bound, (held_at_the_bound, held_after_three_times)
    recent = incident(3 * WRITTEN_KEYS_KEPT - 1)
    assert events.catch_up([recent]) == 0  # remembered: not written again
    assert len(lines(path)) == 3 * WRITTEN_KEYS_KEPT + 1  # (the last split: the file ends in a newline)
    events.close()
