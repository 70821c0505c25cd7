"""Time formatting shared by the JSON sinks and the CLI."""

from __future__ import annotations

import datetime as _dt


def iso8601(epoch: float) -> str:
    """Epoch seconds → `2026-11-22T17:38:21.123456Z` (UTC, microseconds), as docs/contract.md shows."""
    return _dt.datetime.fromtimestamp(epoch, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def utc_seconds(epoch: float) -> str:
    """Epoch seconds → `2026-11-22 17:38:21Z`: what a person reads (inspect's text)."""
    return _dt.datetime.fromtimestamp(epoch, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def parse_iso8601(text: str) -> float:
    return _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=_dt.timezone.utc).timestamp()
