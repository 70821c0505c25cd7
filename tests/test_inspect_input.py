"""What `inspect --kmsg` may be handed besides a kernel log, and how each is read or refused (issue 19 item
10, issue 20 items 1, 5 and 8): devices, FIFOs, directories, sockets, compressed and UTF-16 text, NULs, CRLF,
binaries, empty input; and output that no terminal width or checkout path can break."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from oomwatch.cli import main
from oomwatch.config import Config
from oomwatch.inspect import build_report, render_text
from oomwatch.parse.kmsg import MAX_LINE, NotText, TextLogStats, text_lines
from oomwatch.sources.kmsg import (
    LIVE_KMSG,
    SAVED,
    SYSLOG,
    KmsgUnavailable,
    NotAKernelLog,
    kernel_log_kind,
    read_saved_log,
    saved_log_chunks,
    saved_log_verdict,
)
from tests.conftest import BOOT_TIME, CAPTURES

GROUP_419 = CAPTURES / "documented-4.19-memcg-group.dmesg"
# The group kill of GROUP_419: three processes killed in one incident.
GROUP_KILLED = ["python3(5125)", "sleep(5122)", "sleep(5123)"]


def inspect_cli(*args: str, input: bytes | None = None):
    return CliRunner().invoke(main, ["inspect", *args], input=input)


def kills_of(path_or_dash: str, input: bytes | None = None) -> list[list[str]]:
    """The incidents `inspect --json` finds, each as its killed processes."""
    import json

    result = inspect_cli("--kmsg", path_or_dash, "--json", "--boot-time", "2026-01-01T00:00:00", input=input)
    assert result.exit_code == 0, result.output
    return [[f"{p['comm']}({p['pid']})" for p in inc["killed"]] for inc in json.loads(result.stdout)["incidents"]]


# --- what --kmsg names: one decision --------------------------------------------------------------------------

def test_kernel_log_kind_decides_live_syslog_and_saved(tmp_path: Path) -> None:
    assert kernel_log_kind("-") == SAVED
    assert kernel_log_kind("syslog") == SYSLOG
    assert kernel_log_kind(str(GROUP_419)) == SAVED
    assert kernel_log_kind("/dev/no-such-kmsg") == LIVE_KMSG  # opening it says why it cannot be read
    assert kernel_log_kind(str(tmp_path / "no-such-file")) == SAVED
    # Only the kernel's own device (1:11) is the live log; every other device is a path to refuse.
    assert kernel_log_kind("/dev/null") == SAVED and kernel_log_kind("/dev/zero") == SAVED

    class Stat:
        st_mode = 0o020600  # a character device
        st_rdev = os.makedev(1, 11)

    assert kernel_log_kind("/somewhere/kmsg", stat_fn=lambda p: Stat) == LIVE_KMSG


# --- paths that are no log ----------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_character_devices_other_than_kmsg_are_refused_at_once(device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    started = time.monotonic()
    result = inspect_cli("--kmsg", device)
    assert result.exit_code == 1
    assert f"{device} is a character device" in result.stderr and "/dev/kmsg" in result.stderr
    assert time.monotonic() - started < 5  # not read until memory runs out


def test_a_silent_fifo_is_refused_after_a_timeout(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(KmsgUnavailable, match="is a FIFO and nothing was written to it in 0.2 s"):
        list(read_saved_log(str(fifo), idle_timeout=0.2))
    assert time.monotonic() - started < 3


def test_a_fifo_with_a_writer_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(GROUP_419.read_bytes())

    writer = threading.Thread(target=write)
    writer.start()
    stats = TextLogStats()
    records = [r for r in read_saved_log(str(fifo), stats=stats, idle_timeout=5.0)]
    writer.join()
    assert stats.records == len(records) == 11


def test_a_directory_and_a_socket_are_refused(tmp_path: Path) -> None:
    result = inspect_cli("--kmsg", str(tmp_path))
    assert result.exit_code == 1 and f"{tmp_path} is a directory" in result.stderr
    path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    try:
        result = inspect_cli("--kmsg", str(path))
        assert result.exit_code == 1 and f"{path} is a socket" in result.stderr
    finally:
        server.close()


def test_a_binary_is_not_a_kernel_log(tmp_path: Path) -> None:
    """`--kmsg /bin/ls` read 486 "kernel records" and exited 0."""
    binary = Path("/bin/ls")
    if not binary.exists():
        pytest.skip("no /bin/ls")
    result = inspect_cli("--kmsg", str(binary))
    assert result.exit_code == 1
    assert "/bin/ls holds binary data (an ELF executable)" in result.stderr and "not a kernel log" in result.stderr
    random = tmp_path / "random"
    random.write_bytes(os.urandom(20000))
    with pytest.raises(NotAKernelLog, match="binary data"):
        list(read_saved_log(str(random)))


def test_verdicts_on_logs_that_hold_nothing() -> None:
    assert saved_log_verdict("-", TextLogStats()) == "standard input is empty"
    said = saved_log_verdict("x.log", TextLogStats(notice="No journal files were found."))
    # journalctl found no journal where it looked: not a permission problem
    assert said is not None and "there is no journal" in said and "as root" not in said
    assert saved_log_verdict("x.log", TextLogStats(lines=3, records=3)) is None


# --- text in every shape -------------------------------------------------------------------------------

@pytest.mark.parametrize("name,pack", [
    ("gzip", gzip.compress),
    ("gzip, two members", lambda data: gzip.compress(data[:300]) + gzip.compress(data[300:])),
    ("xz", lzma.compress),
    ("bzip2", bz2.compress),
])
def test_compressed_logs_are_read(tmp_path: Path, name: str, pack) -> None:
    path = tmp_path / "log.gz"
    path.write_bytes(pack(GROUP_419.read_bytes()))
    assert kills_of(str(path)) == [GROUP_KILLED]
    assert kills_of("-", input=path.read_bytes()) == [GROUP_KILLED]


def test_a_compressed_log_says_it_was_decompressed(tmp_path: Path) -> None:
    path = tmp_path / "log.gz"
    path.write_bytes(gzip.compress(GROUP_419.read_bytes()))
    report = build_report(Config(kmsg=str(path), boot_time=BOOT_TIME), node_view=False, clock=lambda: 0.0)
    assert report["kmsg"]["text"]["decoded"] == ["gzip"]
    assert "decompressed (gzip)" in render_text(report)


def test_zstd_and_corrupt_gzip_are_said_not_read() -> None:
    with pytest.raises(NotText, match="zstd"):
        list(text_lines([b"\x28\xb5\x2f\xfd" + b"\x00" * 20], TextLogStats()))
    with pytest.raises(NotText, match="gzip data that cannot be decompressed"):
        list(text_lines([b"\x1f\x8b\x08\x00" + b"garbage" * 10], TextLogStats()))


@pytest.mark.parametrize("name,encode", [
    ("NUL at the end of every line", lambda text: text.replace(b"\n", b"\x00\n")),
    ("CRLF", lambda text: text.replace(b"\n", b"\r\n")),
    ("CR alone", lambda text: text.replace(b"\n", b"\r")),
    ("UTF-16LE with BOM", lambda text: text.decode().encode("utf-16")),
    ("UTF-16LE without BOM", lambda text: text.decode().encode("utf-16-le")),
    ("UTF-16BE with BOM", lambda text: b"\xfe\xff" + text.decode().encode("utf-16-be")),
    ("UTF-8 BOM", lambda text: b"\xef\xbb\xbf" + text),
])
def test_every_encoding_of_the_same_log_gives_the_same_group_kill(name: str, encode) -> None:
    """A NUL at the end of every line turned this one group kill into three single kills."""
    assert kills_of("-", input=encode(GROUP_419.read_bytes())) == [GROUP_KILLED]


def test_a_huge_single_line_is_cut_not_held() -> None:
    stats = TextLogStats()
    chunks = (b"x" * 65536 for _ in range(200))  # 13 MB without a newline
    lines = list(text_lines(chunks, stats))
    assert [len(line) for line in lines] == [MAX_LINE] and stats.truncated == 1


def test_lines_split_across_chunks_are_whole() -> None:
    data = GROUP_419.read_bytes()
    stats = TextLogStats()
    lines = list(text_lines((data[i:i + 7] for i in range(0, len(data), 7)), stats))
    assert lines == data.split(b"\n")[:-1]  # the file ends with a newline


# --- output no terminal or checkout path can break ------------------------------------------------------------

@pytest.mark.parametrize("width", [40, 60, 80, 100])
def test_paths_and_names_are_never_broken_across_lines(tmp_path: Path, width: int) -> None:
    """A checkout under a long, hyphenated path wrapped the log's name at a hyphen."""
    deep = tmp_path / "home-alice-src" / "oomwatch-checkout-with-a-long-name" / "fixtures-kmsg"
    deep.mkdir(parents=True)
    log = deep / "documented-4.19-memcg-group with space.dmesg"
    log.write_bytes(GROUP_419.read_bytes())
    report = build_report(Config(kmsg=str(log), boot_time=BOOT_TIME), node_view=False, clock=lambda: 0.0)
    text = render_text(report, width=width)
    assert any(str(log) in line for line in text.splitlines())
    assert f"kernel log: {log}: 12 lines read, 11 kernel records" in " ".join(text.split())


