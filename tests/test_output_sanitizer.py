"""Issue 31, finding 5: a name a tenant chose (a process's comm, a cgroup) reaches a person's terminal, `kubectl
describe`, journalctl and the agent's log shown, never sent: every output goes through oomwatch.textsafe after
the kernel log's `\\xNN` escapes were decoded. The kernel log here is a real capture (linux-6.1-systemd-units)
with the killed process renamed as an attacker would: an OSC title sequence, a C1 CSI, a bidi override, and a
cgroup name carrying an OSC 52 clipboard write, escaped as /dev/kmsg escapes them."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from oomwatch.cli import log_handler, main
from oomwatch.sinks.journal import journal_entries
from oomwatch.textsafe import terminal_text, visible, visible_data, visible_lines
from tests.conftest import CAPTURES
from tests.test_journal_sink import service, units  # noqa: F401 - fixtures

# What no output a person reads may hold: C0 (but newline), DEL, C1, bidi controls, line separators.
SENT = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
SGR = re.compile("\x1b\\[[0-9;]*m")

# The process name (15 bytes at most, as the kernel keeps it) and a cgroup name, as /dev/kmsg writes them.
COMM = rb"\x1b]0;PWNED\x07\xc2\x9b\xe2\x80\xae"  # ESC ] 0 ; PWNED BEL, U+009B (CSI), U+202E
UNIT = rb"oomtest-hog\x1b]52;c;cHduZWQ=\x07.service"


def hostile_log(tmp_path: Path) -> Path:
    text = (CAPTURES / "linux-6.1-systemd-units.kmsg").read_bytes()
    text = re.sub(rb"(?<=[ =(])dd(?=[ ,)\n])", lambda m: COMM, text)
    text = text.replace(b"oomtest-hog.service", UNIT)
    path = tmp_path / "hostile.kmsg"
    path.write_bytes(text)
    return path


def inspect(*args: str):
    return CliRunner().invoke(main, ["inspect", *args], catch_exceptions=False)


@pytest.mark.parametrize("color", ["--no-color", "--color"])
def test_inspect_shows_a_hostile_comm_and_cgroup_and_sends_no_control_character(tmp_path: Path, color: str) -> None:
    result = inspect("--kmsg", str(hostile_log(tmp_path)), "--boot-time", "2026-01-01T00:00:00", color)
    assert result.exit_code == 0, result.output
    text = SGR.sub("", result.stdout) if color == "--color" else result.stdout
    assert "\x1b" not in text and not SENT.search(text), ascii(text)
    # Shown, as the kernel log writes the bytes, so a person sees what the process is called.
    assert "\\x1b]0;PWNED\\x07\\x9b\\u202e" in text
    assert "oomtest-hog\\x1b]52;c;cHduZWQ=\\x07.service" in text
    if color == "--color":
        assert SGR.search(result.stdout)  # the report's own colour is kept


def test_inspect_json_escapes_them_as_json_does(tmp_path: Path) -> None:
    result = inspect("--kmsg", str(hostile_log(tmp_path)), "--boot-time", "2026-01-01T00:00:00", "--json")
    assert result.exit_code == 0
    assert not SENT.search(result.stdout)
    comms = {p["comm"] for i in json.loads(result.stdout)["incidents"] for p in i["killed"]}
    assert "\x1b]0;PWNED\x07\x9b\u202e" in comms  # the data itself is the process's name, decoded


def test_inspect_job_shows_them_too(tmp_path: Path) -> None:
    kills = json.loads(inspect("--kmsg", str(hostile_log(tmp_path)), "--boot-time", "2026-01-01T00:00:00",
                               "--json").stdout)["incidents"]
    for incident in kills:
        incident["workload"]["slurm_job"] = "\x1b]0;job\x07"
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(i) + "\n" for i in kills))
    result = inspect("--cgroup-root", str(tmp_path), "--job", "\x1b]0;job\x07", "--incidents", str(events),
                     "--no-color")
    assert result.exit_code == 0, result.output
    assert "\\x1b]0;PWNED\\x07" in result.stdout and "\\x1b]0;job\\x07" in result.stdout
    assert not SENT.search(result.stdout), ascii(result.stdout)


def test_an_unreadable_incidents_source_is_named_safely(tmp_path: Path) -> None:
    result = inspect("--cgroup-root", str(tmp_path), "--job", "x", "--incidents", str(tmp_path / "no\x1b[2Jpe"))
    assert result.exit_code == 1
    assert "no\\x1b[2Jpe" in result.output and not SENT.search(result.output)


def test_a_pod_event_message_shows_them(tmp_path: Path) -> None:
    from tests.test_k8s_events import NODE, make_incident
    from oomwatch.sinks.k8s_events import event_for_incident

    incident = make_incident()
    incident = replace(incident, explanation="Container x: \x1b]0;PWNED\x07 (pid 1)\r\nforged line \u202e")
    message = event_for_incident(incident, NODE)["message"]
    assert message == "Container x: \\x1b]0;PWNED\\x07 (pid 1)\\x0d\\x0aforged line \\u202e"


def test_a_journal_message_shows_them(service) -> None:
    odd = replace(service, explanation="killed \x1b]0;PWNED\x07\x9b\nsecond line")
    (entry,) = journal_entries(odd)
    assert dict(entry)["MESSAGE"] == "killed \\x1b]0;PWNED\\x07\\x9b\nsecond line"  # journald keeps lines


@pytest.mark.parametrize("background", [False, True])
def test_the_agents_log_lines_show_them(background: bool) -> None:
    """The agent's log handler (cli.log_handler, what `oomwatch agent` logs through: in the background)."""
    stream = io.StringIO()
    handler = log_handler(stream, background=background)
    logger = logging.getLogger("oomwatch.test_output_sanitizer")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("cgroup %s unreadable", "/user.slice/x\x1b]52;c;cHduZWQ=\x07\nWARNING forged: ok")
        try:
            raise OSError("no such file: a\x1b[2Jb")
        except OSError:
            logger.exception("read failed")
    finally:
        logger.removeHandler(handler)
        handler.close()  # (the background writer's lines all written)
    text = stream.getvalue()
    lines = text.splitlines()
    assert lines[0].split(" ", 2)[2] == "WARNING oomwatch.test_output_sanitizer: cgroup /user.slice/x\\x1b]52;c;cHduZWQ=\\x07\\x0a" \
                       "WARNING forged: ok unreadable"
    assert "no such file: a\\x1b[2Jb" in text and "Traceback" in lines[2]
    assert not SENT.search(text)


