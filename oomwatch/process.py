"""Tuning of the agent's process (glibc's malloc), done by the entry point before the threads start and around
each scrape. Nothing here knows what the agent does."""

from __future__ import annotations

import functools
import gc
from typing import Iterable, Iterator


def limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each thread that allocates its own malloc arena, and freed memory scattered over a handful of
    arenas is not handed back: the agent's threads (reader pump, pipeline, cgroup watcher, HTTP, scrape) kept
    megabytes each. Two arenas, set before the threads start (mallopt M_ARENA_MAX)."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(-8, arenas)  # M_ARENA_MAX


def malloc_trimmed(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A scrape's body, then its garbage handed back to the kernel: a 2,000-container body is megabytes of
    short-lived strings, and glibc keeps freed heap (RSS grew by a third over 1,000 scrapes without this)."""
    yield from chunks
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def freeze_long_lived() -> None:
    """What exists now lives as long as the process (the modules, the restored state, the tree as found): out of
    the cyclic collector's reach from now on, so that a full collection during a storm scans only what came since
    (a full collection of the imports' 22,000 objects alone takes 5.5 ms natively, about 17 times that under the
    tiers' emulation, all of it on the loop's path while it runs)."""
    gc.freeze()


def nice_this_thread(nice: int) -> None:
    """Nice is per thread on Linux: the calling thread alone, where the process may (CAP_SYS_NICE)."""
    import os
    import threading

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError:
        pass


@functools.lru_cache(maxsize=1)
def _glibc():
    """glibc, for its malloc tuning; None elsewhere (musl, macOS): nothing to tune."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except (OSError, AttributeError):
        return None
