"""Text a person reads, made safe to show: the one sanitizer of every output oomwatch writes for people.

Names come from the node's tenants: a process names itself anything (15 bytes), a cgroup name holds any byte
but `/`, an ownerReference any text. Sent as they are to a terminal (`oomwatch inspect`, `inspect --job`,
`kubectl oomwatch`), to `kubectl describe` (pod Events), to `journalctl` or to the agent's log, their control
characters act: ESC starts a terminal sequence (a window title, an OSC 52 clipboard write), CR rewrites the
line, a bidi override reorders what follows. Here each is shown instead of sent: a character below U+0100 as
`\\xNN` (as the kernel log writes a byte), any other as `\\uNNNN`. Shown so: C0 controls and DEL, C1 controls
(U+0080-U+009F: 0x9b is a CSI by itself), the bidi marks, embeddings, overrides and isolates (U+061C, U+200E,
U+200F, U+202A-U+202E, U+2066-U+2069), the line and paragraph separators, and lone surrogates (a byte that is
not UTF-8, as `\\xNN`).

It is applied where text leaves oomwatch (cli.py, kubectl.py, the pod Event and journal builders, the log
formatter), after every decoding (the kernel log's `\\xNN` escapes are undone when a record is read, so a
name's ESC is a real ESC by then). JSON output needs none of it: json.dumps writes every such character as
`\\uNNNN`. Prometheus label values have their own policy (oomwatch.sinks.collector.label_value), which reuses
this module's class of characters.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

# The characters never written as they are: C0 but newline and tab
# (`_LINE_CONTROLS`), DEL, C1, the bidi marks, embeddings, overrides and isolates, the line and paragraph
# separators, lone surrogates.
_OTHER_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_LINE_CONTROLS = "\n\t"
CONTROLS = _LINE_CONTROLS + _OTHER_CONTROLS
_ANY_CONTROL = re.compile(f"[{CONTROLS}]")
_CONTROL_BUT_LINES = re.compile(f"[{_OTHER_CONTROLS}]")
# A control character in json.dumps(ensure_ascii=False)'s text: C0 and DEL come escaped (`\n`, `\u001b`), the
# others as they are. (A name's own backslash followed by `n` matches too: only a walk more.)
_CONTROL_IN_JSON = re.compile(f"[{_OTHER_CONTROLS}]|\\\\(?:u00[01]|u007f|[bfnrt])")
# The colour sequences oomwatch.inspect.Style writes (Select Graphic Rendition only), kept when colour is on.
_SGR = re.compile("(\x1b\\[[0-9;]{0,16}m)")


def escape_char(char: str) -> str:
    """One character as it is shown: `\\xNN` below U+0100 (and for a surrogate-escaped byte), else `\\uNNNN`."""
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8, read with surrogateescape
        code -= 0xDC00
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _escaped(match: re.Match[str]) -> str:
    return escape_char(match.group())


def visible(text: str) -> str:
    """`text` on one line, each control character shown as its escape (newline and tab included)."""
    if text.isascii() and text.isprintable():
        return text
    return _ANY_CONTROL.sub(_escaped, text)


def visible_lines(text: str) -> str:
    """`text` with its newlines and tabs kept, every other control character shown as its escape."""
    return _CONTROL_BUT_LINES.sub(_escaped, text)


def visible_data(value: Any) -> Any:
    """A report (dicts, lists, strings, numbers) with every string made `visible`, keys too: what a renderer
    formats then holds no control character of its own, and colour can be added around it. A report without
    any is returned as it is (one json.dumps tells, far faster than walking it)."""
    try:
        if not _CONTROL_IN_JSON.search(json.dumps(value, ensure_ascii=False)):
            return value
    except (TypeError, ValueError):
        pass  # not all JSON (a set, an object): walked
    return _visible_walk(value)


def _visible_walk(value: Any) -> Any:
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {visible(k) if isinstance(k, str) else k: _visible_walk(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_visible_walk(v) for v in value]
    return value


def terminal_text(text: str, color: bool = False) -> str:
    """Rendered text as it may be written to a terminal: newlines and tabs kept, every other control character
    shown as its escape; with `color`, the colour sequences oomwatch's own renderer writes are kept (the data
    it formats was made `visible_data` first, so none of them came from a name)."""
    if not color:
        return visible_lines(text)
    return "".join(part if i % 2 else visible_lines(part) for i, part in enumerate(_SGR.split(text)))


class VisibleFormatter(logging.Formatter):
    """The agent's log lines (stderr, read by `kubectl logs` and journalctl): each record's message on one
    line with its control characters shown; a traceback keeps its lines."""

    def format(self, record: logging.LogRecord) -> str:
        # The traceback shown here, never the text another handler's formatter left on the record (exc_text:
        # logging's cache, shared by every handler a record reaches), whose control characters would be sent.
        cached, record.exc_text = record.exc_text, None
        try:
            return super().format(record)
        finally:
            record.exc_text = cached

    def formatMessage(self, record: logging.LogRecord) -> str:
        return visible(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return visible_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return visible_lines(super().formatStack(stack_info))
