"""The container-log parser on real text: tracebacks and log lines pasted into public GitHub threads
(fixtures/gpulogs/SOURCES.md names each thread), as pasted and as the kubelet writes them (CRI, docker
json-file), and the lines that must give nothing. Bounded: only the end of a log is read, lines are capped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

from oomwatch.parse.gpulog import (
    GPU,
    HOST,
    MAX_EVIDENCE,
    MAX_EVIDENCE_CHARS,
    MAX_LINE,
    MAX_LINES,
    MAX_TAIL_BYTES,
    UNKNOWN,
    LogFinding,
    log_lines,
    parse_log_tail,
    size_bytes,
)

GPULOGS = Path(__file__).resolve().parents[1] / "fixtures" / "gpulogs"
GiB, MiB = 1 << 30, 1 << 20

# file → (memory, kind, device, tried, total, free, allocated, reserved, process, lines_after); sizes as
# printed.
CASES: dict[str, tuple] = {
    "pytorch-16417-torch2.2-cuda-oom.txt": (
        GPU, "cuda-oom", 0, 22.00 * MiB, 23.65 * GiB, 11.06 * MiB, 22.90 * GiB, 22.90 * GiB + 194.87 * MiB,
        23.60 * GiB, 0),
    "pytorch-16417-title-1.0-cached.txt": (
        GPU, "cuda-oom", 0, 12.50 * MiB, 10.92 * GiB, 9.28 * GiB, 8.57 * MiB, 4.68 * MiB, None, 0),
    "pytorch-67680-1.10-reserved.txt": (
        GPU, "cuda-oom", 0, 24.00 * MiB, 6.00 * GiB, 0, 4.26 * GiB, 4.30 * GiB, None, 0),
    "mgfn-35-torch2.1-capacty.txt": (
        GPU, "cuda-oom", 0, 1.70 * GiB, 6.00 * GiB, 0, 2.93 * GiB, 2.93 * GiB + 2.30 * GiB, None, 0),
    "d8ahazard-657-torch2.0-then-more-output.txt": (
        GPU, "cuda-oom", 0, 30.00 * MiB, 8.00 * GiB, 0, 7.08 * GiB, 7.28 * GiB, None, 8),
    "sentence-transformers-3214-optuna-caught.txt": (
        GPU, "cuda-oom", 0, 54.00 * MiB, 44.52 * GiB, 48.25 * MiB, None, None, None, 10),
    "pytorch-175431-hip-gpu7.txt": (
        GPU, "hip-oom", 7, 2.00 * MiB, 287.98 * GiB, 203.49 * GiB, 68.63 * GiB, 68.63 * GiB + 14.93 * GiB,
        None, 0),
    "pytorch-175431-hip-gpu7.cri.log": (
        GPU, "hip-oom", 7, 2.00 * MiB, 287.98 * GiB, 203.49 * GiB, 68.63 * GiB, 68.63 * GiB + 14.93 * GiB,
        None, 0),
    "therock-2118-hip-actions-timestamps.txt": (
        GPU, "hip-oom", 0, 2.00 * MiB, 287.98 * GiB, 275.86 * GiB, 1017.01 * MiB, 1017.01 * MiB + 54.99 * MiB,
        None, 0),
    "trl-4237-ci-torch-oom-processes.txt": (
        GPU, "cuda-oom", 0, 2.11 * GiB, 14.74 * GiB, 1.65 * GiB, 4.50 * GiB, 4.50 * GiB + 2.14 * GiB,
        None, 0),
    "pytorch-16417-torch2.2-cuda-oom.split.cri.log": (
        GPU, "cuda-oom", 0, 22.00 * MiB, 23.65 * GiB, 11.06 * MiB, 22.90 * GiB, 22.90 * GiB + 194.87 * MiB,
        23.60 * GiB, 0),
    "jax-13428-xla-resource-exhausted.txt": (UNKNOWN, "xla", None, 6291456, None, None, None, None, None, 19),
    # Captured on an H100 (fixtures/gpulogs/SOURCES.md): PyTorch 2.11, jaxlib 0.11 (its size in GiB, its
    # allocator named in the message), CuPy 14.
    "h100-torch-2.11-cuda-oom.txt": (
        GPU, "cuda-oom", 0, 200.00 * GiB, 79.18 * GiB, 78.66 * GiB, 0, 0, 518.00 * MiB, 0),
    "h100-torch-2.11-cuda-oom-filled.txt": (
        GPU, "cuda-oom", 0, 4.00 * GiB, 79.18 * GiB, 2.66 * GiB, 76.00 * GiB, 76.00 * GiB, 76.51 * GiB, 0),
    "h100-jax-0.11-xla-resource-exhausted.txt": (GPU, "xla", 0, 200 * GiB, None, None, None, None, None, 0),
    "h100-cupy-14-outofmemoryerror.txt": (GPU, "cupy", None, 200 * GiB, None, None, 0, None, None, 0),
    "colabfold-65-jax-runtimeerror.txt": (UNKNOWN, "xla", None, 14285187448, None, None, None, None, None, 0),
    "jax-4994-arm-cpu-resource-exhausted.txt": (UNKNOWN, "xla", None, 24, None, None, None, None, None, 0),
    "tensorflow-models-5527-gpu0-bfc.txt": (GPU, "tensorflow", 0, None, None, None, None, None, None, 2),
    "keras-9643-gpu1-bfc.txt": (GPU, "tensorflow", 1, None, None, None, None, None, None, 1),
    "darkflow-873-tensorflow-cpu.txt": (HOST, "tensorflow", None, None, None, None, None, None, None, 2),
    "qwen3-873-cublas-alloc-failed.txt": (GPU, "cublas", None, None, None, None, None, None, None, 0),
    "wan2gp-1083-accelerator-error.txt": (GPU, "cuda-error", None, None, None, None, None, None, None, 11),
    "comfyui-12366-cudaerrormemoryallocation.txt": (
        GPU, "cuda-error", None, None, None, None, None, None, None, 0),
    "xgboost-8484-cuda-alloc-free-requested.txt": (
        GPU, "cuda-error", None, 33554432, None, 8126464, None, None, None, 11),
    "xgboost-11684-dask-escaped-newlines.txt": (
        GPU, "cuda-error", None, 64 * 10 ** 9, None, 53.1098 * 10 ** 9, None, None, None, 0),
    "nccl-1235-cuda-calloc.txt": (GPU, "nccl", 3, 6291456, None, None, None, None, None, 5),
    "nccl-1235-cuda-calloc.cri.log": (GPU, "nccl", 3, 6291456, None, None, None, None, None, 5),
    # The host's memory: the process's own allocation failed (or its runtime's heap limit), nothing was
    # killed.
    "vrt-49-defaultcpuallocator.txt": (
        HOST, "cpu-allocator", None, 116813856768, None, None, None, None, None, 0),
    "pytorch-31302-posix-memalign.txt": (HOST, "cpu-allocator", None, None, None, None, None, None, None, 0),
    "keypointfusion-3-numpy-arraymemoryerror.txt": (
        HOST, "python-memoryerror", None, 58.0 * GiB, None, None, None, None, None, 0),
    "single-cell-tutorial-85-numpy-memoryerror.txt": (
        HOST, "python-memoryerror", None, 926 * GiB, None, None, None, None, None, 0),
    "node-oom-tester-js-heap.txt": (HOST, "js-heap", None, None, None, None, None, None, None, 0),
    "ray-docs-driver-outofmemoryerror.txt": (
        HOST, "ray-memory-monitor", None, None, None, None, None, None, None, 2),
}
NOTHING = ["paddleslim-865-avoid-out-of-memory.txt", "icefall-343-sanity-check-info.txt",
           "diffusion-pipe-10-nccl-unknown-error.txt"]
FIELDS = ("device", "tried_bytes", "total_bytes", "free_bytes", "allocated_bytes", "reserved_bytes",
          "process_bytes")


def read(name: str) -> bytes:
    return (GPULOGS / name).read_bytes()


def check(found: Optional[LogFinding], expected: tuple) -> None:
    assert found is not None
    memory, kind, *numbers, lines_after = expected
    assert (found.memory, found.kind, found.lines_after) == (memory, kind, lines_after)
    for field, want in zip(FIELDS, numbers):
        got = getattr(found, field)
        if want is None or field == "device":
            assert got == want, field
        else:  # the message prints 2 decimals: a byte count within a rounding of it
            assert got is not None and abs(got - want) <= max(1.0, want * 1e-6), (field, got, want)
    assert 1 <= len(found.evidence) <= MAX_EVIDENCE and all(found.evidence)


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_log_tails(name: str) -> None:
    found = parse_log_tail(read(name))
    assert found is not None, "each of these logs reports a failed allocation"
    check(found, CASES[name])


@pytest.mark.parametrize("name", NOTHING)
def test_logs_that_report_no_failed_allocation(name: str) -> None:
    """`out of memory` in a sentence, a check for OOM that found none, a CUDA failure that is not memory."""
    assert parse_log_tail(read(name)) is None


def cri(text: str, stream: str = "stderr", piece: Optional[int] = None) -> bytes:
    """The kubelet's CRI log format, a line longer than `piece` split into P pieces and a last F."""
    out = []
    for n, line in enumerate(text.split("\n")):
        stamp = f"2026-01-01T00:00:{n % 60:02d}.{n:09d}Z"
        pieces = [line[i:i + piece] for i in range(0, len(line), piece)] if piece and line else [line]
        out += [f"{stamp} {stream} {'F' if k == len(pieces) - 1 else 'P'} {p}" for k, p in enumerate(pieces)]
    return ("\n".join(out) + "\n").encode()


