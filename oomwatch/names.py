"""Names as oomwatch writes them: a cgroup name may hold any byte but `/`, and what is not UTF-8 must still be
written as valid UTF-8 (a label value, JSON, a terminal), the same way whether the name was read from the cgroup
tree or from the kernel log. No imports of the package: the model uses it."""

from __future__ import annotations

import re

# A byte that is not UTF-8 (a lone surrogate), and a backslash that would read as one of the escapes written for
# such bytes (`\\x80`-`\\xff`): it is written `\\x5c`, so that the text `x\\xff` and the byte 0xff never spell alike.
# A backslash before anything else stays (systemd's own `\\x2d` in unit names is left as it is).
_NOT_UTF8 = re.compile("[\ud800-\udfff]|\\\\(?=x[89a-fA-F][0-9a-fA-F])")


def _byte_escapes(match: re.Match[str]) -> str:
    if match.group() == "\\":
        return "\\x5c"
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # one byte 0x80-0xff kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    return "".join(f"\\x{b:02x}" for b in match.group().encode("utf-8", "surrogatepass"))


def as_logged(name: str) -> str:
    """A name read from the cgroup tree (os.fsdecode: a byte that is not UTF-8 becomes a lone surrogate) or from
    the kernel log (oomwatch.parse.kmsg.unescape decodes it the same way, then calls this), in one spelling:
    each byte that is not UTF-8 as the text `\\xNN`, a backslash that would read as such an escape as `\\x5c`,
    every other character as it is. The result is always valid UTF-8 (a label value, JSON, a terminal), a
    cgroup's path read from the tree and from the kernel log are the same string, and two different names are
    never spelt alike (issue 31 item 11)."""
    return _NOT_UTF8.sub(_byte_escapes, name)
