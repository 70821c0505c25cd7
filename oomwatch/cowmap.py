"""A dict one thread changes while others read frozen copies of it, each copy taken in constant time.

The pipeline hands scrapes an immutable view after every change (oomwatch.pipeline.View); with 20,000 workloads a
copy of each dict per removed cgroup was most of what churn cost (issue 31: 118 s of CPU to remove 10,000 of
20,000). Here entries sit in chunks of CHUNK slots, in insertion order (a changed value keeps its place, as in a
dict); `frozen()` hands out the chunks as they are and marks them shared, and the next change to a shared chunk
copies that chunk alone. A removal leaves an empty slot; the chunks are packed again once half the slots are
empty, so a copy costs what changed plus one reference per CHUNK entries.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any, Iterator, Optional

CHUNK = 256
_SHIFT = 8  # CHUNK == 1 << _SHIFT
_MIN_PACK = 1024  # empty slots tolerated before packing, whatever the size


class CowMap(MutableMapping):
    """The owner's side: a mutable mapping (one thread only). `frozen()` is a FrozenMap of its content now."""

    def __init__(self, items: Any = ()) -> None:
        self._chunks: list[list[Optional[tuple[Any, Any]]]] = []
        self._owned: list[int] = []  # per chunk: the generation it was made in (shared once the generation moved)
        self._generation = 0
        self._where: dict[Any, int] = {}  # key -> chunk << _SHIFT | slot
        self._empty = 0  # removed slots not packed yet
        self.update(items)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def __iter__(self) -> Iterator[Any]:
        return iter(self._where)  # (insertion order: the same as the chunks', for keys)

    def __getitem__(self, key: Any) -> Any:
        at = self._where[key]
        return self._chunks[at >> _SHIFT][at & (CHUNK - 1)][1]  # type: ignore[index]

    def __setitem__(self, key: Any, value: Any) -> None:
        at = self._where.get(key)
        if at is not None:
            self._chunk(at >> _SHIFT)[at & (CHUNK - 1)] = (key, value)
            return
        if not self._chunks or len(self._chunks[-1]) == CHUNK:
            self._chunks.append([])
            self._owned.append(self._generation)
        index = len(self._chunks) - 1
        chunk = self._chunk(index)
        self._where[key] = index << _SHIFT | len(chunk)
        chunk.append((key, value))

    def __delitem__(self, key: Any) -> None:
        at = self._where.pop(key)
        self._chunk(at >> _SHIFT)[at & (CHUNK - 1)] = None
        self._empty += 1
        if self._empty > _MIN_PACK and self._empty > len(self._where):
            self._pack()

    def frozen(self) -> "FrozenMap":
        """The content now, immutable: later changes copy the chunks they touch first."""
        self._generation += 1
        return FrozenMap(tuple(self._chunks), len(self._where))

    def _chunk(self, index: int) -> list:
        if self._owned[index] != self._generation:  # shared with a frozen copy: copy it before changing it
            self._chunks[index] = self._chunks[index][:]
            self._owned[index] = self._generation
        return self._chunks[index]

    def _pack(self) -> None:
        items = [entry for chunk in self._chunks for entry in chunk if entry is not None]
        self._chunks, self._owned, self._where, self._empty = [], [], {}, 0
        for key, value in items:
            self[key] = value


class FrozenMap(Mapping):
    """An immutable mapping (what a CowMap held when it was frozen), in insertion order. Iterating costs nothing
    up front; the first look-up by key builds an index (readers: tests, rare)."""

    __slots__ = ("_chunks", "_len", "_index")

    def __init__(self, chunks: tuple = (), length: int = 0) -> None:
        self._chunks = chunks
        self._len = length
        self._index: Optional[dict] = None

    def __len__(self) -> int:
        return self._len

    @property
    def chunks(self) -> tuple:
        """The chunks of slots, in order, as frozen (shared with the CowMap and other frozen copies until a change
        copies one): what a copy costs, for tests and diagnostics."""
        return self._chunks

    def _entries(self) -> Iterator[tuple[Any, Any]]:
        for chunk in self._chunks:
            for entry in chunk:
                if entry is not None:
                    yield entry

    def __iter__(self) -> Iterator[Any]:
        return (key for key, _ in self._entries())

    def __getitem__(self, key: Any) -> Any:
        if self._index is None:
            self._index = dict(self._entries())
        return self._index[key]

    def __contains__(self, key: object) -> bool:
        try:
            self[key]
        except KeyError:
            return False
        return True

    def items(self) -> Any:
        return _Entries(self, 0)

    def values(self) -> Any:
        return _Entries(self, 1)

    def __repr__(self) -> str:
        return f"FrozenMap({dict(self._entries())!r})"


class _Entries:
    """items() or values() of a FrozenMap: sized and iterable again and again (a view's workloads are)."""

    __slots__ = ("_map", "_what")

    def __init__(self, frozen: FrozenMap, what: int) -> None:
        self._map, self._what = frozen, what

    @property
    def mapping(self) -> FrozenMap:
        """The frozen mapping these are the items or values of."""
        return self._map

    def __len__(self) -> int:
        return len(self._map)

    def __iter__(self) -> Iterator[Any]:
        entries = self._map._entries()
        return entries if self._what == 0 else (value for _, value in entries)
