// Recording rules (monitoring-mixins: prometheusRules), and the two alerts that read them in the same group, so
// that each evaluation sees this evaluation's records (a group is evaluated in order). Alerts and rules that
// share a group are why this group is here whole and not split between prometheusAlerts and prometheusRules:
// one PrometheusRule holding both fields must not name a group twice.
//
// After the kill (issue 14): what Kubernetes said (kube-state-metrics) against what the kernel did in the
// container's current run. A run is the container's cgroup: a restart makes a new one, whose memory.events start
// again at 0. A restart in the last 15 minutes ended a run; the three results are 1 per namespace/pod/container.
local utils = import '../lib/utils.libsonnet';
local fold = utils.fold;

{
  local podLabels = { pod: utils.labels($._config, ['namespace', 'pod', 'container']) },
  local jobLabels = {
    keys: utils.labels($._config, ['job', 'instance', 'namespace', 'pod', 'cgroup']),
    by: utils.labels($._config, ['namespace', 'job_kind', 'job_name', 'kind']),
  },

  prometheusRules+:: {
    groups+: [
      {
        name: 'oomwatch-oomkilled',
        rules: [
          {
            // The current run of a Kubernetes container: the processes the kernel killed in it (its cgroup's
            // memory.events oom_kill), present while there is one, and then the time of the container's last
            // incident. Computed here from series the agent exports; with the agent's `--drop-series memory-events`
            // they have no input, and the three results below are never true (stale needs the kernel's counter too).
            record: 'oomwatch:container_run_oom_kills',
            expr: 'max without (event) (oomwatch_memory_events_total{event="oom_kill", container!=""}) > 0',
          },
          {
            record: 'oomwatch:container_run_last_oom_kill_timestamp_seconds',
            expr: 'oomwatch_last_oom_kill_timestamp_seconds{container!=""} and oomwatch:container_run_oom_kills',
          },
          {
            record: 'oomwatch:kube_container_oomkilled_restart:15m',
            expr: fold(|||
              max by (%(pod)s) (kube_pod_container_status_last_terminated_reason{reason="OOMKilled"} == 1)
              and on (%(pod)s)
              max by (%(pod)s) (increase(kube_pod_container_status_restarts_total[15m]) > 0)
            |||) % podLabels,
          },
          {
            record: 'oomwatch:container_run_kernel_oom_kill:15m',
            expr: fold(|||
              max by (%(pod)s) (max_over_time(oomwatch:container_run_oom_kills[15m])) > 0
            |||) % podLabels,
          },
          {
            record: 'oomwatch:container_oomkilled_confirmed:15m',
            expr: fold(|||
              oomwatch:kube_container_oomkilled_restart:15m
              and on (%(pod)s)
              oomwatch:container_run_kernel_oom_kill:15m
            |||) % podLabels,
          },
          {
            record: 'oomwatch:container_oomkilled_stale:15m',
            expr: fold(|||
              oomwatch:kube_container_oomkilled_restart:15m
              and on (%(pod)s)
              max by (%(pod)s) (max_over_time(oomwatch_memory_events_total{event="oom_kill", container!=""}[15m]))
              unless on (%(pod)s)
              oomwatch:container_run_kernel_oom_kill:15m
            |||) % podLabels,
          },
          {
            record: 'oomwatch:container_oom_kill_unreported:15m',
            expr: fold(|||
              max by (%(pod)s) (max_over_time(oomwatch:container_run_last_oom_kill_timestamp_seconds[15m]))
              > time() - 900
              unless on (%(pod)s)
              oomwatch:kube_container_oomkilled_restart:15m
              unless on (%(pod)s)
              max by (%(pod)s) (kube_pod_container_status_terminated_reason{reason="OOMKilled"} == 1)
            |||) % podLabels,
          },
          {
            alert: 'OomwatchOOMKilledStale',
            expr: 'oomwatch:container_oomkilled_stale:15m',
            labels: {
              severity: 'info',
            },
            annotations: {
              summary: fold(|||
                Kubernetes says {{ $labels.namespace }}/{{ $labels.pod }} container {{ $labels.container }} was OOMKilled, but the kernel killed nothing in that run
              |||),
              description: fold(|||
                Container {{ $labels.container }} of pod {{ $labels.namespace }}/{{ $labels.pod }} restarted in the
                last 15 minutes with last terminated reason OOMKilled, yet its cgroup's memory.events counted no OOM
                kill in the run that ended. The reason is stale (kubernetes/kubernetes#140716): look at the
                container's exit code and logs for the real cause before raising its memory limit.
              |||),
              runbook_url: $._config.runbookURLPattern % 'oomkilled-verdict.md#oomkilled-but-no-kernel-kill',
            },
          },
          {
            alert: 'OomwatchOOMKillNotReported',
            // A container the kernel killed is restarted within minutes (CrashLoopBackOff waits at most 5): only a
            // kill that Kubernetes has still not reported as OOMKilled after 10 minutes is one it will not report.
            expr: 'oomwatch:container_oom_kill_unreported:15m',
            'for': '10m',
            labels: {
              severity: 'warning',
            },
            annotations: {
              summary: fold(|||
                The OOM killer killed in {{ $labels.namespace }}/{{ $labels.pod }} container {{ $labels.container }}, and Kubernetes does not say OOMKilled
              |||),
              description: fold(|||
                The kernel OOM killer killed a process of container {{ $labels.container }} of pod
                {{ $labels.namespace }}/{{ $labels.pod }} in the last 15 minutes, but Kubernetes did not report an
                OOMKilled restart: a child process was killed and the container ran on (possibly broken), or the
                container ended with another reason (Error, Completed). `oomwatch inspect {{ $labels.namespace }}/{{ $labels.pod }}`
                on the node names the killed process.
              |||),
              runbook_url: $._config.runbookURLPattern % 'oomkilled-verdict.md#killed-by-the-oom-killer-but-not-oomkilled',
            },
          },
        ],
      },
      // The job each kill broke (issue 22): the agent's oomwatch_workload_job_info joined to its per-workload
      // series. The job is the one last seen in the last 10 minutes (the agent's default --grace-period: the
      // series of a gone workload stay that long), so that a pod deleted right after its kill (a JobSet's
      // restart) still has its job when its last count is scraped. The counter with the job's labels is
      // recorded as it is evaluated: `increase()` over it keeps each kill's job over any range, after the pod
      // and its series are gone.
      {
        name: 'oomwatch-jobs',
        rules: [
          {
            // One series per workload (topk: a pod told two jobs within the 10 minutes, as when the API server
            // answered after its first scrape, must not break the joins below with a many-to-many match).
            record: 'oomwatch:workload_job_info:10m',
            expr: 'topk by (%(keys)s) (1, max_over_time(oomwatch_workload_job_info[10m]))' % jobLabels,
          },
          {
            record: 'oomwatch:workload_oom_kills_total:job',
            expr: fold(|||
              oomwatch_oom_kills_total
              * on (%(keys)s) group_left (job_kind, job_name)
              oomwatch:workload_job_info:10m
            |||) % jobLabels,
          },
          {
            record: 'oomwatch:job_oom_kills:increase1h',
            expr: 'sum by (%(by)s) (increase(oomwatch:workload_oom_kills_total:job[1h]))' % jobLabels,
          },
        ],
      },
    ],
  },
}
