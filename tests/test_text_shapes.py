"""Each shape of oomwatch.parse.textshapes (the text front end's table) on the lines of a real public report,
its source named. Lines are as the reports show them (trimmed to the lines the shape is about); where no public
paste of a shape was found (the CJK dates) the sample is the tool's own format, read from its source.
"""

from __future__ import annotations

import datetime as dt

import pytest

from oomwatch.model import OomKilled, OomSummary
from oomwatch.parse.kmsg import TextLogStats, parse_text_log
from oomwatch.parse.memstat import first_report
from oomwatch.parse.oom import parse_oom_line
from oomwatch.parse.textshapes import LINE_DECORATIONS, local_date

UTC = dt.timezone.utc


def read(text: str, stats: TextLogStats = None) -> list:
    return list(parse_text_log(text.encode().splitlines(), tz=UTC, now=dt.datetime(2026, 11, 28, tzinfo=UTC).timestamp(),
                               stats=stats if stats is not None else TextLogStats()))


def kills(text: str) -> list[tuple[int, str]]:
    return [(line.pid, line.comm) for r in read(text) if type(line := parse_oom_line(r.text)) is OomKilled]


# (decoration, source, text, the kills a person reads in it)
DECORATED = [
    ("vmware.log guest", "https://github.com/vmware/photon/issues/1535",
     "2023-12-04T10:49:30.125Z In(05) vcpu-5 - Guest: <3>[39290745.072599] Killed process 2625 (node) "
     "total-vm:22355612kB, anon-rss:517580kB, file-rss:34160kB, shmem-rss:0kB", [(2625, "node")]),
    ("quote", "https://github.com/kubernetes/kubernetes/issues/56891",
     "> [Thu Dec  7 00:05:15 2017] Killed process 28438 (java) total-vm:20255636kB, anon-rss:466160kB, "
     "file-rss:13684kB", [(28438, "java")]),
    ("inline code", "https://github.com/ClickHouse/ClickHouse/issues/9945",
     "`[2004280.553712] Out of memory: Killed process 28751 (clickhouse-serv) total-vm:9435880kB, anon-rss:2477208kB, "
     "file-rss:0kB, shmem-rss:0kB, UID:107 pgtables:16508kB oom_score_adj:0`", [(28751, "clickhouse-serv")]),
    ("line number", "https://github.com/equinor/ert/issues/9320",
     "  1 [57539.949044] Out of memory: Killed process 328391 (fluvial_facies) total-vm:167572220kB, "
     "anon-rss:163272252kB, file-rss:0kB, shmem-rss:0kB, UID:322617 pgtables:327568kB oom_score_adj:0\n"
     "  2 [625328.156297] Out of memory: Killed process 1597132 (eclipse.exe) total-vm:8069004kB, anon-rss:7239092kB, "
     "file-rss:0kB, shmem-rss:0kB, UID:30521 pgtables:15480kB oom_score_adj:0",
     [(328391, "fluvial_facies"), (1597132, "eclipse.exe")]),
    ("table row", "https://github.com/cloudfoundry/garden-runc-release/issues/193",
     "  | Jun 25, 2021 @ 12:42:11.916 | kernel | [115559.166744] Memory cgroup out of memory: Killed process 2009943 "
     "(envoy) total-vm:3264844kB, anon-rss:19012kB, file-rss:30712kB, shmem-rss:4kB, UID:4294967294 pgtables:740kB "
     "oom_score_adj:0", [(2009943, "envoy")]),
    ("kubectl event", "https://github.com/kubernetes/kubernetes/issues/60492",
     "kernel-monitor, gke-cluster-1-default-pool-81a54c78-gl40\t\t\tWarning\t\tOOMKilling\tMemory cgroup out of memory: "
     "Kill process 1371 (node) score 2081 or sacrifice child\n"
     "Killed process 1371 (node) total-vm:783352kB, anon-rss:201844kB, file-rss:22852kB", [(1371, "node")]),
    ("JSON message field", "https://github.com/kubernetes/node-problem-detector/issues/766",
     '{\n    "reason": "OOMKilling",\n    "message": "Memory cgroup out of memory: Killed process 3504804 (kubectl) '
     'total-vm:753508kB, anon-rss:58776kB, file-rss:29400kB, shmem-rss:0kB, UID:0 pgtables:288kB oom_score_adj:999",',
     [(3504804, "kubectl")]),
    ("syslog tag only", "https://github.com/patroni/patroni/issues/3027",
     "kernel: Killed process 23316 (postgres), UID 101, total-vm:8221844kB, anon-rss:1195384kB, file-rss:19160kB, "
     "shmem-rss:112164kB", [(23316, "postgres")]),
    ("dmesg relative time", "https://github.com/kubernetes/minikube/issues/5751",
     "[  +0.000003] Killed process 16556 (mysqld) total-vm:16816660kB, anon-rss:4469476kB, file-rss:4kB, "
     "shmem-rss:0kB", [(16556, "mysqld")]),
]


