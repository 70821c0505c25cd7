"""What the last lines of a container's log say about an allocation that failed: GPU memory (CUDA, HIP, XLA,
TensorFlow, cuBLAS, NCCL) or the host's (PyTorch's CPU allocator, Python's MemoryError, a runtime's heap).

On a GPU node the commonest "out of memory" is not the host's: CUDA's allocator fails, the process prints a
traceback and exits 1, and no kernel OOM kill ever happened. The kubelet keeps each container's output in
`/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log`, one line per record in the CRI format
`2024-01-01T00:00:00.000000000Z stderr F text` (tag `P` for a piece of a line longer than 16 KiB, `F` for its
last piece); docker's json-file lines (`{"log":"text\\n","stream":"stderr","time":"…"}`, cri-dockerd) and
plain text are read too. `parse_log_tail(data)` takes the end of such a file and returns a `LogFinding` (or
None): the evidence lines, what kind of memory failed, and what the message says (device, bytes asked for,
capacity, free, allocated, reserved, the process's use).

The messages are matched by phrases only the failing libraries print (`CUDA out of memory. Tried to allocate`,
`CUDA error: out of memory`, `cudaErrorMemoryAllocation`, `CUBLAS_STATUS_ALLOC_FAILED`, NCCL's `Cuda failure
'out of memory'`, XLA's `RESOURCE_EXHAUSTED: Out of memory while trying to allocate`, TensorFlow's `OOM when
allocating tensor`), never by the words "out of memory" alone: a log that says it lowered the batch size "to
avoid out of memory" says nothing happened. The last strong finding wins (the one nearest the death); a
warning-level line (NCCL's `WARN`, a TensorFlow `failed to allocate` it may retry) only when no error line
says more. `lines_after` says how far from the end of the tail the evidence is: an OOM that a program caught
and survived (a hyper-parameter search trying the next trial) is followed by more output.

Bounded: at most MAX_TAIL_BYTES of the end are looked at, MAX_LINES lines of it, MAX_LINE characters a line,
every regular expression without nested repetition (linear in the line), MAX_EVIDENCE lines returned.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, Optional, Union

from oomwatch.parse import LazyPattern  # compiled at a log's first reading, not at the agent's start

MAX_TAIL_BYTES = 64 * 1024  # the end of the log that is read: a traceback and what followed it
MAX_LINES = 600  # lines of that kept (the last ones)
MAX_LINE = 8192  # characters of a line looked at (the kubelet splits lines at 16 KiB)
MAX_EVIDENCE = 4  # evidence lines returned
MAX_EVIDENCE_CHARS = 500  # characters of an evidence line returned
_CONTEXT = 4  # lines after an evidence line searched for its details (xgboost, NCCL, TensorFlow)

# Kinds of memory that failed (`LogFinding.memory`): the accelerator's, the host's, or not said.
GPU, HOST, UNKNOWN = "gpu", "host", "unknown"

# --- log formats --------------------------------------------------------------------------------------

# `<RFC 3339 time> <stdout|stderr> <tag>[:<more tags>] <content>` (kubelet pkg/kubelet/kuberuntime/logs).
_CRI = LazyPattern(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)) (stdout|stderr) ([PF])"
                   r"(?::[^ ]{0,64})? ?")
_ANSI = LazyPattern(r"\x1b\[[0-9;]{0,32}[A-Za-z]")
# torchrun and its relatives prefix every line of a rank: `[rank1]: `, `[default0]:`
_RANK = LazyPattern(r"^\[(?:rank|default)\d{1,6}\]: ?")


@dataclass(frozen=True)
class LogLine:
    text: str
    time: Optional[str] = None  # the CRI or json-file timestamp, as written


def log_lines(data: Union[bytes, str]) -> list[LogLine]:
    """The last MAX_LINES logical lines of the end of a log (CRI, docker json-file or plain text), pieces of
    a long line joined, escape sequences and rank prefixes removed, blank lines left out. A first line cut by
    the window is dropped."""
    if isinstance(data, bytes):
        cut = len(data) > MAX_TAIL_BYTES
        data = data[-MAX_TAIL_BYTES:].decode("utf-8", errors="replace")
    else:
        cut = len(data) > MAX_TAIL_BYTES
        data = data[-MAX_TAIL_BYTES:]
    raw = data.split("\n")
    if cut and len(raw) > 1:
        raw = raw[1:]  # began mid-line
    raw = raw[-(MAX_LINES + 64):]  # (pieces of a line: a few more than kept)
    out: list[LogLine] = []
    pending: list[str] = []  # a CRI line's pieces before its `F`
    for line in raw:
        line = line[:MAX_LINE].rstrip("\r")
        time, text, partial = _unwrap(line)
        if partial:
            if sum(len(p) for p in pending) < MAX_LINE:
                pending.append(text)
            continue
        if pending:
            text = "".join(pending) + text
            pending = []
        if not text.strip():
            continue  # (blank lines do not count in `lines_after`, whatever the format)
        text = _RANK.sub("", _ANSI.sub("", text[:MAX_LINE]), count=1)
        out.append(LogLine(text, time))
    if pending:
        out.append(LogLine(_ANSI.sub("", "".join(pending)[:MAX_LINE])))
    return out[-MAX_LINES:]


def _unwrap(line: str) -> tuple[Optional[str], str, bool]:
    """(timestamp, content, partial) of one physical line."""
    m = _CRI.match(line)
    if m:
        return m.group(1), line[m.end():], m.group(3) == "P"
    if line.startswith('{"log":'):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            return None, line, False
        if isinstance(record, dict) and isinstance(record.get("log"), str):
            text = record["log"]
            time = record.get("time") if isinstance(record.get("time"), str) else None
            return time, text.rstrip("\n"), not text.endswith("\n")
    return None, line, False


# --- sizes ---------------------------------------------------------------------------------------------

_SIZE = r"(\d{1,15}(?:\.\d{0,6})?) ?(bytes|B|KiB|MiB|GiB|TiB|PiB|EiB|KB|MB|GB|TB)\b"
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50,
          "EiB": 1 << 60, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12}


def size_bytes(number: str, unit: str) -> Optional[int]:
    """`22.90`, `GiB` → bytes (binary units as PyTorch prints them; KB/MB/GB as SI)."""
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        return None
    return int(value) if 0 <= value < 1 << 70 else None


def _size(pattern: LazyPattern, text: str) -> Optional[int]:
    m = pattern.search(text)
    return size_bytes(m.group(1), m.group(2)) if m else None


# --- what the libraries print ------------------------------------------------------------------------

@dataclass(frozen=True)
class LogFinding:
    """What the tail says failed. `memory`: "gpu", "host" or "unknown" (an XLA or TensorFlow message that
    names no device). `kind`: which library said it. Byte counts are as the message printed them (rounded)."""

    memory: str
    kind: str  # cuda-oom | hip-oom | cuda-error | cublas | nccl | xla | cupy | tensorflow | cpu-allocator |
    #            python-memoryerror | ray-memory-monitor | js-heap
    evidence: tuple[str, ...]
    lines_after: int  # lines of output after the last evidence line (0: it is the last thing written)
    time: Optional[str] = None  # the evidence line's log timestamp, as written
    device: Optional[int] = None
    tried_bytes: Optional[int] = None
    total_bytes: Optional[int] = None
    free_bytes: Optional[int] = None
    allocated_bytes: Optional[int] = None  # by the framework (PyTorch: "allocated by PyTorch")
    reserved_bytes: Optional[int] = None  # held by the framework's caching allocator, allocated or not
    process_bytes: Optional[int] = None  # "this process has … memory in use" (PyTorch 2.1+)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"memory": self.memory, "kind": self.kind, "evidence": list(self.evidence),
                               "lines_after": self.lines_after}
        for key in ("time", "device", "tried_bytes", "total_bytes", "free_bytes", "allocated_bytes",
                    "reserved_bytes", "process_bytes"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


# Strong: the error a program dies of. Weak: a warning that may be retried or survived.
STRONG, WEAK = 2, 1

# PyTorch: `CUDA out of memory. Tried to allocate 22.00 MiB.` (torch.OutOfMemoryError,
# torch.cuda.OutOfMemoryError, before 2.0 RuntimeError), `HIP out of memory` on ROCm; `CUDA error: out of
# memory` from a CUDA call (RuntimeError, torch.AcceleratorError); cuBLAS's handle allocation.
_TORCH_OOM = LazyPattern(r"\b(CUDA|HIP) out of memory\. Tried to allocate\b"
                         r"|(?:^|[Ee]rror: |Error\(['\"])(CUDA|HIP) out of memory\b")
_TRIED = LazyPattern(r"Tried to allocate " + _SIZE)
_NEW_DEVICE = LazyPattern(r"\bGPU (\d{1,4}) has a total capac(?:i)?ty of " + _SIZE + r" of which " + _SIZE
                          + r" is free")
_OLD_DEVICE = LazyPattern(r"\(GPU (\d{1,4}); ")
_OLD_TOTAL = LazyPattern(_SIZE + r" total capacity")
_OLD_ALLOCATED = LazyPattern(_SIZE + r" already allocated")
_OLD_FREE = LazyPattern(_SIZE + r" free[;)]")
_OLD_RESERVED = LazyPattern(_SIZE + r" (?:reserved in total by PyTorch|cached)")
_NEW_ALLOCATED = LazyPattern(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_NEW_UNALLOCATED = LazyPattern(_SIZE + r" is reserved by PyTorch but unallocated")
_PROCESS = LazyPattern(r"this process has " + _SIZE + r" memory in use")
_CUDA_ERROR = LazyPattern(r"\bCUDA error: out of memory|\bcudaErrorMemoryAllocation\b"
                          r"|\bCUDA_ERROR_OUT_OF_MEMORY\b|\bhipErrorOutOfMemory\b|\bHIP_ERROR_OutOfMemory\b")
_CUBLAS = LazyPattern(r"\bCUBLAS_STATUS_ALLOC_FAILED\b")
# NCCL: `host:pid:tid [cudaDev] enqueue.cc:1085 NCCL WARN Cuda failure 'out of memory'` (2.x prints the
# error's number too: `Cuda failure 2 'out of memory'`), `Failed to CUDA calloc 6291456 bytes`: warnings; the
# same words after `Last error:` in the exception PyTorch raises (`ncclUnhandledCudaError`) are the error.
_NCCL = LazyPattern(r"\bCuda failure (?:\d{1,4} )?'out of memory'|\bFailed to CUDA calloc\b")
_NCCL_DEVICE = LazyPattern(r"^[^ ]{1,256}:\d{1,10}:\d{1,10} \[(\d{1,4})\] ")
_NCCL_BYTES = LazyPattern(r"Failed to CUDA calloc (\d{1,20}) bytes")
# XGBoost (and other users of rmm/thrust) follow a failed device allocation with its sizes.
_FREE_LINE = LazyPattern(r"- Free memory: (?:" + _SIZE + r"|(\d{1,20})\b)")
_REQUESTED_LINE = LazyPattern(r"- Requested memory: (?:" + _SIZE + r"|(\d{1,20})\b)")
# XLA (JAX, and TensorFlow's XLA): `RESOURCE_EXHAUSTED: Out of memory while trying to allocate 6291456 bytes.`
# (`Resource exhausted:` before jaxlib 0.3, `Out of memory allocating N bytes` from some paths; jaxlib 0.11 on an
# H100, captured: `… allocate 200.00GiB with allocator GPU_0_bfc on device 0.`); the device is known from its
# allocator, named in the message or in the allocator's own lines (`Allocator (GPU_0_bfc) ran out of memory`),
# or a TPU's `hbm`.
_XLA = LazyPattern(r"\b(?:RESOURCE_EXHAUSTED|Resource exhausted): Out of memory "
                   r"(?:while trying to allocate|allocating) (?:(\d{1,20}) bytes|" + _SIZE + ")")
# CuPy's memory pool (captured on an H100, CuPy 14): `cupy.cuda.memory.OutOfMemoryError: Out of memory
# allocating 214,748,364,800 bytes (allocated so far: 0 bytes).` (what its pool holds: "so far").
_CUPY = LazyPattern(r"\bcupy\.cuda\.memory\.OutOfMemoryError: Out of memory allocating (\d{1,3}(?:,\d{3}){0,6}) bytes"
                    r"(?: \(allocated so far: (\d{1,3}(?:,\d{3}){0,6}) bytes\))?")
_XLA_TPU = LazyPattern(r"\bRESOURCE_EXHAUSTED: .{0,200}\bRan out of memory in memory space hbm\b")
# TensorFlow: `OOM when allocating tensor with shape[64,2016,9,9] and type float on
# /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc`.
_TF = LazyPattern(r"\bOOM when allocating tensor\b")
# A device allocation XLA or TensorFlow retries smaller, or falls back from: a warning, not the error.
_ALLOC_WARN = LazyPattern(r"\bfailed to alloc(?:ate)? .{0,120}"
                          r"(?:CUDA_ERROR_OUT_OF_MEMORY|HIP_ERROR_OutOfMemory)")
_GPU_DEVICE = LazyPattern(r"(?:device:GPU:|/gpu:|\bGPU_)(\d{1,4})\b", re.IGNORECASE)
_CPU_DEVICE = LazyPattern(r"(?:device:CPU:\d|/cpu:\d|by allocator cpu\b)", re.IGNORECASE)
# The host: PyTorch's CPU allocator (`DefaultCPUAllocator: can't allocate memory: you tried to allocate N
# bytes`, `not enough memory` on Windows, before 1.5 `posix_memalign(&data, gAlignment, nbytes) == 0. 12 vs
# 0`), Python's MemoryError (numpy's `_ArrayMemoryError: Unable to allocate 58.0 GiB for an array …`), Ray's
# memory monitor's kill as its driver reports it, and V8's heap limit.
_CPU_ALLOCATOR = LazyPattern(r"\bDefaultCPUAllocator: (?:can't allocate memory|not enough memory)"
                             r"|\bposix_memalign\(&data, gAlignment, nbytes\) == 0\. 12 vs 0")
_CPU_TRIED = LazyPattern(r"you tried to allocate (\d{1,20}) bytes")
# The last line of a Python traceback: `MemoryError`, `numpy.core._exceptions._ArrayMemoryError: …`. Not
# `OutOfMemoryError` (PyTorch's and Ray's: matched above).
_MEMORYERROR = LazyPattern(r"^(?:[A-Za-z_][\w]{0,64}\.){0,8}(?!OutOf)_?[A-Za-z]{0,32}MemoryError\b(?::|$)")
_NUMPY_SIZE = LazyPattern(r"Unable to allocate " + _SIZE)
_RAY = LazyPattern(r"\bray\.exceptions\.OutOfMemoryError: (?:Task was killed|\d{1,9} worker\(s\) were killed)"
                   r" due to the node running low on memory")
_JS_HEAP = LazyPattern(r"\bFATAL ERROR: .{0,80}JavaScript heap out of memory")


def _finding_of(lines: list[LogLine], at: int) -> Optional[tuple[int, LogFinding]]:
    """(strength, finding) for line `at`, or None. Details may come from the next few lines."""
    text = lines[at].text
    after = " ".join(line.text for line in lines[at + 1:at + 1 + _CONTEXT])
    m = _TORCH_OOM.search(text)
    if m:
        return STRONG, _torch_finding(text, "hip-oom" if "HIP" in (m.group(1), m.group(2)) else "cuda-oom")
    if _ALLOC_WARN.search(text):
        return WEAK, LogFinding(GPU, "cuda-error", (), 0)
    if _CUDA_ERROR.search(text):
        f = LogFinding(GPU, "cuda-error", (), 0, tried_bytes=_requested(text + " " + after),
                       free_bytes=_free(text + " " + after))
        return STRONG, f
    if _CUBLAS.search(text):
        return STRONG, LogFinding(GPU, "cublas", (), 0)
    if _NCCL.search(text):
        dev = _NCCL_DEVICE.search(text)
        nbytes = _NCCL_BYTES.search(text) or _NCCL_BYTES.search(after)
        return (WEAK if "NCCL WARN" in text else STRONG), LogFinding(
            GPU, "nccl", (), 0, device=int(dev.group(1)) if dev else None,
            tried_bytes=int(nbytes.group(1)) if nbytes else None)
    m = _XLA.search(text)
    if m or _XLA_TPU.search(text):
        tried = (int(m.group(1)) if m.group(1) else size_bytes(m.group(2), m.group(3))) if m else None
        return STRONG, LogFinding(UNKNOWN, "xla", (), 0, tried_bytes=tried)
    m = _CUPY.search(text)
    if m:
        so_far = m.group(2)
        return STRONG, LogFinding(GPU, "cupy", (), 0, tried_bytes=int(m.group(1).replace(",", "")),
                                  allocated_bytes=int(so_far.replace(",", "")) if so_far else None)
    if _TF.search(text):
        return STRONG, _device_finding(LogFinding(UNKNOWN, "tensorflow", (), 0), text, after)
    if _CPU_ALLOCATOR.search(text):
        tried = _CPU_TRIED.search(text)
        return STRONG, LogFinding(HOST, "cpu-allocator", (), 0,
                                  tried_bytes=int(tried.group(1)) if tried else None)
    if _RAY.search(text):
        return STRONG, LogFinding(HOST, "ray-memory-monitor", (), 0)
    if _JS_HEAP.search(text):
        return STRONG, LogFinding(HOST, "js-heap", (), 0)
    if "MemoryError" in text and _MEMORYERROR.match(text):
        return STRONG, LogFinding(HOST, "python-memoryerror", (), 0, tried_bytes=_size(_NUMPY_SIZE, text))
    return None


def _torch_finding(text: str, kind: str) -> LogFinding:
    f = LogFinding(GPU, kind, (), 0, tried_bytes=_size(_TRIED, text), process_bytes=_size(_PROCESS, text))
    m = _NEW_DEVICE.search(text)
    if m:  # PyTorch 2.1+
        allocated = _size(_NEW_ALLOCATED, text)
        unallocated = _size(_NEW_UNALLOCATED, text)
        reserved = allocated + unallocated if allocated is not None and unallocated is not None else None
        return replace(f, device=int(m.group(1)), total_bytes=size_bytes(m.group(2), m.group(3)),
                       free_bytes=size_bytes(m.group(4), m.group(5)), allocated_bytes=allocated,
                       reserved_bytes=reserved)
    m = _OLD_DEVICE.search(text)
    if m:  # up to 2.0: `(GPU 0; 6.00 GiB total capacity; 4.26 GiB already allocated; 0 bytes free; …)`
        return replace(f, device=int(m.group(1)), total_bytes=_size(_OLD_TOTAL, text),
                       allocated_bytes=_size(_OLD_ALLOCATED, text), free_bytes=_size(_OLD_FREE, text),
                       reserved_bytes=_size(_OLD_RESERVED, text))
    return f


def _device_finding(f: LogFinding, text: str, after: str) -> LogFinding:
    """An XLA or TensorFlow message: GPU n when it or the lines after name a GPU device or allocator, host
    when they name the CPU's."""
    for where in (text, after):
        gpu = _GPU_DEVICE.search(where)
        if gpu:
            return replace(f, memory=GPU, device=int(gpu.group(1)))
        if _CPU_DEVICE.search(where):
            return replace(f, memory=HOST)
    return f


