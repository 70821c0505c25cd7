"""The agent's log is written by a thread of its own (oomwatch.logwriter): a stderr that takes nothing must not
stall the loop that logs each incident, and what was logged comes out whole and in order once it takes lines."""

from __future__ import annotations

import io
import logging
import threading

from oomwatch import logwriter
from oomwatch.logwriter import BackgroundLogHandler


class StalledStream(io.StringIO):
    """A stream whose writes wait until released (a full pipe, a journald that does not read)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.writing = threading.Event()

    def write(self, text: str) -> int:
        self.writing.set()
        assert self.release.wait(30)
        return super().write(text)


def logger_to(handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(f"oomwatch.test_logwriter.{id(handler)}")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_a_stalled_stream_does_not_stall_the_logger_and_gets_every_line_in_order() -> None:
    stream = StalledStream()
    handler = BackgroundLogHandler(stream, logging.Formatter("%(message)s"))
    logger = logger_to(handler)
    logger.info("line 0")
    assert stream.writing.wait(10)  # the writer holds line 0, stuck in write()
    for n in range(1, 200):  # each returns at once: queued, not written
        logger.info("line %d", n)
    assert stream.getvalue() == ""
    stream.release.set()
    handler.close()
    assert stream.getvalue().splitlines() == [f"line {n}" for n in range(200)]


def test_past_the_backlog_lines_are_counted_and_said_when_the_stream_takes_lines_again(monkeypatch) -> None:
    monkeypatch.setattr(logwriter, "BACKLOG", 5)
    stream = StalledStream()
    handler = BackgroundLogHandler(stream, logging.Formatter("%(message)s"))
    logger = logger_to(handler)
    logger.info("first")
    assert stream.writing.wait(10)
    for n in range(8):  # 5 fit behind the one being written; 3 do not
        logger.info("queued %d", n)
    assert handler.dropped == 3
    stream.release.set()
    handler.close()
    lines = stream.getvalue().splitlines()
    assert lines == ["first", "(3 log lines dropped: the log's stream took none for 5 lines)",
                     "queued 0", "queued 1", "queued 2", "queued 3", "queued 4"]


def writer_threads() -> set:
    return {thread for thread in threading.enumerate() if thread.name == "log-writer"}


def test_a_closed_stream_is_not_an_error() -> None:
    stream = io.StringIO()
    before = writer_threads()
    handler = BackgroundLogHandler(stream, logging.Formatter("%(message)s"))
    (writer,) = writer_threads() - before
    stream.close()
    logger_to(handler).error("said to nobody")
    handler.close()  # returns: the writer took the line and went on
    assert not writer.is_alive()


def test_the_lines_logged_last_are_written_at_exit(tmp_path) -> None:
    """logging.shutdown (atexit) closes the handler holding its lock: the writer must still write what is
    queued (`oomwatch agent`'s last line, "agent stopped", was lost so)."""
    import subprocess
    import sys

    script = ("import logging, sys\n"
              "from oomwatch.logwriter import BackgroundLogHandler\n"
              "logging.basicConfig(level='INFO', handlers=[BackgroundLogHandler(sys.stderr, "
              "logging.Formatter('%(message)s'))])\n"
              "for n in range(500):\n"
              "    logging.info('line %d', n)\n"
              "logging.info('agent stopped')\n"
              "sys.exit(0)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stderr.splitlines() == [f"line {n}" for n in range(500)] + ["agent stopped"]
