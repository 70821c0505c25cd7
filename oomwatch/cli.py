"""The `oomwatch` command: parses options into a Config and calls the agent or the report. Nothing else."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import time
from typing import Optional

from oomwatch.early import start_early_pump

if os.path.basename(sys.argv[0] if sys.argv else "") in ("oomwatch", "__main__.py"):
    # `oomwatch agent` on /dev/kmsg: drain the kernel log while the rest is imported (oomwatch/early.py).
    start_early_pump(sys.argv)

import click  # noqa: E402 (after the early pump: importing it takes seconds under emulation)

from oomwatch import __version__  # noqa: E402
from oomwatch.config import DEFAULT_LISTEN, Config  # noqa: E402


def _common(fn):
    """Options shared by `agent` and `inspect`; each also reads OOMWATCH_<NAME>."""
    options = [
        click.option("--kmsg", envvar="OOMWATCH_KMSG", default="/dev/kmsg", show_default=True,
                     help="Kernel log: the live /dev/kmsg (syslog(2) is used where the device is refused), "
                          "`syslog` to use syslog(2) only, a saved raw kmsg dump, or `dmesg` / `journalctl -k` "
                          "text; - reads standard input."),
        click.option("--cgroup-root", envvar="OOMWATCH_CGROUP_ROOT", default="/sys/fs/cgroup", show_default=True,
                     help="Where the cgroup v2 hierarchy is mounted."),
        click.option("--proc", "proc_root", envvar="OOMWATCH_PROC", default="/proc", show_default=True,
                     help="The host's /proc (mounted elsewhere inside a container)."),
        click.option("--kubelet-config", envvar="OOMWATCH_KUBELET_CONFIG", default="/var/lib/kubelet/config.yaml",
                     show_default=True, help="KubeletConfiguration file, for singleProcessOOMKill."),
        click.option("--run-root", envvar="OOMWATCH_RUN_ROOT", default="/run", show_default=True,
                     help="Where containerd and CRI-O keep their bundles (container names come from there)."),
        click.option("--pod-log-dir", envvar="OOMWATCH_POD_LOG_DIR", default="/var/log/pods", show_default=True,
                     help="The kubelet's pod log directory (pod names by UID)."),
        click.option("--boot-time", envvar="OOMWATCH_BOOT_TIME", default=None,
                     help="For a saved log without wall-clock times from another boot: when that boot began "
                          "(ISO time). Default: this host's boot."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def log_handler(stream, background: bool = False) -> logging.Handler:
    """The agent's log: one line a record, the names in messages with their control characters shown, not sent
    (oomwatch.textsafe); `background`: written by a thread of its own (oomwatch.logwriter), never by the loop."""
    from oomwatch.textsafe import VisibleFormatter

    formatter = VisibleFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    if background:
        from oomwatch.logwriter import BackgroundLogHandler

        return BackgroundLogHandler(stream, formatter)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    return handler


def _boot_time(value: Optional[str]) -> Optional[float]:
    if value is None:
        return None
    from oomwatch.inspect import parse_since

    try:
        return parse_since(value, time.time())
    except ValueError as exc:
        raise click.BadParameter(str(exc).replace("--since", "--boot-time"), param_hint="--boot-time") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="oomwatch")
def main() -> None:
    """oomwatch: why did it get OOMKilled? Tells group kills (memory.oom.group=1) from single ones, names the
    workload, and exports Prometheus metrics.

    \b
    Examples:
      oomwatch inspect                          # this node: posture, workloads, recent kills
      journalctl -k -b -1 | oomwatch inspect --kmsg -   # the kills of the previous boot
      oomwatch agent --listen :9717 --state-dir /var/lib/oomwatch
    """


@main.command()
@_common
@click.option("--listen", envvar="OOMWATCH_LISTEN", default=DEFAULT_LISTEN, show_default=True,
              help="HOST:PORT for /metrics, /healthz (readiness: \"starting\" until the cgroup tree is read), "
                   "/livez (liveness) and /incidents; listened on before the tree is read.")
@click.option("--events-file", envvar="OOMWATCH_EVENTS_FILE", default=None,
              help="Append one JSON incident per line to this file; - writes to standard output.")
@click.option("--state-dir", envvar="OOMWATCH_STATE_DIR", default=None,
              help="Keep the kernel-log cursor and the counters here, so a restart neither repeats nor loses "
                   "incidents.")
@click.option("--node-name", envvar="OOMWATCH_NODE_NAME", default=None,
              help="This node's Kubernetes name (the DaemonSet sets it from spec.nodeName).")
@click.option("--kube-api", envvar="OOMWATCH_KUBE_API", type=click.Choice(["auto", "off"]), default="auto",
              show_default=True, help="auto: with in-cluster credentials, watch this node's pods (owners, "
                                      "training jobs) and post pod Events; off: never talk to the API server.")
@click.option("--pod-events/--no-pod-events", envvar="OOMWATCH_POD_EVENTS", default=True, show_default=True,
              help="Record a Kubernetes Event on the pod for each incident (needs --kube-api auto).")
@click.option("--proc-connector/--no-proc-connector", envvar="OOMWATCH_PROC_CONNECTOR", default=False,
              show_default=True, help="Also listen to the kernel's proc connector for processes a group kill took "
                                      "down without a log line (needs CAP_NET_ADMIN up to 6.1, the host's pid and "
                                      "network namespaces).")
@click.option("--grace-period", envvar="OOMWATCH_GRACE_PERIOD", type=click.FloatRange(min=0), default=600.0,
              show_default=True, help="Seconds a gone workload's series stay before they are dropped.")
@click.option("--trust-delegated-cgroups/--no-trust-delegated-cgroups", envvar="OOMWATCH_TRUST_DELEGATED_CGROUPS",
              default=False, show_default=True,
              help="Give each unit in a cgroup subtree delegated to a user (user@UID.service, rootless runtimes, "
                   "`systemd-run --user`) its own series. Off: the whole subtree is one workload at its delegation "
                   "root, so that no user can flood /metrics; either way the cap keeps room for the others.")
@click.option("--drop-series", envvar="OOMWATCH_DROP_SERIES", default="", metavar="LIST",
              help="Leave series out of /metrics on large fleets, comma-separated: `pods` (the pod-level series, "
                   "duplicates of their containers'), `memory-events` (oomwatch_memory_events_total, 5 per "
                   "workload; the OOMKilled verdict rules read it). Default: none.")
@click.option("--journal", envvar="OOMWATCH_JOURNAL", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True, help="Write each kill in a systemd unit to the journal, where `journalctl -u "
                                      "UNIT` and `systemctl status UNIT` show it (needs root); auto: as root, where "
                                      "/run/systemd/journal/socket exists.")
@click.option("--slurm-admin-comment/--no-slurm-admin-comment", envvar="OOMWATCH_SLURM_ADMIN_COMMENT",
              default=False, show_default=True,
              help="Append each kill's explanation to its Slurm job's AdminComment, which `scontrol show job` shows "
                   "its owner (runs `scontrol update` as root on the node; only while the job runs).")
@click.option("--log-level", envvar="OOMWATCH_LOG_LEVEL", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--web-config-file", envvar="OOMWATCH_WEB_CONFIG_FILE", default=None, metavar="PATH",
              help="TLS, client certificates and basic auth for every route but /healthz and /livez, in the format of "
                   "Prometheus' exporter-toolkit web config file (see the README, \"Who can reach the port\").")
def agent(kmsg, cgroup_root, proc_root, kubelet_config, run_root, pod_log_dir, boot_time, listen, events_file,
          state_dir, node_name, kube_api, pod_events, proc_connector, grace_period, trust_delegated_cgroups,
          drop_series, journal, slurm_admin_comment, log_level, web_config_file) -> None:
    """Run the node agent: follow the kernel log and the cgroup tree, publish every OOM kill as an incident,
    serve Prometheus metrics. Stops cleanly on SIGTERM (state flushed, exit 0).

    \b
    Example:
      oomwatch agent --listen 0.0.0.0:9717 --state-dir /var/lib/oomwatch --events-file -
    """
    from oomwatch.agent import Agent
    from oomwatch.sinks.http import parse_listen

    logging.basicConfig(level=log_level.upper(), handlers=[log_handler(sys.stderr, background=True)])
    try:
        parse_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    if web_config_file:
        from oomwatch.sinks.webconfig import WebConfigError, load_web_config

        try:
            load_web_config(web_config_file)  # read again by the agent; checked here for a clear exit 2
        except WebConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--web-config-file") from None
    from oomwatch.sinks.collector import DROPPABLE

    dropped = tuple(sorted({name.strip() for name in drop_series.split(",") if name.strip()}))
    if set(dropped) - set(DROPPABLE):
        raise click.BadParameter(f"choose from {', '.join(DROPPABLE)}, got {drop_series!r}",
                                 param_hint="--drop-series")
    config = Config(kmsg=kmsg, cgroup_root=cgroup_root, proc=proc_root, listen=listen, events_file=events_file,
                    state_dir=state_dir, kubelet_config=kubelet_config, run_root=run_root, pod_log_dir=pod_log_dir,
                    node_name=node_name, kube_api=kube_api, pod_events=pod_events, proc_connector=proc_connector,
                    grace_period=grace_period, trust_delegated_cgroups=trust_delegated_cgroups, drop_series=dropped,
                    journal=journal,
                    slurm_admin_comment=slurm_admin_comment,
                    web_config_file=web_config_file, boot_time=_boot_time(boot_time))
    try:
        from oomwatch.early import take_early_pump
        from oomwatch.process import limit_malloc_arenas

        limit_malloc_arenas()  # before the agent's threads start
        code = Agent(config, early_pump=take_early_pump()).run_until_signalled()
    except OSError as exc:
        raise click.ClickException(f"cannot start: {exc}") from exc
    sys.exit(code)


def _require_open_streams(reads_stdin: bool) -> None:
    """A report with nowhere to go, or a log read from a closed standard input, is a clear error (exit 2), not a
    traceback: `oomwatch inspect >&-`, `… --kmsg - <&-`."""
    for stream, name, needed in ((sys.stdout, "output", True), (sys.stdin, "input", reads_stdin)):
        if not needed:
            continue
        closed = stream is None or stream.closed
        if not closed:
            try:
                os.fstat(stream.fileno())  # a descriptor closed under Python's stream (EBADF)
            except io.UnsupportedOperation:
                pass  # a stream with no descriptor (captured output): open
            except OSError:
                closed = True
        if closed:
            click.echo(f"oomwatch: standard {name} is closed: "
                       + ("nothing can be written (redirect it to a file or a pager)" if name == "output" else
                          "nothing to read with --kmsg - (pipe the log in, or name its file)"), err=True)
            sys.exit(2)


@main.command()
@_common
@click.argument("target", required=False, metavar="[CGROUP-OR-POD]")
@click.option("--container", default=None, help="Only this container (by name).")
@click.option("--since", default=None, help="Only incidents since then: a duration (30m, 2h, 1d) or an ISO time.")
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="Show at most this many kills (newest first); older ones are summed up by workload. 0: all.")
@click.option("--tz", "tz_name", default=None, metavar="ZONE",
              help="Time zone of a saved log's dates printed without one (journalctl, dmesg -T), e.g. "
                   "Europe/Berlin. Default: this machine's.")
@click.option("--job", default=None, metavar="NAME",
              help="Only this job's kills (its training or batch job, controlling owner or Slurm job id; "
                   "NAMESPACE/NAME narrows the namespace), and whether each restart of its pods followed one.")
@click.option("--incidents", "incidents_source", default=None, metavar="URL|PATH",
              help="With --job: the incidents of the agent's /incidents (http://HOST:9717) or of its events file, "
                   "which know each pod's job (records of the wrong shape skipped and counted; a URL's answer "
                   "within 30 s). Default: the kernel log (which names Slurm jobs only).")
@click.option("--json", "as_json", is_flag=True, help="The same report as JSON.")
@click.option("--color/--no-color", default=None, help="Colour (default: only on a terminal).")
@click.pass_context
def inspect(ctx, kmsg, cgroup_root, proc_root, kubelet_config, run_root, pod_log_dir, boot_time, target, container,
            since, limit, tz_name, job, incidents_source, as_json, color) -> None:
    """Explain this node's OOM posture and recent OOM kills in plain words (read-only, one shot).

    CGROUP-OR-POD narrows the report to a pod (`namespace/pod`, or just the pod name) or a cgroup path
    (`/kubepods/burstable/pod…`).

    \b
    Examples:
      oomwatch inspect
      oomwatch inspect ml/train-0 --container trainer --since 2h
      journalctl -k -b -1 | oomwatch inspect --kmsg -
      oomwatch inspect --json --kmsg fixtures/kmsg/linux-6.1-runc-group-pidns.kmsg
      oomwatch inspect --job train --incidents http://127.0.0.1:9717   # a JobSet's kills and restarts

    "At risk" lists workloads that use 80% of their memory limit (working set, as the kubelet counts it) or
    stall on memory (PSI), least headroom first, each with its reason; "Restarted containers" says whether a
    container's last restart followed an OOM kill in the kernel log.

    Every run says how many kernel-log records it read and understood and how many OOM reports it found;
    input it could not read is a warning on stderr (with the first such line), an empty or unreadable log an
    error (exit 1), as is what cannot be a kernel log: binary data, a directory, a socket, a device other than
    /dev/kmsg, a FIFO nothing is written to within 10 s. gzip, xz and bzip2 logs are decompressed, UTF-16 is
    read, NULs and CR line ends are removed. A name's control characters (a process may call itself ESC ] 0 ;
    ...) are shown escaped, as \\x1b, never sent to the terminal.
    """
    import os

    from oomwatch.inspect import build_report, parse_since, render_text, terminal_width
    from oomwatch.sources.kmsg import SAVED, kernel_log_kind
    from oomwatch.textsafe import terminal_text, visible, visible_data

    _require_open_streams(kmsg == "-")
    since_ts = None
    if since is not None:
        try:
            since_ts = parse_since(since, time.time())
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from None
    tz = None
    if tz_name is not None:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            tz = ZoneInfo(tz_name)
        except (ZoneInfoNotFoundError, ValueError):
            raise click.BadParameter(f"unknown time zone {tz_name!r} (e.g. UTC, Europe/Berlin)",
                                     param_hint="--tz") from None
    source = click.core.ParameterSource.DEFAULT
    for name, path, hint in (("cgroup_root", cgroup_root, "--cgroup-root"), ("proc_root", proc_root, "--proc")):
        if ctx.get_parameter_source(name) != source and not os.path.isdir(path):
            raise click.BadParameter(f"{path} is not a directory", param_hint=hint)
    config = Config(kmsg=kmsg, cgroup_root=cgroup_root, proc=proc_root, kubelet_config=kubelet_config,
                    run_root=run_root, pod_log_dir=pod_log_dir, boot_time=_boot_time(boot_time))
    saved_log = ctx.get_parameter_source("kmsg") != source and kernel_log_kind(kmsg) == SAVED
    # A saved log may come from another node: this host's cgroups would describe the wrong one.
    node_view = not saved_log or ctx.get_parameter_source("cgroup_root") != source
    if job is not None or incidents_source is not None:
        if job is None:
            raise click.BadParameter("--incidents goes with --job NAME", param_hint="--incidents")
        _inspect_job(config, job, incidents_source, since_ts, as_json, color,
                     lambda: build_report(config, since=since_ts, node_view=node_view, tz=tz)["incidents"])
        return
    report = build_report(config, target=target, container=container, since=since_ts, node_view=node_view, tz=tz,
                          limit=limit or None, since_label=since)
    error = (report.get("kmsg") or {}).get("error")
    if error and saved_log:
        raise click.ClickException(f"cannot read the kernel log: {visible(error)}")
    for warning in report.get("warnings", []):
        click.echo(f"oomwatch: warning: {visible(warning)}", err=True)
    if as_json:
        click.echo(json.dumps(jsonable(report), indent=2))  # (json.dumps writes control characters as \uNNNN)
    else:
        use_color = sys.stdout.isatty() if color is None else color
        text = render_text(visible_data(report), color=use_color, width=terminal_width())
        click.echo(terminal_text(text, use_color), nl=False, color=use_color)
    if error:
        click.echo(f"oomwatch: cannot read the kernel log ({visible(error)}); shown: node posture and workloads",
                   err=True)


def _inspect_job(config, job, source, since, as_json, color, kernel_log_incidents) -> None:
    """`inspect --job`: the job's kills (oomwatch.jobreport) and the restarts of its pods on this node."""
    from oomwatch.inspect import terminal_width
    from oomwatch.jobreport import IncidentsUnavailable, build_job_report, render_job_text
    from oomwatch.textsafe import terminal_text, visible, visible_data

    try:
        report = build_job_report(config, job, source, since=since, kernel_log_incidents=kernel_log_incidents)
    except IncidentsUnavailable as exc:
        raise click.ClickException(f"cannot read the incidents: {visible(str(exc))}") from None
    if as_json:
        click.echo(json.dumps(jsonable(report), indent=2))
    else:
        use_color = sys.stdout.isatty() if color is None else color
        text = render_job_text(visible_data(report), color=use_color, width=terminal_width())
        click.echo(terminal_text(text, use_color), nl=False, color=use_color)


def jsonable(value):
    """JSON has no infinity: an unlimited memory.max becomes null."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