def json_file(text: str) -> bytes:
    """docker's json-file driver (cri-dockerd's logs), a long line in 16 KiB records without their newline."""
    out = []
    for line in text.split("\n"):
        out.append(json.dumps({"log": line + "\n", "stream": "stderr", "time": "2026-01-01T00:00:00.5Z"}))
    return ("\n".join(out) + "\n").encode()


@pytest.mark.parametrize("name", sorted(n for n in CASES if n.endswith(".txt")) + NOTHING)
@pytest.mark.parametrize("wrap", ["cri", "cri-pieces", "json-file"])
def test_the_kubelets_formats_read_as_the_pasted_text(name: str, wrap: str) -> None:
    text = read(name).decode()
    data = {"cri": lambda: cri(text), "cri-pieces": lambda: cri(text, piece=37),
            "json-file": lambda: json_file(text)}
    plain, wrapped = parse_log_tail(text), parse_log_tail(data[wrap]())
    if plain is None:
        assert wrapped is None
        return
    assert wrapped is not None and wrapped.time is not None
    assert wrapped.evidence == plain.evidence
    assert {k: v for k, v in wrapped.to_json().items() if k != "time"} == plain.to_json()


def test_cri_pieces_of_a_line_are_joined_and_timestamps_kept() -> None:
    stamp = b"2026-01-01T00:00:00.000000001Z"
    data = (stamp + b" stderr P torch.OutOfMemoryError: CUDA out of memory. Tried to allo\n"
            + stamp + b" stderr P cate 2.00 MiB. GPU 3 has a total capacity of 79.10 GiB of \n"
            + stamp + b" stderr F which 1.00 MiB is free.\n"
            b"2026-01-01T00:00:00.100000000Z stdout F \n")
    found = parse_log_tail(data)
    assert found is not None and found.device == 3 and found.tried_bytes == 2 * MiB
    assert found.time == "2026-01-01T00:00:00.000000001Z" and found.lines_after == 0
    assert found.evidence == ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 3 "
                              "has a total capacity of 79.10 GiB of which 1.00 MiB is free.",)


