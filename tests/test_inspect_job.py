"""`oomwatch inspect --job NAME`: a job's kills from the agent's incidents (its events file, or /incidents over HTTP)
and whether each restart of its pods followed one, on a node laid out as the kubelet and containerd lay it out.

The node is the golden k8s-runc fixture copied into a temporary directory, so its container cgroup is created now:
its creation is the container's current run's start, as on a live node, and the kills are dated around it. The
kill itself is the golden one (fixtures/golden/k8s-runc/expected-incidents.json, the real group kill of
ml/train-0 trainer), with the pod's job and owner the agent adds with API access (docs/contract.md `workload`)."""

from __future__ import annotations

import copy
import http.server
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from oomwatch.cli import main
from oomwatch.jobreport import after_kill, is_jobs, job_of, parse_events_lines
from oomwatch.timefmt import iso8601
from tests.conftest import FIXTURES

GOLDEN = FIXTURES / "golden" / "k8s-runc"
POD_UID = "0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f"
CURRENT_RUN = "4f2a9c1e7b3d5a6c8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d"
EARLIER_RUN = "e" * 64
JOBSET = {"kind": "JobSet", "name": "train"}
OWNER = {"kind": "Job", "name": "train-workers-0"}


def golden_kill() -> dict[str, Any]:
    (incident,) = json.loads((GOLDEN / "expected-incidents.json").read_text())
    return incident


class Node:
    """The golden node's tree, runtime bundles and pod log files, made now; `started`: the trainer container's
    current run's start (its cgroup's creation)."""

    def __init__(self, tmp: Path, restarts: int = 1) -> None:
        self.root = tmp / "node"
        for part in ("cgroup", "run", "proc", "kubelet"):
            shutil.copytree(GOLDEN / part, self.root / part, symlinks=True)
        logs = self.root / "pods" / f"ml_train-0_{POD_UID}" / "trainer"
        logs.mkdir(parents=True)
        for n in range(restarts + 1):
            (logs / f"{n}.log").write_text("")
        container = self.root / "cgroup" / "kubepods" / "burstable" / f"pod{POD_UID}" / CURRENT_RUN
        self.started = os.stat(container).st_ctime

    def args(self) -> list[str]:
        r = self.root
        return ["--cgroup-root", str(r / "cgroup"), "--proc", str(r / "proc"), "--run-root", str(r / "run"),
                "--pod-log-dir", str(r / "pods"), "--kubelet-config", str(r / "kubelet" / "config.yaml")]


def kill(at: float, container_id: str, **changes: Any) -> dict[str, Any]:
    incident = copy.deepcopy(golden_kill())
    incident["time"] = iso8601(at)
    incident["workload"].update(container_id=container_id, job=dict(JOBSET), owner=dict(OWNER))
    incident.update(changes)
    return incident


def events_file(tmp: Path, incidents: list[dict[str, Any]], torn: bool = False) -> Path:
    path = tmp / "events.jsonl"
    lines = [json.dumps(i) for i in incidents]
    if torn:
        lines.insert(1, lines[0][:57])  # a line the agent was writing when it crashed, ended by the next
    path.write_text("\n".join(lines) + "\n")
    return path


def inspect_job(node: Node, *args: str) -> Any:
    result = CliRunner().invoke(main, ["inspect", *node.args(), *args], catch_exceptions=False)
    return result


@pytest.fixture
def jobset_node(tmp_path: Path):
    """A JobSet worker's trainer, group-killed 20 s before its current run began (the restart followed it) and
    killed again in that run; and a kill of another job's pod on the same node."""
    node = Node(tmp_path)
    earlier = kill(node.started - 20, EARLIER_RUN)
    current = kill(node.started + 5, CURRENT_RUN, kind="single")
    other = kill(node.started - 100, "d" * 64)
    other["workload"].update(namespace="shop", pod="web-5d8f-abcde", job=None,
                             owner={"kind": "ReplicaSet", "name": "web-5d8f"})
    return node, [other, earlier, current]