def test_every_decoration_of_the_table_has_a_shape_test() -> None:
    assert {d.name for d in LINE_DECORATIONS} == {name for name, *_ in DECORATED}


@pytest.mark.parametrize("name,source,text,expected", DECORATED, ids=[d[0] for d in DECORATED])
def test_a_decorated_line_gives_the_kernels_line(name: str, source: str, text: str, expected: list) -> None:
    assert source.startswith("https://")
    stats = TextLogStats()
    records = read(text, stats)
    assert [(line.pid, line.comm) for r in records if type(line := parse_oom_line(r.text)) is OomKilled] == expected
    assert stats.decorations.get(name), stats.decorations
    assert stats.garbled == 0


def test_a_kernel_line_that_starts_with_a_number_keeps_it() -> None:
    """`0 pages in swap cache` (mm/swap_state.c show_swap_cache_info) is the kernel's text, not a line number:
    no run of numbers, no log line after it (fixtures: e-com-net's CentOS 7 dmesg)."""
    records = read("[511250.459164] 9275 total pagecache pages\n0 pages in swap cache\n1 2 3")
    assert [r.text for r in records] == ["9275 total pagecache pages", "0 pages in swap cache", "1 2 3"]


# --- dates of every locale ----------------------------------------------------------------------------

@pytest.mark.parametrize("stamp,expected", [
    # util-linux's own layouts (po/*.po msgstr of "%a %b %e %H:%M:%S %Y"), glibc's names
    ("Fri Apr 26 10:22:44 2024", (2024, 4, 26, "10:22:44")),  # https://ips99.com/show/1/646639.html
    ("五 4月 26 10:22:44 2024", (2024, 4, 26, "10:22:44")),  # zh_CN: C layout, glibc's names
    ("4月26日(金) 10:22:44 2024", (2024, 4, 26, "10:22:44")),  # ja: %b%e日(%a)
    (" 4月 6日(土) 10:22:44 2024", (2024, 4, 6, "10:22:44")),  # ja: abmon ` 4月`, %e ` 6`
    ("4월 26일 (금) 10:22:44", (None, 4, 26, "10:22:44")),  # ko: no year
    ("Fr, 26. Apr 2024, 10:22:44", (2024, 4, 26, "10:22:44")),  # de
    ("ven. 26 avril 10:22:44 2024", (2024, 4, 26, "10:22:44")),  # fr
    ("mar. 26 déc. 10:22:44 2024", (2024, 12, 26, "10:22:44")),  # fr Tuesday `mar.` is no month
    ("пт 26 апр 2024 10:22:44", (2024, 4, 26, "10:22:44")),  # ru
    ("fre 26 apr 2024 10.22.44", (2024, 4, 26, "10:22:44")),  # sv: %H.%M.%S
    ("xyz 26 qqq 10:22:44 2024", (2024, None, 26, "10:22:44")),  # a month not known: the time stays unknown
])
def test_local_dates_of_dmesg_T_are_read_by_their_parts(stamp: str, expected: tuple) -> None:
    assert tuple(local_date(stamp)) == expected


@pytest.mark.parametrize("line,when", [
    ("[五 4月 26 10:22:44 2024] Out of memory: Killed process 1 (a) total-vm:1kB, anon-rss:1kB, file-rss:0kB",
     dt.datetime(2024, 4, 26, 10, 22, 44, tzinfo=UTC)),
    ("4月 26 10:22:44 host kernel: Out of memory: Killed process 1 (a) total-vm:1kB, anon-rss:1kB, file-rss:0kB",
     dt.datetime(2026, 4, 26, 10, 22, 44, tzinfo=UTC)),  # journalctl in zh_CN (year guessed)
    (" 4月 26 10:22:44 host kernel: Out of memory: Killed process 1 (a) total-vm:1kB, anon-rss:1kB, file-rss:0kB",
     dt.datetime(2026, 4, 26, 10, 22, 44, tzinfo=UTC)),  # journalctl in ja_JP: abmon ` 4月`
    ("апр 26 10:22:44 host kernel: Out of memory: Killed process 1 (a) total-vm:1kB, anon-rss:1kB, file-rss:0kB",
     dt.datetime(2026, 4, 26, 10, 22, 44, tzinfo=UTC)),  # journalctl in ru_RU
])
def test_a_kill_in_a_local_date_keeps_its_wall_clock_time(line: str, when: dt.datetime) -> None:
    stats = TextLogStats()
    (record,) = read(line, stats)
    assert record.wall_time == when.timestamp() and stats.unknown_dates == 0