def test_the_failure_nearest_the_end_is_the_one_told() -> None:
    first = read("pytorch-67680-1.10-reserved.txt").decode()
    last = read("pytorch-175431-hip-gpu7.txt").decode()
    found = parse_log_tail(first + "retrying with a smaller batch\n" + last)
    assert found is not None and (found.kind, found.device) == ("hip-oom", 7)
    # An error outranks a warning printed after it (NCCL's WARN lines while the process goes down).
    nccl = read("nccl-1235-cuda-calloc.txt").decode()
    found = parse_log_tail(last + nccl)
    assert found is not None and found.kind == "hip-oom" and found.lines_after > 0
    # The warnings alone are evidence when nothing says more.
    assert parse_log_tail(nccl).kind == "nccl"


def test_an_earlier_line_of_the_same_failure_fills_in_what_the_last_leaves_out() -> None:
    """A wrapper logs the message again without its details (autotrain's `wrapper:121 - HIP out of memory…`
    repeats it whole; a bare `RuntimeError: CUDA out of memory` does not)."""
    text = read("pytorch-16417-torch2.2-cuda-oom.txt").decode() + "RuntimeError: CUDA out of memory\n"
    found = parse_log_tail(text)
    assert found is not None and found.evidence[-1] == "RuntimeError: CUDA out of memory"
    assert found.device == 0 and found.tried_bytes == 22 * MiB and len(found.evidence) == 2