def test_a_jobsets_kills_and_what_followed_them(jobset_node, tmp_path: Path) -> None:
    node, incidents = jobset_node
    result = inspect_job(node, "--job", "train", "--incidents", str(events_file(tmp_path, incidents)),
                         "--no-color")
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.startswith("Job train (JobSet train)\n")
    assert "2 OOM kills on this node (1 group kill) in 1 pod, of the 3 incidents of" in " ".join(out.split())
    assert "ml/train-0: 2 kills, 1 group" in out
    restart = " ".join(out.split("Restarts of the job's pods on this node\n")[1].split("\n\n")[0].split())
    assert restart.startswith("ml/train-0 trainer: restarted 1x; the last restart followed an OOM kill (dd killed "
                              "at ") and "20 s before the current run began)" in restart
    after = " ".join(out.split("After each kill\n")[1].split("\n\n")[0].split())
    assert "ml/train-0 trainer: no restart since: the container runs on in the run that was hit" in after
    assert ("ml/train-0 trainer: restarted since: its current run began at " in after
            and "20 s after the kill (a group kill of the container: the kill ended that run)" in after)
    assert after.index("no restart since") < after.index("restarted since")  # newest first
    # the kills themselves, as inspect shows them, with the agent's explanation
    assert "Recent OOM kills (2, newest first)" in out and "memory.oom.group=1 on the container also" in out
    assert "shop/web-5d8f" not in out
    assert all(len(line) <= 80 for line in out.splitlines())


def test_json_says_the_same(jobset_node, tmp_path: Path) -> None:
    node, incidents = jobset_node
    result = inspect_job(node, "--job", "ml/train", "--incidents", str(events_file(tmp_path, incidents)), "--json")
    report = json.loads(result.output)
    assert report["jobs"] == [JOBSET] and report["kills"] == 2 and report["group_kills"] == 1
    assert report["pods"] == [{"namespace": "ml", "pod": "train-0", "kills": 2, "group_kills": 1}]
    (restart,) = report["restarts"]
    assert restart["restarts"] == 1 and restart["oom_kill"] is True and restart["container"] == "trainer"
    assert [a["restarted"] for a in report["after_kill"]] == [False, True]
    assert [i["workload"]["container_id"] for i in report["incidents"]] == [CURRENT_RUN, EARLIER_RUN]


