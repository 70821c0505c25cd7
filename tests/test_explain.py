"""One plain sentence per incident, with its own wording for each kind of OOM (issue: pod-scope group kills,
global OOMs and kubepods-level OOMs)."""

from __future__ import annotations

from oomwatch.explain import explain, size
from oomwatch.model import Incident, KilledProcess
from oomwatch.workloads import identify

POD = "/kubepods/burstable/pod0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f"
CTR = POD + "/4f2a9c1e7b3d5a6c8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d"
MIB = 1 << 20


def proc(pid: int, comm: str, cgroup: str = CTR) -> KilledProcess:
    return KilledProcess(pid=pid, comm=comm, cgroup=cgroup)


def incident(kind="group", scope="container", oom=CTR, group=CTR, killed=None, limit=64 * MIB,
             constraint="memcg", named=True, trigger=None) -> Incident:
    killed = killed or (proc(138, "dd"), proc(120, "sh"))
    w = identify(killed[0].cgroup)
    if named and w.is_kubernetes:
        from dataclasses import replace

        w = replace(w, namespace="ml", pod="train-0", container="trainer" if w.type == "k8s-container" else None)
    return Incident(time=0.0, boot_id="b", kernel_seq=1, kind=kind, constraint=constraint, scope=scope,
                    oom_cgroup=oom, group_cgroup=group, trigger=trigger or {"pid": killed[0].pid, "comm": killed[0].comm},
                    memory={"usage_bytes": limit, "limit_bytes": limit} if limit else None, victim=killed[0],
                    killed=tuple(killed), workload=w, explanation="", detected_at=0.0)


def test_container_group_kill_says_what_single_process_kill_would_have_done() -> None:
    text = explain(incident(), single_process_oom_kill="false")
    assert text == ("ml/train-0 trainer: dd (pid 138) pushed the container past its 64 MiB limit; "
                    "memory.oom.group=1 on the container also killed sh. With singleProcessOOMKill=true only "
                    "dd would have died.")


def test_single_kill() -> None:
    text = explain(incident(kind="single", group=None, killed=(proc(138, "dd"),)), "true")
    assert text.startswith("ml/train-0 trainer: dd (pid 138) pushed the container past its 64 MiB limit and was "
                           "killed alone (memory.oom.group=0)")


def test_pod_scope_group_kill_of_one_container_and_of_the_whole_pod() -> None:
    one = explain(incident(scope="pod", oom=POD, limit=96 * MIB))
    assert one.startswith("ml/train-0 trainer: the pod's 96 MiB limit was hit; the kernel chose dd (pid 138) and "
                          "memory.oom.group=1 on the container also killed sh")
    assert "every container" not in one
    other = proc(150, "sleep", POD + "/" + "9" * 64)
    whole = explain(incident(scope="pod", oom=POD, group=POD, limit=96 * MIB, killed=(proc(138, "dd"), other)))
    assert "memory.oom.group=1 on the pod also killed sleep; every container of the pod died" in whole


def test_global_oom_has_its_own_wording() -> None:
    text = explain(incident(scope="node", oom="/", constraint="global", limit=None))
    assert text.startswith("The node ran out of memory (no cgroup limit was hit); the kernel chose dd (pid 138) "
                           "of ml/train-0 trainer, and memory.oom.group=1 on the container also killed sh.")
    assert "Reserve memory for the system" in text


def test_kubepods_level_oom_is_node_pressure() -> None:
    text = explain(incident(scope="node", oom="/kubepods", limit=8 << 30))
    assert text.startswith("Pods on this node together hit the kubepods limit (8 GiB, node allocatable)")
    assert "eviction" in text


def test_trigger_other_than_victim_and_unnamed_containers() -> None:
    text = explain(incident(kind="single", group=None, killed=(proc(200, "java"),), named=False,
                            trigger={"pid": 201, "comm": "python3"}))
    assert text.startswith("pod 0b0c6b3e container 4f2a9c1e7b3d: python3 (pid 201) pushed the container past its "
                           "64 MiB limit and the kernel killed java (pid 200)")


