"""Issue 31, finding 7: the one label-value policy (docs/contract.md "Label values") on every label the collector
exports. An ownerReference's kind and name are free text from the API server (checked only non-empty): a name of
300,000 characters with NUL and ESC was a 600 kB line per pod per scrape, its control characters kept. Now every
value is at most LABEL_VALUE_MAX characters and a marker, without a control character, and two different names
never share a value."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from oomwatch.model import CgroupStats, Workload
from oomwatch.sinks.collector import LABEL_VALUE_MAX, NodeInfo, OomwatchCollector, label_value
from oomwatch.pipeline import Settings
from oomwatch.sources.cgroupfs import Proc
from oomwatch.store import Store
from tests.conftest import BOOT_TIME, DETECTED_AT, FIXTURES
from tests.replay import Replay, tree_events
from tests.test_collector import ReferenceCollector, reference_text
from tests.test_golden import golden_config

# Bytes of the body but its line ends that a control character would be (C0, DEL; C1 and bidi as UTF-8).
CONTROL_BYTES = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]")


def pods_owned_by(owners: list[dict[str, str]]) -> tuple[OomwatchCollector, ReferenceCollector]:
    """Ours and prometheus_client's collector of one pod per owner (kind, name as the API server gave them)."""
    rows, live = [], []
    store = Store()
    for i, owner in enumerate(owners):
        labels = ("ml", f"train-{i}", "", "")
        w = Workload(type="k8s-pod", cgroup=f"/kubepods/pod{i}", namespace="ml", pod=f"train-{i}", owner=owner)
        rows.append((w.cgroup, labels, w))
        store.seen(labels)
        live.append((labels, CgroupStats(path=w.cgroup, oom_group=1, events={}, limit_bytes=1.0, usage_bytes=1)))

    def info() -> NodeInfo:
        return NodeInfo("6.1\x1b]0;x\x07", "2", "false")

    return (OomwatchCollector(store, lambda: live, info, workloads=lambda: rows),
            ReferenceCollector(store, lambda: live, info, workloads=lambda: rows))


def test_a_huge_owner_name_with_nul_and_esc_is_cut_shown_and_told_apart() -> None:
    huge = "a" * 150_000 + "\x00\x1b]52;c;cHduZWQ=\x07" + "b" * 150_000
    other = "a" * 150_000 + "c" * 150_000  # the same first 1,024 characters
    collector, reference = pods_owned_by([{"kind": "Job\x1b[2J", "name": huge}, {"kind": "Job", "name": other}])
    body = collector.exposition()
    assert body == reference_text(reference)  # prometheus_client writes the same, byte for byte
    lines = [line for line in body.split(b"\n") if line.startswith(b"oomwatch_workload_job_info")]
    assert len(lines) == 2 and all(len(line) < 3 * LABEL_VALUE_MAX for line in lines), [len(x) for x in lines]
    assert not CONTROL_BYTES.search(body)
    samples = [s.labels for f in text_string_to_metric_families(body.decode()) for s in f.samples
               if s.name == "oomwatch_workload_job_info"]
    names = sorted(s["owner_name"] for s in samples)
    assert len(set(names)) == 2 and all(n.startswith("a" * 1024 + "…[cut: ") for n in names)
    assert {s["owner_kind"] for s in samples} == {"Job", "Job\\x1b[2J"}
    assert 'kernel="6.1\\\\x1b]0;x\\\\x07"' in body.decode()  # the node's labels too


def test_every_value_is_bounded_shown_and_one_to_one() -> None:
    """Every escape the policy writes cannot be told from a name that spells it out: that name's backslash is
    escaped too. (A byte that is not UTF-8 and the text `\\xNN` are still one name: the kernel log's decoding
    makes them one before any label is built, oomwatch.parse.kmsg.unescape.)"""
    names = ["a\x1bb", "a\\x1bb", "a\\x5cx1bb", "\\", "\\\\", "\x85", "\\u0085", "\u202e", "\\u202e", "\n", "\\n",
             "k" * LABEL_VALUE_MAX, "k" * (LABEL_VALUE_MAX + 1), "k" * LABEL_VALUE_MAX + "…[cut: 1025 characters"]
    values = [label_value(n) for n in names]
    assert len(set(values)) == len(names), values
    for value in values:
        assert not re.search("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]", value)
        assert len(value) <= LABEL_VALUE_MAX + 64


def test_a_name_that_spells_a_byte_out_and_the_byte_are_two_series(tmp_path: Path) -> None:
    """Two cgroups a user may make side by side: `x\\xff.service` (a backslash, then `xff`) and `x<0xff>.service`.
    Read from the tree, through the pipeline, each must be its own series."""
    case = FIXTURES / "golden" / "memcg-scenarios"
    tree = tmp_path / "cgroup"
    shutil.copytree(case / "cgroup", tree)
    for name in (b"x\\xff.service", b"x\xff.service"):
        directory = os.path.join(os.fsencode(tree), name)
        os.mkdir(directory)
        for f in (tree / "a").iterdir():
            shutil.copyfile(f, os.path.join(directory, os.fsencode(f.name)))
    config = dataclasses.replace(golden_config(case, tmp_path), cgroup_root=str(tree))
    replay = Replay(Settings(boot_id=Proc(config.proc).boot_id(), boot_time=BOOT_TIME, kmsg_source=None,
                             counting=False), now=DETECTED_AT)
    replay.run(tree_events(tree))
    families = {f.name: f for f in text_string_to_metric_families(replay.metrics(config).decode())}
    cgroups = [s.labels["cgroup"] for s in families["oomwatch_memory_usage_bytes"].samples
               if s.labels["cgroup"].startswith("/x")]
    assert len(cgroups) == 2 and len(set(cgroups)) == 2, cgroups
