"""Hypothesis fuzzing of the kernel-log parsers: no input raises anything but KmsgParseError, and what comes out
stays bounded. A few seconds here (the unit tier); `benchmarks/fuzz_parsers.py SECONDS` runs the same
properties for as long as asked."""

from __future__ import annotations

import io
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomwatch.parse.kmsg import (
    MAX_LINE,
    KmsgParseError,
    NotText,
    TextLogStats,
    parse_kmsg_record,
    parse_text_log,
    text_lines,
)
from oomwatch.parse.gpulog import MAX_EVIDENCE, MAX_EVIDENCE_CHARS, parse_log_tail
from oomwatch.parse.oom import parse_oom_line

# Pieces of real OOM reports and of their wrappers, so that generated lines reach deep into the parsers.
OOM_PIECES = [
    "Memory cgroup out of memory: ", "Out of memory: ", "Out of memory (oom_kill_allocating_task): ",
    "Killed process ", "Kill process ", " score ", " or sacrifice child", "OOM victim ",
    " is already exiting. Skip killing the task", " total-vm:", "kB, anon-rss:", "kB, file-rss:",
    "kB, shmem-rss:", "kB, UID:", " pgtables:", "kB oom_score_adj:", ", UID ", "oom-kill:constraint=CONSTRAINT_",
    "MEMCG", "NONE", ",nodemask=(null),cpuset=/,mems_allowed=0,", "oom_memcg=", "global_oom", ",task_memcg=",
    ",task=", ",pid=", ",uid=", "Tasks in ", " are going to be killed due to memory.oom.group set", "Task in ",
    " killed as a result of limit of ", "memory: usage ", "kB, limit ", "kB, failcnt ", "CPU: 0 PID: ",
    " Comm: ", " Not tainted", " invoked oom-killer: gfp_mask=", "0xcc0(GFP_KERNEL)", ", order=",
    ", oom_score_adj=", "oom_kill_process: ", " callbacks suppressed", "(", ")", ",", " ", "/", "\\x0a", "\n",
    "\x00", "\udcff", "-", "0", "1", "18446744073709551616", "9" * 30, "/kubepods/burstable/pod1/abc",
]
WRAPPERS = [
    "", "[  139.201253] ", "<3>[    8.5] ", "kern  :err   : [    9.1] ", "[Tue Aug 22 16:10:45 2023] ",
    "[Mon Feb 29 10:00:00 2023] ", "Aug 22 16:10:45 node kernel: ", "Feb 29 10:00:00 node kernel: ",
    "Aug 22 16:10:45  kernel: ", "2023-08-22T16:10:45+0000 node kernel: ", "2023-08-22T16:10:45.5+99:99 n kernel: ",
    "[  139.201253] node kernel: ", "<3>Aug 22 16:10:45 node kernel: [  139.2] ", "<3>1 2023-08-22T16:10:45Z n kernel - - - ",
    "6,1,139201253,-;", "6," + "9" * 25 + ",1,-;", "Tue 2023-08-22 16:10:45 CEST node kernel: ",
    "1692720645.201253 node kernel: ", "   ", "[ T1] ", "[" + "9" * 40 + ".1] ", "2023-08-22T16:10:45,1+02:00 ",
]

oom_text = st.lists(st.one_of(st.sampled_from(OOM_PIECES), st.text(max_size=8),
                              st.integers(min_value=-(10 ** 25), max_value=10 ** 25).map(str)),
                    max_size=30).map("".join)
json_line = st.fixed_dictionaries({"MESSAGE": st.one_of(oom_text, st.lists(st.integers(0, 300), max_size=40),
                                                        st.none(), st.integers()),
                                   "_TRANSPORT": st.sampled_from(["kernel", "syslog", 3]),
                                   "__REALTIME_TIMESTAMP": st.one_of(st.text(max_size=25), st.integers()),
                                   "_SOURCE_MONOTONIC_TIMESTAMP": st.text("0123456789", max_size=25),
                                   "PRIORITY": st.text(max_size=3)}).map(json.dumps)
