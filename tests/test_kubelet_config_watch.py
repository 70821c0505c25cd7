"""The kubelet's OOM policy is read again when its config file changes (written in place or replaced by a rename),
not at each scrape or incident, and not on a timer (an idle agent does not wake up)."""

from __future__ import annotations

import os
import queue
from pathlib import Path

from oomwatch.config import Config
from oomwatch.events import PostureRead
from oomwatch.node import NodePosture
from oomwatch.sources.cgroupfs import Proc
from oomwatch.sources.kubeletconfig import KubeletConfigWatch
from tests.conftest import FIXTURES

KIND = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def test_a_changed_kubelet_config_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(KIND + "singleProcessOOMKill: false\n")
    golden = FIXTURES / "golden" / "k8s-runc"  # a cgroup v2 node: the policy is what the file says
    posture = NodePosture(Config(kubelet_config=str(path), cgroup_root=str(golden / "cgroup")),
                          Proc(str(golden / "proc")))
    events: queue.SimpleQueue = queue.SimpleQueue()
    watch = KubeletConfigWatch(str(path), posture.single_process_oom_kill, events.put)
    watch.start()
    try:
        path.write_text(KIND + "singleProcessOOMKill: true\n")
        assert events.get(timeout=10) == PostureRead("true")
        replacement = tmp_path / "config.yaml.new"  # how config managers write: a new file renamed over it
        replacement.write_text(KIND + "singleProcessOOMKill: false\n")
        os.rename(replacement, path)
        seen = events.get(timeout=10)
        while not events.empty():
            seen = events.get()
        assert seen == PostureRead("false")
    finally:
        watch.stop()


def test_no_kubelet_directory_means_nothing_to_watch(tmp_path: Path) -> None:
    emitted: list = []
    watch = KubeletConfigWatch(str(tmp_path / "absent" / "config.yaml"), lambda: "unknown", emitted.append)
    watch.start()  # no error
    assert not watch.watching
    watch.stop()
    assert emitted == []
    present = KubeletConfigWatch(str(tmp_path / "config.yaml"), lambda: "unknown", emitted.append)
    present.start()  # the check can fail: with the directory there, a thread watches it
    try:
        assert present.watching
    finally:
        present.stop()
    assert not present.watching