def _requested(text: str) -> Optional[int]:
    return _either(_REQUESTED_LINE.search(text))


def _free(text: str) -> Optional[int]:
    return _either(_FREE_LINE.search(text))


def _either(m: Optional[re.Match]) -> Optional[int]:
    if m is None:
        return None
    if m.group(1) is not None:
        return size_bytes(m.group(1), m.group(2))
    return int(m.group(3))


_XLA_GPU_CONTEXT = LazyPattern(r"\bAllocator \((GPU|gpu|cuda)_(\d{1,4})_bfc\) ran out of memory"
                               r"|\b(?:GPU|gpu|cuda)_(\d{1,4})_bfc\b")


def parse_log_tail(data: Union[bytes, str]) -> Optional[LogFinding]:
    """The allocation failure the end of a container's log reports (see the module docstring), or None."""
    lines = log_lines(data)
    best: Optional[tuple[int, int, LogFinding]] = None  # (strength, line index, finding)
    found: list[tuple[int, int, LogFinding]] = []  # (line index, strength, finding) of every evidence line
    for at, line in enumerate(lines):
        if not line.text:
            continue
        hit = _finding_of(lines, at)
        if hit is None:
            continue
        strength, finding = hit
        found.append((at, strength, finding))
        if best is None or strength >= best[0]:
            best = (strength, at, finding)
    if best is None:
        return None
    strength, at, finding = best
    if finding.kind == "xla" and finding.memory == UNKNOWN:
        finding = _xla_device(finding, lines)
    # The evidence: the chosen line, and the other lines of the same strength just before it (a traceback that
    # printed the message twice, NCCL's pair of warnings), last MAX_EVIDENCE of them.
    same = [(i, f) for i, s, f in found if s == strength and i <= at and at - i <= 40][-MAX_EVIDENCE:]
    evidence = tuple(lines[i].text[:MAX_EVIDENCE_CHARS] for i, _ in same)
    # What the chosen line leaves out, an earlier line of its kind may say.
    for _, earlier in reversed(same[:-1]):
        if earlier.kind == finding.kind:
            finding = replace(finding, **{k: getattr(earlier, k) for k in _DETAILS
                                          if getattr(finding, k) is None and getattr(earlier, k) is not None})
    return replace(finding, evidence=evidence, lines_after=len(lines) - 1 - at, time=lines[at].time)


_DETAILS = ("device", "tried_bytes", "total_bytes", "free_bytes", "allocated_bytes", "reserved_bytes",
            "process_bytes")


def _xla_device(finding: LogFinding, lines: list[LogLine]) -> LogFinding:
    """XLA names no device in its error: its allocator's lines elsewhere in the tail do (`Allocator
    (GPU_0_bfc) ran out of memory trying to allocate …`), or a TPU's `hbm`."""
    for line in lines:
        if "memory space hbm" in line.text:
            return replace(finding, memory=GPU)
        m = _XLA_GPU_CONTEXT.search(line.text)
        if m:
            number = m.group(2) or m.group(3)
            return replace(finding, memory=GPU, device=int(number) if number else None)
    return finding
