"""A reader more than a ring behind jumps to the newest record instead of chasing the tail."""

from __future__ import annotations

import types

import oomwatch.sources.kmsg as kmsg_module
from oomwatch.sources.kmsg import LiveKmsg, Lost


class RingThatOutruns:
    """read() answers EPIPE, one record, EPIPE again (the kernel overwrote it meanwhile); after lseek(END) the
    newest record, then EAGAIN."""

    def __init__(self) -> None:
        self.script = [BrokenPipeError(), b"6,100,1,-;a\n", BrokenPipeError(), b"6,300,2,-;b\n"]
        self.seeks = []

    def read(self, fd, size):
        if not self.script:
            raise BlockingIOError()
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    def lseek(self, fd, pos, how):
        self.seeks.append(how)
        self.script = [b"6,5000,9,-;newest\n"]
        return 0


def test_chasing_the_tail_jumps_to_the_newest_record(monkeypatch) -> None:
    ring = RingThatOutruns()
    fake_os = types.SimpleNamespace(read=ring.read, lseek=ring.lseek, SEEK_END=2, open=lambda path, flags: 3,
                                    O_RDONLY=0, O_NONBLOCK=0, O_CLOEXEC=0)
    monkeypatch.setattr(kmsg_module, "os", fake_os)
    reader = LiveKmsg("/dev/kmsg")
    reader.open(after_seq=10)
    items = list(reader.read_available())
    assert ring.seeks == [2] and reader.jumps == 1
    assert [type(i).__name__ for i in items] == ["Lost", "KmsgRecord", "Lost", "KmsgRecord"]
    assert [i.count for i in items if isinstance(i, Lost)] == [89, 4899]
    assert items[-1].seq == 5000
