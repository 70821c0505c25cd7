"""systemd-oomd's marks on a cgroup it kills: the xattrs `user.oomd_ooms` (incremented before its SIGKILLs) and
`user.oomd_kill` (by the number of processes killed after them), as oomwatch.deaths reads them (its docstring
says which systemd writes which)."""

from __future__ import annotations

from typing import Optional


def parse_oomd_xattr(value: Optional[bytes]) -> Optional[int]:
    """`user.oomd_ooms` / `user.oomd_kill` as read (a decimal count; None when absent or not a count)."""
    if value is None:
        return None
    text = value.rstrip(b"\x00").strip()
    if not text.isdigit() or len(text) > 19:
        return None
    return int(text)
