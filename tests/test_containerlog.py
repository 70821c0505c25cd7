"""The container-log source (oomwatch.sources.containerlog): the kubelet's layout, the latest run's file, only
its end, never through a link or into a FIFO; a pod gone reads as nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from oomwatch.parse.gpulog import GPU
from oomwatch.events import LogRequest
from oomwatch.sources.containerlog import ContainerLogs, container_log_dir, read_log_tail

GPULOG = Path(__file__).resolve().parents[1] / "fixtures" / "gpulogs" / "pytorch-16417-torch2.2-cuda-oom.split.cri.log"


def test_container_log_dir_never_leaves_the_root() -> None:
    assert container_log_dir("/var/log/pods/", "ml", "train-0", "0f1e", "trainer") == \
        "/var/log/pods/ml_train-0_0f1e/trainer"
    for bad in (("..", "p", "u", "c"), ("ns", "p/../../etc", "u", "c"), ("ns", "p", "u", ""),
                ("ns", "p", "u", ".")):
        assert container_log_dir("/var/log/pods", *bad) is None


def test_read_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(b"a" * 100 + b"\nlast line\n")
    assert read_log_tail(str(log), limit=10) == b"last line\n"
    assert read_log_tail(str(log)) == log.read_bytes()
    assert read_log_tail(str(tmp_path / "absent.log")) is None
    os.symlink(log, tmp_path / "link.log")
    assert read_log_tail(str(tmp_path / "link.log")) is None  # not followed
    os.mkfifo(tmp_path / "fifo.log")
    assert read_log_tail(str(tmp_path / "fifo.log")) is None  # does not block on a FIFO
    assert read_log_tail(str(tmp_path)) is None


def test_the_latest_run_of_the_container_is_read(tmp_path: Path) -> None:
    folder = tmp_path / "ml_train-0_0f1e" / "trainer"
    folder.mkdir(parents=True)
    shutil.copy(GPULOG, folder / "1.log")  # the run that died: restart count 1
    (folder / "0.log").write_text("2026-11-26T10:00:00.000000000Z stdout F an earlier run ended well\n")
    (folder / "notes.txt").write_text("CUDA out of memory. Tried to allocate 2.00 GiB\n")  # not a run's log
    logs, request = ContainerLogs(str(tmp_path)), LogRequest("/kubepods/ctr", "ml", "train-0", "0f1e", "trainer")
    answer = logs.read(request)
    assert answer.key == "/kubepods/ctr"
    assert answer.finding is not None and answer.finding.memory == GPU and answer.finding.device == 0
    (folder / "2.log").write_text("2026-11-26T10:05:00.000000000Z stdout F restarted, training again\n")
    assert logs.read(request).finding is None


def test_a_pod_without_logs_reads_as_nothing(tmp_path: Path) -> None:
    logs = ContainerLogs(str(tmp_path))
    assert logs.read(LogRequest("k", "ml", "gone-0", "0f1e", "trainer")).finding is None
    assert logs.read(LogRequest("k", "ml", "..", "0f1e", "trainer")).finding is None
    (tmp_path / "ml_empty-0_0f1e" / "trainer").mkdir(parents=True)
    assert logs.read(LogRequest("k", "ml", "empty-0", "0f1e", "trainer")).finding is None
