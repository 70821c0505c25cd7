"""The parsers: pure functions of text."""

from __future__ import annotations

import re

_PATTERN_ATTRIBUTES = ("match", "search", "fullmatch", "sub", "subn", "split", "findall", "finditer", "scanner",
                       "pattern", "flags", "groups", "groupindex")


class LazyPattern:
    """A regular expression compiled at its first use instead of at import, used as the compiled pattern is
    (`.search`, `.match`, `.sub`, `.pattern`...). For the patterns of what the live kernel log never needs (a
    container's log, a saved text log): the agent's start imports every parser, and under emulation compiling
    them there cost it a share of its imports (issue 30 item 4, benchmarks/start.py). At its first use the
    compiled pattern's methods become this object's own attributes, so that a use costs what the pattern's
    does. Two threads that use it first at once compile it twice, to the same pattern."""

    def __init__(self, source, flags: int = 0) -> None:
        self._source, self._flags = source, flags

    def __getattr__(self, name: str):  # only for what is not yet an attribute: before the first use
        if name.startswith("__") or name in ("_source", "_flags"):
            raise AttributeError(name)
        compiled = re.compile(self._source, self._flags)
        self.__dict__.update((attribute, getattr(compiled, attribute)) for attribute in _PATTERN_ATTRIBUTES)
        return getattr(compiled, name)

    def __repr__(self) -> str:
        return f"LazyPattern({self._source!r})"