def test_the_agents_incidents_over_http(jobset_node) -> None:
    """The same report from the agent's /incidents (a JSON array, newest last), served on the loopback."""
    node, incidents = jobset_node
    body = json.dumps(incidents).encode()

    class Agent(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            status = 200 if self.path == "/incidents" else 404
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body if status == 200 else b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Agent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = inspect_job(node, "--job", "train", "--incidents", f"http://127.0.0.1:{server.server_port}",
                             "--json")
    finally:
        server.shutdown()
        server.server_close()
    report = json.loads(result.output)
    assert report["source"] == f"http://127.0.0.1:{server.server_port}" and report["kills"] == 2
    assert report["restarts"][0]["oom_kill"] is True


def test_other_jobs_namespaces_and_times_are_left_out(jobset_node, tmp_path: Path) -> None:
    node, incidents = jobset_node
    path = str(events_file(tmp_path, incidents))
    assert json.loads(inspect_job(node, "--job", "other/train", "--incidents", path, "--json").output)["kills"] == 0
    # the Deployment's pod: its job is its controlling owner, as the metric names it
    shop = json.loads(inspect_job(node, "--job", "web-5d8f", "--incidents", path, "--json").output)
    assert shop["jobs"] == [{"kind": "ReplicaSet", "name": "web-5d8f"}] and shop["kills"] == 1
    assert shop["after_kill"][0]["restarted"] is None  # that pod is not on this node now
    # --since: the kill in the current run only (5 s after it began; the earlier one 20 s before)
    since = iso8601(node.started).replace(".000000", "")
    recent = json.loads(inspect_job(node, "--job", "train", "--incidents", path, "--since", since, "--json").output)
    assert recent["kills"] == 1 and recent["incidents"][0]["workload"]["container_id"] == CURRENT_RUN


def test_a_torn_line_of_the_events_file_is_skipped_and_said(jobset_node, tmp_path: Path) -> None:
    node, incidents = jobset_node
    result = inspect_job(node, "--job", "train", "--incidents", str(events_file(tmp_path, incidents, torn=True)))
    assert result.exit_code == 0
    assert "note: 1 line of" in result.output and "is not an incident" in " ".join(result.output.split())
    assert "2 OOM kills on this node" in " ".join(result.output.split())


def test_without_the_agents_incidents_the_kernel_log_names_no_kubernetes_job(tmp_path: Path) -> None:
    """The golden kernel log holds the kill of ml/train-0, but not its job: none found, and the report says where
    to read them."""
    node = Node(tmp_path)
    result = inspect_job(node, "--job", "train", "--kmsg", str(GOLDEN / "kmsg"), "--boot-time",
                         "2026-11-22T20:40:00Z")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "0 OOM kills on this node" in text and "of the 1 incident of" in text
    assert "pass --incidents with the agent's /incidents URL or its events file" in text


def test_errors_name_the_source_and_the_flag(tmp_path: Path) -> None:
    node = Node(tmp_path)
    missing = inspect_job(node, "--job", "train", "--incidents", str(tmp_path / "nope.jsonl"))
    assert missing.exit_code == 1 and "cannot read the incidents:" in missing.output and "nope.jsonl" in missing.output
    alone = inspect_job(node, "--incidents", str(tmp_path / "nope.jsonl"))
    assert alone.exit_code == 2 and "--incidents goes with --job NAME" in alone.output


# --- the pure parts ------------------------------------------------------------------------------------


def test_slurm_jobs_and_the_jobs_the_metric_names() -> None:
    slurm = {"workload": {"type": "slurm", "slurm_job": "4242", "slurm_step": "0"}, "time": None}
    assert job_of(slurm["workload"]) == ("SlurmJob", "4242") and is_jobs(slurm, "4242")
    assert not is_jobs(slurm, "ml/4242")  # a namespace: Kubernetes only
    assert job_of({"job": JOBSET, "owner": OWNER}) == ("JobSet", "train")
    assert job_of({"owner": OWNER}) == ("Job", "train-workers-0")
    assert job_of({"namespace": "default", "pod": "bare"}) is None
    both = {"workload": {"namespace": "ml", "job": JOBSET, "owner": OWNER}}
    assert is_jobs(both, "train") and is_jobs(both, "train-workers-0") and is_jobs(both, "ml/train")


def test_events_lines() -> None:
    t = '"2026-11-22T20:40:09.000000Z"'
    incidents, bad = parse_events_lines([f'{{"time": {t}, "workload": {{}}}}', '{"time": "t", "work', "",
                                         "2026-11-22 agent log line", '{"other": 1}',
                                         f'{{"record": "death", "time": {t}, "workload": {{}}, '
                                         '"cause": "userspace"}'])
    assert len(incidents) == 1 and bad == 3  # a death's verdict is not an incident, nor a bad line


def test_after_a_kill_without_run_ids_times_decide() -> None:
    run = {"container_id": None, "run_started": 1000.0}
    before = {"time": iso8601(990.0), "workload": {}, "kind": "single"}
    after = {"time": iso8601(1010.0), "workload": {}, "kind": "single"}
    assert after_kill(before, run)["restarted"] is True and "10 s after the kill" in after_kill(before, run)["why"]
    assert after_kill(after, run)["restarted"] is False
    assert after_kill(after, None)["restarted"] is None


def test_the_jobs_deaths_from_the_events_file_are_shown_and_are_not_kills(jobset_node, tmp_path: Path) -> None:
    """A death's verdict (the pipeline's own line, "record": "death") of the job's container in the events file:
    listed under the job's deaths, never counted as one of its kills."""
    from oomwatch.deaths import SIGKILL
    from oomwatch.events import ProcessExeced, ProcessExited
    from tests.test_pipeline_deaths import BOOT, CONTAINER, k8s_node

    node, incidents = jobset_node
    replay, recorded = k8s_node(tmp_path / "replay")
    recorded.close()
    replay.step(ProcessExeced(5001, CONTAINER, 1, "python3"), BOOT + 1.0)
    replay.step(ProcessExited(5001, SIGKILL, node.started + 30), BOOT + 5.0)
    replay.settle()
    (death,) = replay.deaths
    line = death.to_json()
    line["workload"].update(job=dict(JOBSET), owner=dict(OWNER))
    path = events_file(tmp_path, incidents + [line])
    result = inspect_job(node, "--job", "train", "--incidents", str(path), "--no-color")
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "2 OOM kills on this node (1 group kill) in 1 pod, of the 3 incidents of" in out
    assert "not an incident" not in out  # the death's line is not a bad line either
    deaths = out.split("Deaths of the job's processes (verdicts; only kernel-oom ones are OOM kills) ")[1]
    assert deaths.split(" Recent OOM kills")[0].endswith(
        "userspace by unknown: ml/train-0 trainer: python3 (pid 5001) was killed with SIGKILL by another process "
        "(the node does not say which), not by the kernel's OOM killer: no OOM kill of it is in the kernel log or "
        "memory.events.")
    report = json.loads(inspect_job(node, "--job", "train", "--incidents", str(path), "--json").output)
    assert [d["cause"] for d in report["deaths"]] == ["userspace"] and report["kills"] == 2


# --- hostile input (issue 31, finding 9) ---------------------------------------------------------------------

WRONG_TYPES = [
    {"workload": "ml/train-0"},  # a string where an object belongs
    {"killed": {"pid": 1}},
    {"killed": [{"pid": "1", "comm": "dd"}]},
    {"killed": [{"pid": 1}]},  # no comm
    {"time": 42},
    {"time": "yesterday"},
    {"victim": ["dd"]},
    {"kind": ["group"]},
    {"explanation": {"text": "x"}},
    {"top_holders": [{"pid": 1, "comm": "dd", "rss_bytes": "a lot"}]},
    {"memory_breakdown": {"anon_bytes": [1]}},
    {"pools": [7]},
    {"deep": json.loads("[" * 40 + "]" * 40)},  # deeper than any incident, within json's own recursion
]


def hostile_records(incidents: list[dict[str, Any]]) -> list[Any]:
    """`incidents`, and after them each wrong type put into a copy of the job's kill."""
    records: list[Any] = list(incidents)
    for change in WRONG_TYPES:
        bad = copy.deepcopy(incidents[-1])
        if "workload" in change and isinstance(change["workload"], str):
            bad["workload"] = change["workload"]
        else:
            bad.update(change)
        records.append(bad)
    job_changes = [{"job": "train"}, {"owner": ["Job", "train"]}, {"namespace": 7}]
    for change in job_changes:
        bad = copy.deepcopy(incidents[-1])
        bad["workload"].update(change)
        records.append(bad)
    return records


def test_records_of_the_wrong_types_are_skipped_and_counted(jobset_node, tmp_path: Path) -> None:
    node, incidents = jobset_node
    path = events_file(tmp_path, hostile_records(incidents))
    with path.open("a") as f:
        f.write(json.dumps({"record": "death", "time": 7, "workload": "x", "cause": "userspace"}) + "\n")
        f.write(json.dumps({"record": "death", "time": "2026-11-22T20:40:09.000000Z", "workload": {"pod": []}})
                + "\n")
    for output in ("--no-color", "--json"):
        result = inspect_job(node, "--job", "train", "--incidents", str(path), output)
        assert result.exit_code == 0, result.output
        text = result.output if output == "--no-color" else " ".join(json.loads(result.output)["notes"])
        flat = " ".join(text.split())
        skipped = len(WRONG_TYPES) + 3 + 2
        assert f"{skipped} records of {path} have fields of the wrong type: skipped (the first: workload is str)" \
            in flat, flat
    report = json.loads(inspect_job(node, "--job", "train", "--incidents", str(path), "--json").output)
    assert report["kills"] == 2 and report["in_source"] == 3  # the good ones, as without the bad


def test_the_agents_answer_of_the_wrong_types_is_skipped_and_counted(jobset_node) -> None:
    node, incidents = jobset_node
    with agent_answering(json.dumps(hostile_records(incidents) + [7, "x", None]).encode()) as url:
        result = inspect_job(node, "--job", "train", "--incidents", url, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["kills"] == 2 and report["in_source"] == 3
    assert any(f"{len(WRONG_TYPES) + 3 + 3} records of" in note for note in report["notes"]), report["notes"]


def test_json_nested_100000_deep_is_refused_cleanly(jobset_node, tmp_path: Path) -> None:
    node, incidents = jobset_node
    deep = "[" * 100_000 + "]" * 100_000
    path = tmp_path / "deep.jsonl"
    path.write_text(deep + "\n" + "".join(json.dumps(i) + "\n" for i in incidents))
    result = inspect_job(node, "--job", "train", "--incidents", str(path), "--no-color")
    assert result.exit_code == 0, result.output
    assert f"1 line of {path} is not an incident" in " ".join(result.output.split())
    with agent_answering(deep.encode()) as url:
        result = inspect_job(node, "--job", "train", "--incidents", url)
    assert result.exit_code == 1
    assert f"cannot read the incidents: {url}/incidents: nested too deep" in result.output


def test_a_server_that_trickles_is_cut_off_at_the_deadline(jobset_node, monkeypatch: pytest.MonkeyPatch) -> None:
    """One byte at a time, each well within the per-read timeout: only an overall deadline ends it."""
    import time

    from oomwatch import jobreport

    monkeypatch.setattr(jobreport, "URL_DEADLINE", 1.0)
    node, _ = jobset_node
    for headers_too in (False, True):
        with agent_answering(b"[" * 100, trickle=0.2, headers_too=headers_too) as url:
            started = time.monotonic()
            result = inspect_job(node, "--job", "train", "--incidents", url)
            took = time.monotonic() - started
        assert result.exit_code == 1, result.output
        assert f"{url}/incidents: no complete answer within 1 s" in result.output
        assert took < 3.0


def test_a_fifo_is_not_an_events_file(jobset_node, tmp_path: Path) -> None:
    node, _ = jobset_node
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    # (a reader that opened it would wait for a writer: this one comes after 5 s, to end such a wait)
    writer = threading.Timer(5.0, lambda: os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)))
    writer.start()
    try:
        result = inspect_job(node, "--job", "train", "--incidents", str(fifo))
    finally:
        writer.cancel()
    assert result.exit_code == 1
    assert f"cannot read the incidents: {fifo}: not a regular file" in result.output


class agent_answering:
    """An HTTP server on the loopback answering every GET with `body` (JSON): at once, or `trickle`-d one byte
    at a time (`headers_too`: its status line and headers as well), for at most 8 s."""

    def __init__(self, body: bytes, trickle: float = 0.0, headers_too: bool = False) -> None:
        import socketserver

        self.stop = threading.Event()
        stop = self.stop

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.recv(65536)
                head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body))
                if not trickle:
                    self.request.sendall(head + body)
                    return
                if not headers_too:
                    self.request.sendall(head)
                deadline = threading.Event()
                threading.Timer(8.0, deadline.set).start()
                for byte in ((head if headers_too else b"") + body):
                    if stop.is_set() or deadline.is_set():
                        return
                    try:
                        self.request.sendall(bytes([byte]))
                    except OSError:
                        return
                    stop.wait(trickle)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