log_line = st.one_of(
    st.tuples(st.sampled_from(WRAPPERS), oom_text).map(lambda t: t[0] + t[1]),
    json_line,
    st.text(max_size=80),
)
log_bytes = st.lists(st.one_of(log_line.map(lambda s: s.encode("utf-8", "surrogatepass")),
                               st.binary(max_size=60)), max_size=20).map(lambda ls: b"\n".join(ls))

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def oom_line_problems(text: str) -> list[str]:
    """What is wrong with the parse of one line (none expected): fields beyond what a kernel can print."""
    line = parse_oom_line(text)
    problems = []
    for name, value in line._asdict().items() if line is not None else ():
        if isinstance(value, str) and len(value) > 4096:
            problems.append(f"{name}: {len(value)} characters, more than a kernel can print")
        if isinstance(value, int) and abs(value) >= 1 << 80:
            problems.append(f"{name}: {value}")
    return problems


def kmsg_record_problems(raw: bytes) -> list[str]:
    """What is wrong with the parse of one /dev/kmsg record: a KmsgParseError is the one refusal allowed."""
    try:
        record = parse_kmsg_record(raw)
    except KmsgParseError:
        return []
    return [] if 0 <= record.seq < 1 << 64 and 0 <= record.usec < 1 << 64 else [f"seq {record.seq} usec {record.usec}"]


def text_log_problems(data: bytes) -> list[str]:
    """What is wrong with the records read from a saved log: more items than lines, unbounded text, dates a
    datetime cannot hold, and each record's OOM-line problems."""
    stats = TextLogStats()
    records = list(parse_text_log(io.BytesIO(data), stats=stats))
    problems = []
    if stats.records + stats.garbled + stats.other + stats.comments + stats.continuation > stats.lines + 1:
        problems.append(f"more items than lines: {stats}")
    for record in records:
        if len(record.text) > 2 * MAX_LINE:
            problems.append(f"a record of {len(record.text)} characters")
        if record.wall_time is not None and not -62135596800 <= record.wall_time <= 253402300800:
            problems.append(f"wall time {record.wall_time}: not a date a datetime can hold")
        problems += oom_line_problems(record.text)
    return problems


@FUZZ
@given(oom_text)
def test_oom_lines_never_raise(text: str) -> None:
    assert oom_line_problems(text) == []


@FUZZ
@given(st.one_of(st.binary(max_size=200),
                 st.tuples(st.sampled_from(WRAPPERS[14:16]), oom_text).map(lambda t: (t[0] + t[1]).encode(
                     "utf-8", "surrogatepass"))))
def test_kmsg_records_never_raise_but_a_parse_error(raw: bytes) -> None:
    assert kmsg_record_problems(raw) == []


@FUZZ
@given(log_bytes)
def test_saved_logs_never_raise(data: bytes) -> None:
    assert text_log_problems(data) == []


@FUZZ
@given(st.integers(0, 10 ** 10), st.integers(0, 999_999), oom_text.filter(lambda t: "kernel" not in t and "\n" not in t
                                                                    and not t.startswith(("[", " ["))))
def test_plain_dmesg_fast_path_reads_as_the_full_path_does(secs: int, frac: int, text: str) -> None:
    """Plain `dmesg` lines take a one-regex path; `dmesg -r` lines (same text behind `<6>`) the full one."""
    line = f"[{secs:5d}.{frac:06d}] {text}\n".encode("utf-8", "surrogatepass")
    fast = list(parse_text_log(io.BytesIO(line)))
    full = list(parse_text_log(io.BytesIO(b"<6>" + line)))
    assert [(r.text, r.usec) for r in fast] == [(r.text, r.usec) for r in full]


# What a path or a paste may start with: compression and encoding marks, binary magic, then anything.
HEADS = [b"", b"\x1f\x8b", b"\x1f\x8b\x08\x00", b"\xfd7zXZ\x00", b"BZh9", b"\x28\xb5\x2f\xfd", b"\xff\xfe",
         b"\xfe\xff", b"\xef\xbb\xbf", b"\x7fELF", b"\x00" * 8]


