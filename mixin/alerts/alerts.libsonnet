// Alerts (monitoring-mixins: prometheusAlerts). The rules file and both PrometheusRules are rendered from this
// and rules/rules.libsonnet by scripts/generate-mixin.
//
// Per-workload series carry namespace/pod/container (Kubernetes) or cgroup (Slurm, systemd, other). The agent
// exports every workload's counters at 0 before its first incident, so increase() sees the first kill. In
// Kubernetes the scrape adds a `node` label (the ServiceMonitor); on plain hosts `instance` names the node.
//
// One alert per incident: a group kill that took other processes down raises OomwatchGroupOOMKillCollateral
// only; OomwatchContainerOOMKilled / OomwatchCgroupOOMKilled report the other kills (single kills, and group
// kills in which the victim was the only process). Every alert's runbook_url is a file under docs/runbooks/
// ($._config.runbookURLPattern).
local utils = import '../lib/utils.libsonnet';
local fold = utils.fold;

{
  // The job of the killed workload in the alert's labels (job_kind, job_name) where the agent knows it
  // (oomwatch:workload_job_info:10m, rules/rules.libsonnet); every other kill alerts as before, without them.
  local withJob(expr) = '(%s) * on (%s) group_left (job_kind, job_name) oomwatch:workload_job_info:10m or ignoring (job_kind, job_name) (%s)'
                        % [expr, utils.labels($._config, ['job', 'instance', 'namespace', 'pod', 'cgroup']), expr],
  local ofJob = '{{ with $labels.job_name }} ({{ $labels.job_kind }} {{ . }}){{ end }}',

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'oomwatch',
        rules: [
          {
            alert: 'OomwatchGroupOOMKillCollateral',
            expr: withJob('increase(oomwatch_oom_killed_processes_total{role="collateral"}[5m]) > 0'),
            labels: {
              severity: 'warning',
            },
            annotations: {
              summary: fold(|||
                Group OOM kill took down {{ $value | printf "%.0f" }} extra process(es) in
                {{ if $labels.pod }}{{ $labels.namespace }}/{{ $labels.pod }} container {{ $labels.container }}{{ else }}cgroup {{ $labels.cgroup }}{{ end }}
              |||) + ofJob,
              description: fold(|||
                The kernel OOM killer picked a victim in
                {{ if $labels.pod }}container {{ $labels.container }} of pod {{ $labels.namespace }}/{{ $labels.pod }}{{ else }}cgroup {{ $labels.cgroup }}{{ end }}
                and, because memory.oom.group=1, also killed {{ $value | printf "%.0f" }} other process(es) of the same
                cgroup in the last 5 minutes. Raise the memory limit, or if the workload runs several independent
                processes that should survive a single kill (e.g. a process supervisor, workers of a training job),
                set the kubelet's singleProcessOOMKill: true on its nodes. Details: `oomwatch inspect` on
                {{ with $labels.node }}node {{ . }}{{ else }}{{ $labels.instance }}{{ end }}.
              |||),
              runbook_url: $._config.runbookURLPattern % 'group-oom-kill.md',
            },
          },
          {
            alert: 'OomwatchContainerOOMKilled',
            // A group kill with collateral is OomwatchGroupOOMKillCollateral's alone.
            expr: withJob(fold(|||
              increase(oomwatch_oom_kills_total{pod!="", kind="single"}[5m]) > 0
              or
              (increase(oomwatch_oom_kills_total{pod!="", kind="group"}[5m]) > 0
              unless ignoring (kind, role)
              increase(oomwatch_oom_killed_processes_total{pod!="", role="collateral"}[5m]) > 0)
            |||)),
            labels: {
              severity: 'warning',
            },
            annotations: {
              summary: fold(|||
                OOM kill ({{ $labels.kind }}) in {{ $labels.namespace }}/{{ $labels.pod }}{{ with $labels.container }} container {{ . }}{{ end }}%s
              |||) % ofJob,
              description: fold(|||
                {{ if $labels.container }}Container {{ $labels.container }} of pod{{ else }}Pod{{ end }}
                {{ $labels.namespace }}/{{ $labels.pod }} lost processes to the kernel OOM killer
                ({{ $labels.kind }} kill) in the last 5 minutes. Raise its resources.limits.memory or reduce its
                memory use; `kubectl describe pod -n {{ $labels.namespace }} {{ $labels.pod }}` and the pod's Events
                show what was killed.
              |||),
              runbook_url: $._config.runbookURLPattern % 'oom-kill.md',
            },
          },
          {
            alert: 'OomwatchCgroupOOMKilled',
            // As above: a group kill with collateral is OomwatchGroupOOMKillCollateral's alone.
            expr: withJob(fold(|||
              increase(oomwatch_oom_kills_total{pod="", cgroup!="", kind="single"}[5m]) > 0
              or
              (increase(oomwatch_oom_kills_total{pod="", cgroup!="", kind="group"}[5m]) > 0
              unless ignoring (kind, role)
              increase(oomwatch_oom_killed_processes_total{pod="", cgroup!="", role="collateral"}[5m]) > 0)
            |||)),
            labels: {
              severity: 'warning',
            },
            annotations: {
              summary: fold(|||
                OOM kill ({{ $labels.kind }}) in cgroup {{ $labels.cgroup }}%s on {{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}
              |||) % ofJob,
              description: fold(|||
                A workload outside Kubernetes (Slurm job step, systemd unit or other cgroup {{ $labels.cgroup }})
                lost processes to the kernel OOM killer ({{ $labels.kind }} kill) in the last 5 minutes. Raise the
                job's or unit's memory limit (Slurm --mem, systemd MemoryMax=) or reduce its memory use;
                `oomwatch inspect` on the node explains each kill.
              |||),
              runbook_url: $._config.runbookURLPattern % 'oom-kill.md',
            },
          },
          {
            alert: 'OomwatchNodeOOM',
            expr: 'increase(oomwatch_node_oom_kills_total{scope="node"}[5m]) > 0',
            labels: {
              severity: 'critical',
            },
            annotations: {
              summary: fold(|||
                Node-wide OOM on {{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}
              |||),
              description: fold(|||
                {{ with $labels.node }}Node {{ . }}{{ else }}{{ $labels.instance }}{{ end }} ran out of memory as a
                whole (a global OOM, or the kubepods limit = node allocatable was hit) and the kernel killed
                processes ({{ $labels.kind }} kill) in the last 5 minutes; the victims need not be the pods that
                used the memory. Set memory limits on pods that lack them, check kube-reserved/system-reserved and
                the kubelet's eviction thresholds, and run `oomwatch inspect` on the node.
              |||),
              runbook_url: $._config.runbookURLPattern % 'node-oom.md',
            },
          },
          {
            alert: 'OomwatchOOMStorm',
            expr: 'sum by (%s) (increase(oomwatch_node_oom_kills_total[10m])) > 5'
                  % utils.labels($._config, ['job', 'instance', $._config.nodeLabel]),
            labels: {
              severity: 'critical',
            },
            annotations: {
              summary: fold(|||
                OOM storm on {{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}: {{ $value | printf "%.0f" }} kills in 10 minutes
              |||),
              description: fold(|||
                The kernel OOM killer ran {{ $value | printf "%.0f" }} times in 10 minutes on
                {{ with $labels.node }}node {{ . }}{{ else }}{{ $labels.instance }}{{ end }}. Something is
                crash-looping against its memory limit or the node is overcommitted. Find the workloads with
                `topk(5, increase(oomwatch_oom_kills_total[10m]))`, raise their limits or stop them, and cordon the
                node if the kills hit unrelated pods.
              |||),
              runbook_url: $._config.runbookURLPattern % 'oom-storm.md',
            },
          },
          {
            alert: 'OomwatchKernelLogRecordsLost',
            expr: 'increase(oomwatch_kmsg_lost_records_total[10m]) > 0',
            labels: {
              severity: 'warning',
            },
            annotations: {
              summary: fold(|||
                oomwatch lost {{ $value | printf "%.0f" }} kernel log records on {{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}
              |||),
              description: fold(|||
                The kernel ring buffer overwrote records before oomwatch read them (usually during an OOM storm
                or a flood of kernel messages), so some OOM kills may be missing or unattributed; the cgroups'
                memory.events counters (oomwatch_memory_events_total) still count them. Give the agent more CPU
                (it must keep up with the kernel), or enlarge the ring buffer (log_buf_len= on the kernel command
                line).
              |||),
              runbook_url: $._config.runbookURLPattern % 'agent-health.md#kernel-log-records-lost',
            },
          },
          {
            alert: 'OomwatchKernelLogParseErrors',
            expr: 'increase(oomwatch_kmsg_parse_errors_total[30m]) > 0',
            labels: {
              severity: 'info',
            },
            annotations: {
              summary: fold(|||
                oomwatch could not parse kernel OOM records on {{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}
              |||),
              description: fold(|||
                {{ $value | printf "%.0f" }} kernel log records that looked like OOM-killer output could not be parsed
                in the last 30 minutes; kills may be reported without details. Save `dmesg` from the node and file
                an oomwatch issue with the kernel version (oomwatch_node_info).
              |||),
              runbook_url: $._config.runbookURLPattern % 'agent-health.md#kernel-log-parse-errors',
            },
          },
          {
            alert: 'OomwatchAgentDown',
            expr: 'up{%(oomwatchSelector)s} == 0' % $._config,
            'for': '5m',
            labels: {
              severity: 'warning',
            },
            annotations: {
              summary: fold(|||
                oomwatch agent down on {{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}
              |||),
              description: fold(|||
                Prometheus could not scrape the oomwatch agent at {{ $labels.instance }} for 5 minutes: OOM kills on
                that node go unreported. Check the pod (`kubectl -n oomwatch get pods -o wide`, its logs and
                /healthz) or the service (`systemctl status oomwatch`, `journalctl -u oomwatch`).
              |||),
              runbook_url: $._config.runbookURLPattern % 'agent-health.md#agent-down',
            },
          },
          {
            alert: 'OomwatchAgentAbsent',
            expr: 'absent(up{%(oomwatchSelector)s})' % $._config,
            'for': '15m',
            labels: {
              severity: 'warning',
            },
            annotations: {
              summary: 'No oomwatch agent is being scraped',
              description: fold(|||
                Prometheus has no oomwatch scrape target at all, so no OOM kill is reported anywhere. Check that the
                DaemonSet runs (`kubectl -n oomwatch get ds oomwatch`) and that the ServiceMonitor (or the scrape
                config, job name containing "oomwatch") is picked up by this Prometheus.
              |||),
              runbook_url: $._config.runbookURLPattern % 'agent-health.md#agent-absent',
            },
          },
        ],
      },
      // Before the kill (issue 14): the working set is what the kubelet compares with the limit; PSI `full`
      // stalls mean every task of the cgroup waited for memory (reclaim against the limit). Workloads without a
      // limit (+Inf) never match.
      {
        name: 'oomwatch-risk',
        rules: [
          {
            alert: 'OomwatchMemoryNearLimitUnderPressure',
            expr: fold(|||
              oomwatch_memory_working_set_bytes / oomwatch_memory_limit_bytes > 0.9
              and ignoring (kind)
              rate(oomwatch_memory_pressure_seconds_total{kind="full"}[5m]) > 0
            |||),
            'for': '2m',
            labels: {
              severity: 'warning',
            },
            annotations: {
              summary: fold(|||
                {{ if $labels.pod }}{{ $labels.namespace }}/{{ $labels.pod }} container {{ $labels.container }}{{ else }}cgroup {{ $labels.cgroup }}{{ end }} is at {{ $value | humanizePercentage }} of its memory limit and stalling
              |||),
              description: fold(|||
                The working set (memory.current less inactive file pages, as the kubelet counts it) of
                {{ if $labels.pod }}container {{ $labels.container }} of pod {{ $labels.namespace }}/{{ $labels.pod }}{{ else }}cgroup {{ $labels.cgroup }}{{ end }}
                is above 90% of its memory limit, and all of its tasks have been stalled waiting for memory
                (PSI full) in the last 5 minutes: the kernel is reclaiming against the limit, and the OOM killer is
                next. Raise the limit or reduce the memory use before it is killed.
              |||),
              runbook_url: $._config.runbookURLPattern % 'memory-risk.md#oomwatchmemorynearlimitunderpressure',
            },
          },
          {
            alert: 'OomwatchMemoryLimitIn15m',
            expr: fold(|||
              predict_linear(oomwatch_memory_working_set_bytes[10m], 900) >= oomwatch_memory_limit_bytes
              and
              oomwatch_memory_working_set_bytes < oomwatch_memory_limit_bytes
            |||),
            'for': '2m',
            labels: {
              severity: 'warning',
            },
            annotations: {
              summary: fold(|||
                {{ if $labels.pod }}{{ $labels.namespace }}/{{ $labels.pod }} container {{ $labels.container }}{{ else }}cgroup {{ $labels.cgroup }}{{ end }} will reach its memory limit within 15 minutes
              |||),
              description: fold(|||
                At the rate of the last 10 minutes, the working set of
                {{ if $labels.pod }}container {{ $labels.container }} of pod {{ $labels.namespace }}/{{ $labels.pod }}{{ else }}cgroup {{ $labels.cgroup }}{{ end }}
                reaches its memory limit within 15 minutes, when the kernel OOM killer will kill a process of it.
                Find what grows (a leak, a cache without a bound, a larger batch) and raise the limit or stop it.
              |||),
              runbook_url: $._config.runbookURLPattern % 'memory-risk.md#oomwatchmemorylimitin15m',
            },
          },
        ],
      },
    ],
  },
}