# --- the sanitizer itself ---------------------------------------------------------------------------------

def test_every_control_character_is_shown_and_nothing_else_changes() -> None:
    for code in [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x61C, 0x200E, 0x200F, 0x2028, 0x2029,
                 *range(0x202A, 0x202F), *range(0x2066, 0x206A)]:
        shown = visible(f"a{chr(code)}b")
        assert shown == (f"a\\x{code:02x}b" if code < 0x100 else f"a\\u{code:04x}b")
    assert visible("a\udcffb") == "a\\xffb"  # a byte that is not UTF-8 (surrogateescape)
    plain = "ml/train-0 trainer: dd (pid 127) — 64 MiB ✓ 日本 \\x2d"
    assert visible(plain) == visible_lines(plain) == plain
    assert visible_lines("a\n\tb\rc") == "a\n\tb\\x0dc"
    assert visible_data({"k\x1b": ["\x07", ("\x9b",), 1, None]}) == {"k\\x1b": ["\\x07", ["\\x9b"], 1, None]}
    # Each control character alone, deep in a report (json.dumps escapes C0 itself: the quick check must see it).
    for char in ["\x1b", "\n", "\t", "\r", "\x00", "\x7f", "\x9b", "\u202e"]:
        report = {"incidents": [{"killed": [{"comm": f"a{char}[31mb", "pid": 1}]}]}
        assert visible_data(report)["incidents"][0]["killed"][0]["comm"] == f"a{visible(char)}[31mb"
    plain = {"incidents": [{"comm": "dd", "path": "/sys\\x2d.slice", "size": float("inf")}]}
    assert visible_data(plain) is plain  # nothing to show: the report itself


def test_colour_keeps_only_the_renderers_sequences() -> None:
    rendered = "\x1b[1mKills\x1b[0m \x1b]0;t\x07 \x1b[2J"
    assert terminal_text(rendered, color=True) == "\x1b[1mKills\x1b[0m \\x1b]0;t\\x07 \\x1b[2J"
    assert terminal_text(rendered, color=False) == "\\x1b[1mKills\\x1b[0m \\x1b]0;t\\x07 \\x1b[2J"


def test_kernel_log_escapes_are_decoded_before_the_sanitizer(tmp_path: Path) -> None:
    """The order that failed: the escapes of /dev/kmsg were decoded after an ANSI stripper had looked for raw
    ESC bytes, so the decoded ESC got through. Here every path ends in the sanitizer, so the order cannot
    matter: the same log, saved by `dmesg --color=always` with real colour around it, shows the same."""
    path = hostile_log(tmp_path)
    coloured = tmp_path / "coloured.kmsg"
    coloured.write_bytes(path.read_bytes().replace(b"Killed process", b"\x1b[31mKilled process\x1b[0m"))
    for log in (path, coloured):
        out = inspect("--kmsg", str(log), "--boot-time", "2026-01-01T00:00:00", "--no-color").stdout
        assert "\\x1b]0;PWNED\\x07" in out and not SENT.search(out)


def test_a_traceback_another_handler_formatted_first_is_shown_not_sent() -> None:
    """logging caches a record's traceback text (exc_text) for every handler it reaches: the agent's formatter
    shows its own, never the raw text another formatter left there."""
    try:
        raise OSError("no such file: a\x1b[2Jb")
    except OSError:
        record = logging.LogRecord("oomwatch", logging.ERROR, __file__, 1, "read failed", None, sys.exc_info())
    logging.Formatter().format(record)  # another handler's formatter first: exc_text holds the raw text
    assert "\x1b" in record.exc_text
    text = log_handler(io.StringIO()).formatter.format(record)
    assert "no such file: a\\x1b[2Jb" in text and not SENT.search(text)
