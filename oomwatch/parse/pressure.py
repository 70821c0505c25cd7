"""memory.stat and memory.pressure (PSI) of a cgroup v2 directory, as values. Pure: text in, values out.

memory.stat is `key value` per line, bytes or event counts (docs/kernel-facts.md). The working set is what the
kubelet (through cAdvisor's `setMemoryStats`) reports as `container_memory_working_set_bytes` on cgroup v2:
memory.current less the `inactive_file` line of memory.stat, floored at 0 (inactive file pages are the first
reclaimed, so they do not count toward the pressure that ends in an OOM kill).

memory.pressure is two lines, `some` and `full`:

    some avg10=0.00 avg60=0.00 avg300=0.00 total=0
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

`avgN` are percentages of wall time over the last N seconds in which some (or all) non-idle tasks of the
cgroup were stalled waiting for memory; `total` is the cumulative stall in microseconds. Values the kernel
never prints (a negative total, a percentage above 100, garbage) are unknown (None), never an exception.
"""

from __future__ import annotations

from typing import Optional

from oomwatch.model import Pressure, PressureLine
from oomwatch.parse.cgroup import parse_u64

PRESSURE_KINDS = ("some", "full")
_AVERAGES = ("avg10", "avg60", "avg300")


def _percentage(text: str) -> Optional[float]:
    # The kernel prints LOAD_INT.LOAD_FRAC: digits, a dot, two digits; never a sign, an exponent or nan.
    whole, dot, frac = text.partition(".")
    if not (whole.isascii() and whole.isdigit()) or (dot and not (frac.isascii() and frac.isdigit())):
        return None
    value = float(text)
    return value if value <= 100.0 else None


def parse_pressure_line(text: str) -> Optional[PressureLine]:
    """`avg10=1.23 avg60=0.50 avg300=0.10 total=123456` (the part after `some`/`full`); None when no field
    is readable. A field that is malformed or out of range is None; unknown fields are ignored."""
    values: dict[str, object] = {}
    for token in text.split():
        key, eq, value = token.partition("=")
        if not eq:
            continue
        if key in _AVERAGES:
            values[key] = _percentage(value)
        elif key == "total":
            values["total_usec"] = parse_u64(value)
    if not any(v is not None for v in values.values()):
        return None
    return PressureLine(**values)  # type: ignore[arg-type]


def parse_pressure(text: str) -> Pressure:
    """A whole PSI file (memory.pressure, or /proc/pressure/memory) → Pressure."""
    lines: dict[str, Optional[PressureLine]] = {}
    for line in text.splitlines():
        kind, _, rest = line.strip().partition(" ")
        if kind in PRESSURE_KINDS and kind not in lines:
            lines[kind] = parse_pressure_line(rest)
    return Pressure(some=lines.get("some"), full=lines.get("full"))


def parse_memory_stat_field(text: str, key: str) -> Optional[int]:
    """One value of memory.stat (`inactive_file`, `anon`, …) without building the whole table: a scrape
    needs one line of about forty. None when absent or not a u64."""
    start = 0
    prefix = key + " "
    while True:
        at = text.find(prefix, start)
        if at < 0:
            return None
        if at == 0 or text[at - 1] == "\n":
            end = text.find("\n", at)
            return parse_u64(text[at + len(prefix): end if end >= 0 else len(text)])
        start = at + 1


def working_set_bytes(usage_bytes: Optional[int], inactive_file: Optional[int]) -> Optional[int]:
    """memory.current less memory.stat `inactive_file`, floored at 0, as the kubelet computes it; None when
    either is unknown."""
    if usage_bytes is None or inactive_file is None:
        return None
    return max(0, usage_bytes - inactive_file)
