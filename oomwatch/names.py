"""Names as oomwatch writes them: a cgroup name may hold any byte but `/`, and what is not UTF-8 must still be
written as valid UTF-8 (a label value, JSON, a terminal), the same way whether the name was read from the cgroup
tree or from the kernel log. No imports of the package: the model uses it."""

from __future__ import annotations

import re

_NOT_UTF8 = re.compile("[\ud800-\udfff]")


def _byte_escapes(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # one byte 0x80-0xff kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    return "".join(f"\\x{b:02x}" for b in match.group().encode("utf-8", "surrogatepass"))


def as_logged(name: str) -> str:
    """A name read from the cgroup tree (os.fsdecode: a byte that is not UTF-8 becomes a lone surrogate) spelt
    as the kernel log spells it once oomwatch.parse.kmsg.unescape has read it: each such byte as the text
    `\\xNN`, every other character as it is. The result is always valid UTF-8 (a label value, JSON, a
    terminal), and a cgroup's path read from the tree and from the kernel log are the same string."""
    return _NOT_UTF8.sub(_byte_escapes, name)