def test_names_with_spaces_and_commands_stay_on_one_line() -> None:
    from oomwatch.inspect import _wrap

    text = ("ml/train-0 trainer: python3 (pid 5125) pushed the container past its 64 MiB limit; run "
            "`journalctl -k -b -1 | oomwatch inspect --kmsg -` for the previous boot")
    for width in range(20, 120, 7):
        lines = _wrap(text, width, keep=["ml/train-0 trainer"])
        assert any("ml/train-0 trainer" in line for line in lines), width
        assert any("`journalctl -k -b -1 | oomwatch inspect --kmsg -`" in line for line in lines), width
        assert " ".join(" ".join(lines).split()) == text


def test_help_says_what_is_refused_and_decoded() -> None:
    out = " ".join(inspect_cli("--help").stdout.split())
    assert "a device other than /dev/kmsg" in out and "gzip, xz and bzip2 logs are decompressed" in out


def test_standard_input_from_a_device_is_refused(monkeypatch) -> None:
    """`inspect --kmsg - < /dev/zero` read NULs for ever."""
    import io

    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    with open("/dev/zero", "rb") as zero:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(zero))
        with pytest.raises(NotAKernelLog, match=r"standard input is a character device \(1:5\)"):
            list(read_saved_log("-"))


def test_the_live_opener_refuses_a_path_that_is_no_live_log() -> None:
    """open_kernel_log, shared by the agent, inspect and the early reader, would have read /dev/zero as
    /dev/kmsg for ever."""
    from oomwatch.sources.kmsg import open_kernel_log

    with pytest.raises(NotAKernelLog, match="/dev/zero is not the live kernel log"):
        open_kernel_log("/dev/zero")


