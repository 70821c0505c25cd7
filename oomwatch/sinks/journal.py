"""The systemd journal: an OOM kill in a systemd unit is explained beside the unit's own lines, where
`journalctl -u UNIT` and `systemctl status UNIT` show them.

journalctl's unit filter (src/shared/logs-show.c, add_matches_for_unit, systemd 252) takes a unit's own
messages (`_SYSTEMD_UNIT=`), PID 1's about it (`_PID=1` + `UNIT=`), coredumps (`_UID=0` + `COREDUMP_UNIT=`)
and messages "from authorized daemons about this service": `_UID=0` + `OBJECT_SYSTEMD_UNIT=UNIT`. `systemctl
status` reads the same matches for this boot, since the unit last started. So an entry with
`OBJECT_SYSTEMD_UNIT=` shows there only when it comes from uid 0 (journald takes `_UID` from the socket's
credentials: it cannot be claimed); the unit runs the agent as root for that (systemd/oomwatch.service).
`UNIT=` is not sent: journalctl takes it only from PID 1.

Which incidents: only those in which a systemd unit lost a process, one entry per unit (docs/contract.md,
"Journal entries"). Every incident is already in the journal as the agent's own log line under
oomwatch.service (and, with `--events-file -`, its JSON): an entry of its own would repeat it there. Deaths
(oomwatch.deaths, with --proc-connector) of a unit's processes get an entry too, unless the kernel killed them
(their incident has one).

The unit is the one systemd manages: the first unit below the slices of the workload's cgroup path (a unit's
delegated subtree, such as a container's, may hold cgroups named like units that systemd knows nothing
about: `journalctl -u sshd.service` must not show a kill in `/system.slice/docker-1.scope/sshd.service`).
Below `user@UID.service` the same rule names the user unit (`OBJECT_SYSTEMD_USER_UNIT=`, for `journalctl
--user-unit`), and the entry is attached to the user manager's own unit.

Native protocol (systemd.io/JOURNAL_NATIVE_PROTOCOL): one datagram of `NAME=value\\n` fields; a value with
a control character is sent as `NAME\\n`, its length as 64-bit little endian, the bytes, `\\n`. An entry too
large for one datagram (EMSGSIZE) goes in a sealed memfd passed with SCM_RIGHTS, as sd_journal_sendv does;
nothing is truncated. Sending happens on a worker thread behind a bounded queue: the pipeline never waits on
journald; a full queue or a journald that does not answer drops the entry, with one log line per change.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import socket
import struct
from typing import Any, Iterable, Optional, Sequence

from oomwatch.deaths import Death
from oomwatch.model import Incident, Workload
from oomwatch.sinks import NoLifecycle
from oomwatch.sinks.worker import QueueWorker
from oomwatch.textsafe import visible_lines
from oomwatch.timefmt import iso8601

log = logging.getLogger(__name__)

JOURNAL_SOCKET = "/run/systemd/journal/socket"
# Ours, stable across releases (`journalctl MESSAGE_ID=…` lists every OOM kill oomwatch explained).
MESSAGE_ID = "e30ab5d9982641acbb88b76df393a83d"
# A death's verdict (oomwatch.deaths): a unit's process killed by SIGKILL without a kernel OOM kill, or its
# main process ended after an allocation failed. A kernel-oom death has its incident's entry already.
DEATH_MESSAGE_ID = "aa165314303d4dc3b2975ca380dc2a91"
SYSLOG_IDENTIFIER = "oomwatch"
PRIORITY_WARNING = 4  # a process of the unit was killed: a warning, as the pod Event of a kill is
KILLED_LISTED = 20  # OOMWATCH_KILLED names at most this many processes; OOMWATCH_KILLED_COUNT is exact
UNITS_PER_INCIDENT = 16  # entries for one incident (a slice's group kill across many units)
_SLICE = ".slice"
_UNIT_SUFFIXES = (".service", ".scope", ".socket", ".mount", ".swap", ".slice")
_USER_MANAGER = re.compile(r"^user@(\d+)\.service$")
_FIELD_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
_WHY = {errno.ENOENT: "no journald socket", errno.ECONNREFUSED: "journald is not running",
        errno.EAGAIN: "journald did not read in time"}


# --- which unit ------------------------------------------------------------------------------------


def _is_unit(name: str) -> bool:
    return any(name.endswith(suffix) and len(name) > len(suffix) for suffix in _UNIT_SUFFIXES)


def _managed_unit(parts: Sequence[str]) -> tuple[Optional[str], int]:
    """The first unit below a run of slices (what a systemd manager made), and its index; (None, -1) when
    the path leaves the slices for a cgroup that is not a unit. A path of slices alone is its last slice."""
    last_slice = None
    for i, part in enumerate(parts):
        if part.endswith(_SLICE) and _is_unit(part):
            last_slice = (part, i)
            continue
        return (part, i) if _is_unit(part) else (None, -1)
    return last_slice if last_slice else (None, -1)


def systemd_units(cgroup: str) -> tuple[Optional[str], Optional[str], Optional[int]]:
    """(system unit, user unit, its owner's uid) of a cgroup path, as the managers name them; Nones where
    the path is not a unit's. Pure."""
    parts = [p for p in cgroup.split("/") if p]
    unit, index = _managed_unit(parts)
    if unit is None:
        return None, None, None
    manager = _USER_MANAGER.match(unit)
    if not manager:
        return unit, None, None
    user_unit, _ = _managed_unit(parts[index + 1:])
    return unit, user_unit, int(manager.group(1)) if user_unit else None


# --- the entry -------------------------------------------------------------------------------------


def _units_of(incident: Incident) -> list[tuple[Workload, str, Optional[str], Optional[int]]]:
    """The systemd units that lost a process in `incident`, the victim's first, each once."""
    out, seen = [], set()
    for workload in (incident.workload, *incident.workloads):
        if workload.type != "systemd":
            continue
        unit, user_unit, uid = systemd_units(workload.cgroup)
        if unit is None or (unit, user_unit) in seen:
            continue
        seen.add((unit, user_unit))
        out.append((workload, unit, user_unit, uid))
    return out[:UNITS_PER_INCIDENT]


def _killed_names(incident: Incident) -> str:
    names = " ".join(f"{p.comm}({p.pid})" for p in incident.killed[:KILLED_LISTED])
    count = incident.killed_count if incident.killed_count is not None else len(incident.killed)
    return names + (f" and {count - KILLED_LISTED} more" if count > KILLED_LISTED else "")


def journal_entries(incident: Incident) -> list[list[tuple[str, Any]]]:
    """The journal entries for `incident`: one per systemd unit that lost a process (none for other
    workloads), each a list of (field, value) in order; None values are left out. Pure."""
    entries = []
    for workload, unit, user_unit, uid in _units_of(incident):
        victim = incident.victim
        count = incident.killed_count if incident.killed_count is not None else len(incident.killed)
        fields: list[tuple[str, Any]] = [
            ("MESSAGE", visible_lines(incident.explanation)),  # journalctl -a prints it as it is
            ("MESSAGE_ID", MESSAGE_ID),
            ("PRIORITY", PRIORITY_WARNING),
            ("SYSLOG_IDENTIFIER", SYSLOG_IDENTIFIER),
            ("OBJECT_SYSTEMD_UNIT", unit),
            ("OBJECT_SYSTEMD_USER_UNIT", user_unit),
            ("OBJECT_SYSTEMD_OWNER_UID", uid),
            ("OBJECT_SYSTEMD_CGROUP", workload.cgroup),
            ("OOMWATCH_KIND", incident.kind),
            ("OOMWATCH_SCOPE", incident.scope),
            ("OOMWATCH_CONSTRAINT", incident.constraint),
            ("OOMWATCH_EVIDENCE", incident.evidence),
            ("OOMWATCH_TIME", iso8601(incident.time)),
            ("OOMWATCH_BOOT_ID", incident.boot_id),
            ("OOMWATCH_KERNEL_SEQ", incident.kernel_seq),
            ("OOMWATCH_OOM_CGROUP", incident.oom_cgroup),
            ("OOMWATCH_GROUP_CGROUP", incident.group_cgroup),
            ("OOMWATCH_WORKLOAD_TYPE", workload.type),
            ("OOMWATCH_WORKLOAD_CGROUP", workload.cgroup),
            ("OOMWATCH_VICTIM_PID", victim.pid if victim else None),
            ("OOMWATCH_VICTIM_COMM", victim.comm if victim else None),
            ("OOMWATCH_VICTIM_UID", victim.uid if victim else None),
            ("OOMWATCH_VICTIM_CGROUP", victim.cgroup if victim else None),
            ("OOMWATCH_KILLED_COUNT", count),
            ("OOMWATCH_KILLED", _killed_names(incident) or None),
            ("OOMWATCH_MEMORY_USAGE_BYTES", (incident.memory or {}).get("usage_bytes")),
            ("OOMWATCH_MEMORY_LIMIT_BYTES", (incident.memory or {}).get("limit_bytes")),
            ("OOMWATCH_WINDOW_START", iso8601(incident.window_start) if incident.window_start else None),
        ]
        entries.append([(name, value) for name, value in fields if value is not None])
    return entries


def death_entry(death: Death) -> Optional[list[tuple[str, Any]]]:
    """The journal entry of a death's verdict in a systemd unit, or None (another workload, or a kernel-oom
    death: the kernel's incident has its entry). Pure."""
    workload = death.workload
    if death.cause == "kernel-oom" or workload is None or workload.type != "systemd":
        return None
    unit, user_unit, uid = systemd_units(workload.cgroup)
    if unit is None:
        return None
    fields: list[tuple[str, Any]] = [
        ("MESSAGE", visible_lines(death.explanation)),
        ("MESSAGE_ID", DEATH_MESSAGE_ID),
        ("PRIORITY", PRIORITY_WARNING),
        ("SYSLOG_IDENTIFIER", SYSLOG_IDENTIFIER),
        ("OBJECT_SYSTEMD_UNIT", unit),
        ("OBJECT_SYSTEMD_USER_UNIT", user_unit),
        ("OBJECT_SYSTEMD_OWNER_UID", uid),
        ("OBJECT_SYSTEMD_CGROUP", workload.cgroup),
        ("OOMWATCH_CAUSE", death.cause),
        ("OOMWATCH_SENDER", death.sender),
        ("OOMWATCH_TIME", iso8601(death.time)),
        ("OOMWATCH_BOOT_ID", death.boot_id or None),
        ("OOMWATCH_PID", death.pid),
        ("OOMWATCH_COMM", death.comm),
        ("OOMWATCH_SIGNAL", death.signal),
        ("OOMWATCH_EXIT_CODE", death.exit_code),
        ("OOMWATCH_PROCESSES", death.processes),
    ]
    return [(name, value) for name, value in fields if value is not None]


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    # A cgroup name may hold any byte but "/": one that is not UTF-8 was read as a surrogate escape.
    return str(value).encode("utf-8", "surrogateescape")


def encode(fields: Iterable[tuple[str, Any]]) -> bytes:
    """The native protocol's bytes for one entry. Values with a control character (a newline would end
    the field) take the binary-safe form: NAME, newline, 64-bit little-endian length, bytes, newline."""
    out = bytearray()
    for name, value in fields:
        if not _FIELD_NAME.match(name):
            raise ValueError(f"not a journal field name: {name!r}")
        data = _bytes(value)
        if any(b < 0x20 for b in data):
            out += name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name.encode() + b"=" + data + b"\n"
    return bytes(out)


# --- sending ---------------------------------------------------------------------------------------


class JournalSocket:
    """journald's native socket: `send(payload)` as one datagram, or as a sealed memfd when the datagram
    would be too large. Raises OSError (no journald, socket missing, refused)."""

    def __init__(self, path: str = JOURNAL_SOCKET, timeout: float = 1.0) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.settimeout(timeout)  # a journald that does not read: give up, never hang the worker
        self.memfd_sent = 0

    def send(self, payload: bytes) -> None:
        try:
            self._sock.sendto(payload, self.path)
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                raise
            self._send_memfd(payload)

    def _send_memfd(self, payload: bytes) -> None:
        fd = os.memfd_create("oomwatch-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            # journald maps a memfd only when it is sealed against any change (src/basic/memfd-util.c).
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))]
            self._sock.sendmsg([], rights, 0, self.path)  # an empty datagram that carries the fd
            self.memfd_sent += 1
        finally:
            os.close(fd)

    def close(self) -> None:
        self._sock.close()