def test_a_date_that_cannot_be_read_keeps_the_kill_with_an_unknown_time() -> None:
    stats = TextLogStats()
    (record,) = read("[Qqq 26 Xyz 10:22:44 2024] Out of memory: Killed process 1 (a) total-vm:1kB, anon-rss:1kB, "
                     "file-rss:0kB", stats)
    assert record.wall_time is None and record.usec is None and type(parse_oom_line(record.text)) is OomKilled
    assert stats.unknown_dates == 1 and stats.first_unknown_date.startswith("[Qqq")


# --- cut, glued and wrapped lines, separators ------------------------------------------------------------

def test_a_kill_line_cut_short_keeps_its_whole_sizes() -> None:
    """https://github.com/elastic/elastic-agent/issues/3641: the excerpt ends inside the kill line."""
    (record,) = read("Mar 13 20:37:14 aks-default-32489819 kernel: [2442796.469054] Memory cgroup out of memory: Killed "
                     "process 2532535 (filebeat) total-vm:2766604kB, anon-rss:1298484kB, file-rss:7")
    line = parse_oom_line(record.text)
    assert (line.pid, line.comm, line.anon_rss_bytes, line.file_rss_bytes) == (2532535, "filebeat", 1298484 * 1024, None)


@pytest.mark.parametrize("text,task_cgroup", [
    # https://github.com/ggml-org/llama.cpp/issues/17844: `less -S` chopped after task_memcg's comma
    ("Dec 07 15:40:35 user kernel: oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=user.slice,"
     "mems_allowed=0,global_oom,task_memcg=/user.slice/user-1000.slice/user@1000.service/session.slice/dbus.service,>",
     "/user.slice/user-1000.slice/user@1000.service/session.slice/dbus.service"),
    # https://github.com/NixOS/nixpkgs/issues/435587: chopped inside task_memcg
    ("Aug 20 13:44:01 kinga kernel: oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=systemd-oomd.service,"
     "mems_allowed=0,global_oom,task_memcg=/user.slice/user-1000.slice/user@1000.service/app.slice/app-org.gnome."
     "Terminal.slice/vte-s>", None),
])
def test_a_summary_cut_inside_task_memcg_keeps_its_whole_fields_marked_cut(text: str, task_cgroup) -> None:
    stats = TextLogStats()
    (record,) = read(text, stats)
    summary = parse_oom_line(record.text)
    assert summary == OomSummary(constraint="global", oom_cgroup="/", task_cgroup=task_cgroup, comm=None, pid=None,
                                 uid=None, cut=True)
    assert stats.cut_records == 1


def test_a_memcg_summary_cut_inside_task_memcg_keeps_oom_memcg() -> None:
    line = parse_oom_line("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
                          "oom_memcg=/kubepods/burstable/pod6a1b,task_memcg=/kubepods/burs")
    assert (line.constraint, line.oom_cgroup, line.task_cgroup, line.cut) == ("memcg", "/kubepods/burstable/pod6a1b",
                                                                             None, True)


def test_kernel_lines_glued_into_prose_are_split_out() -> None:
    """https://pjolsson.com/smcp/10662.html: /var/log/messages quoted inside a Chinese paragraph."""
    text = ("系统自动kill掉了mongodb进程,如下 Out of memory: Kill process 5372 (mongod) score 130 or sacrifice child "
            "Killed process 5372 (mongod), UID 0, total-vm:2539052kB, anon-rss:2117096kB, file-rss:0kB, shmem-rss:0kB "
            "Linux 分配内存策略")
    assert kills(text) == [(5372, "mongod")]


def test_wrapped_dmesg_T_rows_and_thousands_separators() -> None:
    """https://github.com/0jc1/py-autovod/issues/7: `dmesg -T` rows wrapped by the terminal, thousands
    separators in the kill line, Markdown fences glued to the text."""
    records = read(
        "```[Sun Mar 30 08:24:00 2025] [   7899]     0  7899  6546210  3842522 39899136  1039052\n 0 python\n"
        "[Sun Mar 30 08:24:00 2025] Out of memory: Killed process 7899 (python) total-vm:26,184,840kB, "
        "anon-rss:153,700,88kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:38964kB oom_score_adj:0```")
    row, kill = records
    assert [(t.pid, t.rss_pages, t.name) for t in first_report([row.text]).tasks] == [(7899, 3842522, "python")]
    line = parse_oom_line(kill.text)
    assert (line.total_vm_bytes, line.anon_rss_bytes, line.oom_score_adj) == (26184840 * 1024, 15370088 * 1024, 0)


def test_a_task_row_pasted_without_its_header_gives_the_top_holder() -> None:
    """https://github.com/moby/moby/issues/15654: the task table's last row without its header (3.19)."""
    records = read("Aug 19 00:32:04 kernel: [ 9610.328720] [19715] 10000 19715   804134    76447     322    47965"
                   "             0 java")
    (task,) = first_report([r.text for r in records]).tasks
    assert (task.pid, task.rss_pages, task.nr_ptes, task.name) == (19715, 76447, 322, "java")