def test_a_coloured_dmesg_gives_the_same_group_kill() -> None:
    """`dmesg --color=always` (or a terminal captured with `script`): colour sequences around the time stamp
    and the text before its first colon hid every OOM line."""
    coloured = b"".join(
        (b"\x1b[32m" + line[:line.index(b"]") + 1] + b"\x1b[0m \x1b[33m" + line[line.index(b"]") + 2:]
         .replace(b":", b"\x1b[0m:", 1) + b"\n") if line.startswith(b"[") else line + b"\n"
        for line in GROUP_419.read_bytes().splitlines())
    assert b"\x1b[" in coloured
    assert kills_of("-", input=coloured) == [GROUP_KILLED]


@pytest.mark.parametrize("data,said", [
    (b"LPKSHHRH" + bytes(200), "a systemd journal file (read it with journalctl --file)"),
    (b"PK\x03\x04" + bytes(200), "a zip archive"),
    (b"%PDF-1.7\n" + bytes(range(256)) * 4, "a PDF"),
])
def test_binary_files_are_named(data: bytes, said: str) -> None:
    with pytest.raises(NotText, match=said.replace("(", r"\(").replace(")", r"\)")):
        list(text_lines([data], TextLogStats()))


@pytest.mark.parametrize("chunk", [7, 4096, 1 << 20])
def test_lines_around_the_cut_are_exact_whatever_the_reads(chunk: int) -> None:
    lengths = [0, 5, MAX_LINE - 1, MAX_LINE, MAX_LINE + 1, 2 * MAX_LINE + 3, 1]
    data = b"\n".join(b"x" * n for n in lengths)  # the last line without its newline
    stats = TextLogStats()
    lines = list(text_lines((data[i:i + chunk] for i in range(0, len(data), chunk)), stats))
    assert [len(line) for line in lines] == [min(n, MAX_LINE) for n in lengths]
    assert stats.truncated == 2