@FUZZ
@given(st.sampled_from(HEADS), log_bytes, st.integers(1, 70))
def test_any_bytes_are_lines_or_not_text(head: bytes, data: bytes, chunk: int) -> None:
    """Decoding never raises but NotText, and never yields a line longer than MAX_LINE, however the bytes are
    split into reads."""
    data = head + data
    stats = TextLogStats()
    try:
        lines = list(text_lines((data[i:i + chunk] for i in range(0, len(data), chunk)), stats))
    except NotText:
        return
    assert all(len(line) <= MAX_LINE and b"\x00" not in line and b"\n" not in line for line in lines)
    assert text_log_problems(b"\n".join(lines)) == []


# Pieces of the allocation failures container logs report, and of the kubelet's log formats around them.
GPU_PIECES = [
    "torch.OutOfMemoryError: ", "CUDA out of memory. Tried to allocate ", "HIP out of memory", "22.00 MiB",
    ". GPU ", "0", "7", " has a total capacity of ", " has a total capacty of ", "23.65 GiB", " of which ",
    " is free. ", "Including non-PyTorch memory, this process has ", " memory in use. ",
    "Of the allocated memory ", " is allocated by PyTorch, and ", " is reserved by PyTorch but unallocated.",
    " (GPU 0; ", " total capacity; ",
    " already allocated; ", " free; ", " reserved in total by PyTorch)", " cached)", "RuntimeError: ",
    "CUDA error: out of memory", "cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC_FAILED", "NCCL WARN ",
    "Cuda failure 'out of memory'", "Failed to CUDA calloc ", " bytes", "RESOURCE_EXHAUSTED: ",
    "Out of memory while trying to allocate ", "OOM when allocating tensor", " on /job:localhost/device:GPU:",
    "device:CPU:0 by allocator cpu", "GPU_0_bfc", "- Free memory: ", "- Requested memory: ",
    "DefaultCPUAllocator: can't allocate memory: you tried to allocate ", "numpy.core._exceptions.",
    "_ArrayMemoryError: Unable to allocate ", "MemoryError", "OutOf", "ray.exceptions.OutOfMemoryError: ",
    "FATAL ERROR: JavaScript heap out of memory", "memory space hbm", "[rank3]: ", "\x1b[31m",
    "ng1:12:34 [3] ",
    "926.", "1e999", "9" * 30, " ", ".", "\n", "\\n", "\x00", "\udcff", "Error('", "Error: ",
]
CRI_HEADS = ["", "2026-01-01T00:00:00.000000001Z stderr F ", "2026-01-01T00:00:00Z stdout P ",
             "2026-01-01T00:00:00.5+02:00 stderr F:x ", '{"log":"', "2025-11-14T08:52:38.3746210Z "]

gpu_text = st.lists(st.one_of(st.sampled_from(GPU_PIECES), st.text(max_size=6),
                              st.integers(min_value=-(10 ** 20), max_value=10 ** 20).map(str)),
                    max_size=40).map("".join)
gpu_log = st.lists(st.tuples(st.sampled_from(CRI_HEADS), gpu_text).map(lambda t: t[0] + t[1]),
                   max_size=25).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass"))


@FUZZ
@given(st.one_of(gpu_log, st.binary(max_size=400)))
def test_container_log_tails_never_raise_and_stay_bounded(data: bytes) -> None:
    found = parse_log_tail(data)
    if found is None:
        return
    assert 1 <= len(found.evidence) <= MAX_EVIDENCE
    assert all(len(line) <= MAX_EVIDENCE_CHARS for line in found.evidence)
    assert found.memory in ("gpu", "host", "unknown") and found.lines_after >= 0
    for value in (found.device, found.tried_bytes, found.total_bytes, found.free_bytes, found.allocated_bytes,
                  found.reserved_bytes, found.process_bytes):
        assert value is None or 0 <= value < 1 << 70