def test_xla_names_its_device_only_through_its_allocator() -> None:
    text = read("jax-13428-xla-resource-exhausted.txt").decode()
    assert parse_log_tail(text).memory == UNKNOWN
    allocator = ("2024-07-30 21:10:10.123456: W external/xla/xla/tsl/framework/bfc_allocator.cc:482] "
                 "Allocator (GPU_1_bfc) ran out of memory trying to allocate 6.00MiB (rounded to 6291456)"
                 "requested by op \n")
    found = parse_log_tail(allocator + text)
    assert (found.memory, found.device, found.tried_bytes) == (GPU, 1, 6291456)


def test_only_the_end_of_a_long_log_is_read() -> None:
    oom = read("pytorch-16417-torch2.2-cuda-oom.txt")
    filler = b"step 1234 loss 0.5\n" * (2 * MAX_TAIL_BYTES // 19)
    assert parse_log_tail(filler + oom).device == 0
    assert parse_log_tail(oom + filler) is None  # out of the window
    # A window that begins in the middle of the evidence line does not read half a line as a whole one.
    cut = oom[len(b"torch.cuda.OutOfMemoryError: "):]
    assert parse_log_tail(cut) is not None  # it says all there is to say, by itself
    assert parse_log_tail(b"x" * MAX_TAIL_BYTES + cut) is None
    lines = log_lines(b"junk\n" * (MAX_LINES * 3))
    assert len(lines) == MAX_LINES
    assert all(len(line.text) <= MAX_LINE for line in log_lines(b"a" * (MAX_LINE * 5) + b"\n"))


def test_hostile_bytes_never_raise() -> None:
    for data in (b"", b"\x00" * 1000, b"\xff\xfe" * 5000, b"{\"log\":", b"{\"log\": 5}\n", b"\n" * 10000,
                 b"2026-01-01T00:00:00Z stderr P " * 3000,
                 b"GPU 99999999 has a total capacity of 1e999 GiB",
                 ("\udcff" * 10).encode("utf-8", "surrogatepass")):
        assert parse_log_tail(data) is None, data[:40]
    # CUDA's phrase with an absurd size: a CUDA OOM whose size is unknown, its evidence line cut to the bound
    found = parse_log_tail(b"CUDA out of memory. Tried to allocate " + b"9" * 500)
    assert found is not None and (found.memory, found.kind, found.tried_bytes) == (GPU, "cuda-oom", None)
    assert [len(line) for line in found.evidence] == [MAX_EVIDENCE_CHARS]


def test_sizes() -> None:
    assert size_bytes("926.", "GiB") == 926 * GiB
    assert size_bytes("1.5", "KB") == 1500
    assert size_bytes("0", "bytes") == 0
    assert size_bytes("1" * 30, "EiB") is None  # absurd: unknown, not a huge number
    assert size_bytes("1", "XB") is None


def test_the_worst_lines_take_linear_time() -> None:
    """Lines built to make a backtracking expression work hard (long runs of what every pattern half-matches),
    a whole window of them, are read in well under a second each."""
    import time

    worst = [
        "GPU 1 has a total capacity of 1.00 GiB of which " * 200,
        "(GPU 0; " + "1.00 GiB total capacity; " * 300,
        "a." * (MAX_LINE // 2) + "MemoryError",
        "_" * MAX_LINE,
        "9" * MAX_LINE,
        "RESOURCE_EXHAUSTED: " + " " * (MAX_LINE - 40),
        "failed to allocate " + "x" * (MAX_LINE - 40),
        "- Free memory: " + "1" * (MAX_LINE - 20),
        "ng:1:2 [" + "3" * (MAX_LINE - 10),
        "[rank1]: " * 900,
    ]
    for line in worst:
        data = ((line + "\n") * (MAX_TAIL_BYTES // (len(line) + 1) + 1)).encode()
        started = time.perf_counter()
        parse_log_tail(data)
        assert time.perf_counter() - started < 1.0, line[:40]