def test_a_pipe_named_by_its_descriptor_is_waited_on_a_fifo_after_its_first_bytes_too(tmp_path: Path) -> None:
    """`--kmsg <(journalctl -k -b -1)`: the writer of a pipe exists from the start, and journalctl may take
    longer than the FIFO timeout before its first line; so may a FIFO's writer between two writes."""
    r, w = os.pipe()
    data = GROUP_419.read_bytes()

    def slow_writer(fd: int) -> None:
        time.sleep(0.4)
        os.write(fd, data[:100])
        time.sleep(0.4)
        os.write(fd, data[100:])
        os.close(fd)

    writer = threading.Thread(target=slow_writer, args=(w,))
    writer.start()
    try:
        stats = TextLogStats()
        records = list(read_saved_log(f"/dev/fd/{r}", stats=stats, idle_timeout=0.2))
    finally:
        writer.join()
        os.close(r)
    assert stats.records == len(records) == 11
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def fifo_writer() -> None:
        with open(fifo, "wb") as f:
            f.write(data[:100])
            f.flush()
            time.sleep(0.4)
            f.write(data[100:])

    writer = threading.Thread(target=fifo_writer)
    writer.start()
    stats = TextLogStats()
    records = list(read_saved_log(str(fifo), stats=stats, idle_timeout=0.2))
    writer.join()
    assert stats.records == len(records) == 11


def test_a_dev_kmsg_that_is_another_device_says_to_use_syslog(monkeypatch) -> None:
    """kind and k3d nodes make /dev/kmsg a link to /dev/console: it must not be read as the kernel log, and the
    refusal names the way out."""
    real_open = os.open

    def open_console_as_kmsg(path, *args, **kwargs):
        return real_open("/dev/null" if path == "/dev/kmsg" else path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_console_as_kmsg)
    with pytest.raises(NotAKernelLog, match="/dev/kmsg is a character device .*use --kmsg syslog"):
        list(saved_log_chunks("/dev/kmsg"))


def test_a_saved_log_that_may_not_be_read_is_not_blamed_on_cap_syslog() -> None:
    import errno

    from oomwatch.sources.kmsg import explain_saved_open_error

    said = explain_saved_open_error("/root/kern.log", PermissionError(errno.EACCES, "Permission denied"))
    assert said.startswith("/root/kern.log: permission denied") and "CAP_SYSLOG" not in said
    assert explain_saved_open_error("/x.log", FileNotFoundError(errno.ENOENT, "x")) == "/x.log does not exist"