class JournalSink(NoLifecycle):
    """Sends each incident's journal entries (journal_entries) from a worker thread; never blocks the
    caller. `sent`, `dropped` and `failed` count entries; `memfd_sent` those too large for a datagram."""

    def __init__(self, path: str = JOURNAL_SOCKET, *, queue_size: int = 1024, timeout: float = 1.0) -> None:
        self.path = path
        self._timeout = timeout
        self._worker: QueueWorker[bytes] = QueueWorker("oomwatch-journal", self._send, queue_size)
        self._socket: Optional[JournalSocket] = None
        self.problem: Optional[str] = None  # the last failure, until an entry goes through again
        self.sent = self.failed = 0

    @property
    def dropped(self) -> int:
        return self._worker.dropped

    @property
    def memfd_sent(self) -> int:
        return self._socket.memfd_sent if self._socket is not None else 0

    def start(self, published: Sequence[dict[str, Any]]) -> None:
        """Incidents the saved state holds were published by an earlier run: not sent again (the journal
        cannot be asked what it has)."""
        if not self._worker.running:
            self._socket = JournalSocket(self.path, self._timeout)
            self._worker.start()

    def publish(self, incident: Incident) -> None:
        for fields in journal_entries(incident):
            self._put(encode(fields))

    def publish_death(self, death: Death) -> None:
        fields = death_entry(death)
        if fields is not None:
            self._put(encode(fields))

    def _put(self, payload: bytes) -> None:
        if not self._worker.put(payload):
            self._trouble(f"{self._worker.size} entries wait already; dropped one")

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (up to `timeout`), then stop."""
        if not self._worker.running:
            return
        self._worker.close(timeout)
        if self._socket is not None:
            self._socket.close()

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """True once everything queued so far was sent or given up on (tests)."""
        return self._worker.wait_idle(timeout)

    def _send(self, payload: bytes) -> None:
        assert self._socket is not None
        try:
            self._socket.send(payload)
        except OSError as exc:
            self.failed += 1
            why = _WHY.get(exc.errno or 0, exc.strerror or str(exc))
            self._trouble(f"cannot send to {self.path} ({why}); entries are dropped until it answers")
            return
        self.sent += 1
        if self.problem is not None:
            log.info("journal: entries reach %s again", self.path)
            self.problem = None

    def _trouble(self, why: str) -> None:
        if why != self.problem:  # one line per change, never one per incident
            log.warning("journal: %s", why)
            self.problem = why


def journal_wanted(setting: str, path: str = JOURNAL_SOCKET, euid: Optional[int] = None) -> bool:
    """`--journal`: on, off, or auto: on where journald's socket exists and the agent runs as root (from
    another uid the entries would not show under the unit, only repeat the agent's log line)."""
    if setting == "auto":
        return os.path.exists(path) and (os.geteuid() if euid is None else euid) == 0
    return setting == "on"