def test_slurm_and_systemd_workloads() -> None:
    step = "/system.slice/slurmstepd.scope/job_4242/step_0"
    slurm = explain(incident(scope="cgroup", oom=step, group=step + "/user", limit=8 << 30,
                             killed=(proc(1, "python", step + "/user/task_0"), proc(2, "python", step + "/user/task_1"))))
    assert slurm.startswith("Slurm job 4242 step 0: python (pid 1) pushed")
    assert "also killed python" in slurm and "singleProcessOOMKill" not in slurm
    unit = "/system.slice/nginx.service"
    text = explain(incident(kind="single", scope="cgroup", oom=unit, group=None, killed=(proc(9, "nginx", unit),)))
    # systemd's words: the unit's MemoryMax, and what its default OOMPolicy=stop does to the rest of it
    assert text == ("nginx.service: nginx (pid 9) pushed the unit past its MemoryMax (64 MiB) and was killed alone "
                    "(memory.oom.group=0); systemd then stops the rest of the unit unless its OOMPolicy=continue.")
    node = explain(incident(kind="single", scope="node", oom="/", group=None, constraint="global", limit=None,
                            killed=(proc(9, "nginx", unit),)))
    assert "kubelet" not in node and "MemoryMax" in node  # no kubelet on a plain systemd host


def test_a_single_kill_of_another_process_than_the_one_that_pushed() -> None:
    """Real text from the Slurm tier: worker1 allocated, the kernel chose worker0."""
    step = "/system.slice/slurmstepd.scope/job_4/step_0"
    text = explain(incident(kind="single", scope="cgroup", oom=step, group=None, killed=(proc(493, "worker0", step),),
                            trigger={"pid": 494, "comm": "worker1", "order": 0}))
    assert "and the kernel killed worker0 (pid 493) alone (memory.oom.group=0); its other processes kept running." \
        in text, text


def test_many_collateral_processes_are_summarised() -> None:
    killed = (proc(1, "torchrun"),) + tuple(proc(10 + i, f"worker{i}") for i in range(6))
    assert "also killed worker0, worker1, worker2 and 3 more" in explain(incident(killed=killed))


def test_sizes() -> None:
    assert [size(64 * MIB), size(1.5 * (1 << 30)), size(None), size(float("inf"))] == ["64 MiB", "1.5 GiB", "?",
                                                                                        "unlimited"]


# --- issue 20, item 4: the explanation names what the log says -------------------------------------------------

def test_a_manual_sysrq_oom_is_not_called_a_shortage() -> None:
    """`sysrq: Manual OOM execution` (order=-1) was explained as "The node ran out of memory … Reserve memory"."""
    text = explain(incident(kind="single", scope="node", oom="/", group=None, constraint="global", limit=None,
                            killed=(proc(812, "postgres", "/system.slice/postgresql.service"),),
                            trigger={"pid": 31, "comm": "kworker/0:1", "order": -1}))
    assert text.startswith("A manual OOM kill (sysrq f")
    assert "postgres (pid 812) of postgresql.service" in text
    assert "ran out" not in text and "Reserve memory" not in text


def test_cpuset_and_mempolicy_ooms_name_their_constraint() -> None:
    cpuset = explain(incident(kind="single", scope="node", oom="/", group=None, constraint="cpuset", limit=None))
    assert cpuset.startswith("The memory nodes ml/train-0 trainer's cpuset allows (cpuset.mems) ran out")
    assert "The node ran out" not in cpuset
    policy = explain(incident(kind="single", scope="node", oom="/", group=None, constraint="mempolicy", limit=None))
    assert policy.startswith("The NUMA nodes dd (pid 138)'s memory policy binds it to")
    assert "The node ran out" not in policy


def test_an_unknown_constraint_says_the_log_does_not_say() -> None:
    text = explain(incident(kind="single", scope="cgroup", oom=None, group=None, constraint="unknown", limit=None))
    assert "the log does not say whether a cgroup limit was hit or the node ran out of memory" in text
