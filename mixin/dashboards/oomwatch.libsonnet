// The Grafana dashboard (monitoring-mixins: grafanaDashboards), rendered to deploy/grafana/oomwatch-dashboard.json
// and the chart's copy by scripts/generate-mixin. Plain jsonnet objects in Grafana's JSON model (schemaVersion
// 39), no grafonnet: the panels below are the dashboard's JSON, with the variables' matchers from `selectors`.
local utils = import '../lib/utils.libsonnet';
local panelNames = {
  bargauge: 'Bar gauge',
  logs: 'Logs',
  stat: 'Stat',
  table: 'Table',
  timeseries: 'Time series',
};

{
  local cfg = $._config,

  // The matchers of the template variables, in every query. The cluster matcher is in each of them whether
  // or not showMultiCluster shows the variable: its "All" (.*) matches series without the label.
  local cluster = '%s=~"$cluster"' % cfg.clusterLabel,
  local selectors = {
    node: '%s, %s=~"$node"' % [cluster, cfg.nodeLabel],
    pod: '%s, namespace=~"$namespace", pod=~"$pod"' % cluster,
    workload: 'namespace=~"$namespace", pod=~"$pod", %s' % self.node,
  },

  // Which workload a series is, in one label that reads for every type. A per-workload series carries
  // namespace, pod and container (Kubernetes) or cgroup (a Slurm job or step, a systemd unit, any other cgroup),
  // the others empty (docs/contract.md "Metrics"), so a legend that wrote them side by side read "///a".
  // `named(expr)` adds `workload`: namespace/pod/container (namespace/pod: a pod's own cgroup); "Slurm job 42
  // step 0 on <node>" (the contract's slurmstepd scope only: a job_42 elsewhere is no Slurm job); "<cgroup> on
  // <node>" for the rest (a unit's path is the same on every node); a table with a node column leaves out " on <node>". Built in the query (label_join and
  // label_replace) rather than by a recording rule: the panels keep their own matchers and $__range, and read
  // where the mixin's rules are not loaded. Aggregations keep the node label, so one path on two nodes stays two.
  local node = cfg.nodeLabel,
  local byWorkload(extra=[]) = utils.labels(cfg, ['namespace', 'pod', 'container', 'cgroup', node] + extra),
  local slurmJob = '(?:/system[.]slice)?/(?:[^/]*_)?slurmstepd[.]scope/job_([0-9]+)',
  local named(expr, onNode=true) =
    // onNode=false: for a table with its own node column
    local first = if onNode then 'label_join(%s, "workload", " on ", "cgroup", "%s")' % [expr, node]
                  else 'label_replace(%s, "workload", "$1", "cgroup", "(.+)")' % expr;
    local at(group) = if onNode then [' on $%d' % group, ' on (.*)'] else ['', ''];
    local slurm = 'label_replace(%s, "workload", "Slurm job $1%s", "workload", "%s%s")'
                  % [first, at(2)[0], slurmJob, at(2)[1]];
    local step = 'label_replace(%s, "workload", "Slurm job $1 step $2%s", "workload", "%s/step_([^/]+)%s")'
                 % [slurm, at(3)[0], slurmJob, at(3)[1]];
    local podPath = 'label_join(%s, "pod_path", "/", "namespace", "pod", "container")' % step;
    local pod = 'label_replace(%s, "workload", "$1", "pod_path", "(.+/[^/]+)/?")' % podPath;
    'label_replace(%s, "pod_path", "", "pod_path", ".*")' % pod,

  // Kill counts are whole numbers. Over the time range (stats, tables): each series' increase() rounded before
  // any sum (increase() extrapolates to the range's edges: 1.25, 3.3), as close as a range query gets.
  // Per step (bars): the counter's change since the previous step, `c - c offset $__interval` (Grafana's step
  // is $__interval): consecutive steps tile the time, so the bars, and their legend's sum, add up to the kills
  // counted; increase() over $__rate_interval overlaps the next step's window and counted one kill twice.
  // A reset (an agent without --state-dir restarted) is a negative change, clamped to 0; a series with no sample
  // a step ago (new, or Prometheus younger than the step) counts 0 there, as increase() would, not nothing.
  local killsInRange(selector) = 'round(increase(%s[$__range]))' % selector,
  local killsPerStep(selector) = '(clamp_min(%s - %s offset $__interval, 0) or %s * 0)' % [selector, selector, selector],

  // "Jobs hit by OOM kills": each workload's series joined with its job (oomwatch_workload_job_info) as last
  // seen in the time range, so a pod deleted after its kill keeps its job; one info series per workload
  // (topk: were a pod told two jobs within the range, one of them), and workloads without a known job kept,
  // with an empty job (`or ignoring`), so that every kill is in the table.
  local jobKeys = utils.labels(cfg, ['job', 'instance', 'namespace', 'pod', 'cgroup']),
  local jobBy = utils.labels(cfg, ['namespace', 'job_kind', 'job_name']),
  local jobInfo = 'topk by (%s) (1, max_over_time(oomwatch_workload_job_info{%s}[$__range]))'
                  % [jobKeys, selectors.workload],
  local withJob(expr) = '(%s) * on (%s) group_left (job_kind, job_name) %s or ignoring (job_kind, job_name) (%s)'
                        % [expr, jobKeys, jobInfo, expr],
  local jobKills(matchers) = killsInRange('oomwatch_oom_kills_total{%s%s}' % [matchers, selectors.workload]),
  local jobsHit = 'sum by (%s) (%s) > 0' % [jobBy, withJob(jobKills(''))],
  // The killed workloads of each row, whatever their type: its pods (Kubernetes: a pod's containers are one),
  // Slurm steps (a job's own cgroup counts as one), units or cgroups (one path on two nodes is two). One column:
  // a column per type was empty wherever that type was not killed, and a query with no data is a panel query
  // without data to the real-kernel tier (tests/e2e/test_real_kernel.py).
  local killedWorkloads = 'count by (%s) (sum by (%s) (%s) > 0)'
                          % [jobBy, utils.labels(cfg, ['namespace', 'job_kind', 'job_name', 'pod', 'cgroup', node]),
                             withJob(jobKills(''))],
  // Tables show `workload` in place of the identity labels it is made of.
  local hiddenIdentity = { namespace: true, pod: true, container: true, cgroup: true },

  // "Explanations (Loki)": the incidents of the events file, as a log shipper sends the agent's stdout to Loki.
  local logsStream = std.join(', ', std.prune([
    if cfg.logsClusterLabel != '' then '%s=~"$cluster"' % cfg.logsClusterLabel,
    if cfg.logsNodeLabel != '' then '%s=~"$node"' % cfg.logsNodeLabel,
    cfg.logsSelector,
  ])),
  local logsQuery = std.join(' | ', [
    '{%s} |= `"explanation"`' % logsStream,
    'json kind, scope, explanation, workload_namespace="workload.namespace", workload_pod="workload.pod", '
    + 'workload_job="workload.job.name", workload_owner="workload.owner.name", '
    + 'workload_slurm_job="workload.slurm_job"',
    'explanation != ""',
    'workload_namespace=~"$namespace"',
    'workload_pod=~"$pod"',
    'workload_job=~"$job" or workload_owner=~"$job" or workload_slurm_job=~"$job"',
    'line_format `{{.kind}} kill, scope {{.scope}}: {{.explanation}}`',
  ]),

  local queryVariable(name, label, query, hide=0, multi=true) = {
    name: name,
    label: label,
    type: 'query',
    datasource: { type: 'prometheus', uid: '${datasource}' },
    query: { query: query, refId: name + '-var' },
    definition: query,
    refresh: 2,
    includeAll: true,
    // "All" must match series without the label (workloads outside Kubernetes, hosts without `node`).
    allValue: '.*',
    multi: multi,
    sort: 1,
    current: if multi then { selected: true, text: ['All'], value: ['$__all'] }
             else { selected: true, text: 'All', value: '$__all' },
    options: [],
    hide: hide,
  },

  local panels = [
      {
        id: 1,
        type: 'stat',
        title: 'OOM kills in range',
        description: 'Incidents in which a workload lost at least one process (oomwatch_oom_kills_total).',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 0, y: 0, w: 6, h: 4 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sum(%s)' % killsInRange('oomwatch_oom_kills_total{%(workload)s}' % selectors),
            legendFormat: '',
          },
        ],
        fieldConfig: {
          defaults: {
            unit: 'short',
            decimals: 0,
            color: { mode: 'thresholds' },
            thresholds: {
              mode: 'absolute',
              steps: [{ color: 'green', value: null }, { color: 'red', value: 1 }],
            },
          },
          overrides: [],
        },
        options: {
          reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
          colorMode: 'background',
          graphMode: 'none',
          textMode: 'auto',
        },
      },
      {
        id: 2,
        type: 'stat',
        title: 'Collateral processes in range',
        description: 'Processes killed only because memory.oom.group=1 put them in the victim\'s group.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 6, y: 0, w: 6, h: 4 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sum(%s)' % killsInRange('oomwatch_oom_killed_processes_total{role="collateral", %(workload)s}' % selectors),
            legendFormat: '',
          },
        ],
        fieldConfig: {
          defaults: {
            unit: 'short',
            decimals: 0,
            color: { mode: 'thresholds' },
            thresholds: {
              mode: 'absolute',
              steps: [{ color: 'green', value: null }, { color: 'orange', value: 1 }],
            },
          },
          overrides: [],
        },
        options: {
          reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
          colorMode: 'background',
          graphMode: 'none',
          textMode: 'auto',
        },
      },
      {
        id: 3,
        type: 'stat',
        title: 'Node-wide OOMs in range',
        description: 'Global OOMs or the kubepods (node allocatable) limit: the node ran out of memory.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 12, y: 0, w: 6, h: 4 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sum(%s)' % killsInRange('oomwatch_node_oom_kills_total{scope="node", %(node)s}' % selectors),
            legendFormat: '',
          },
        ],
        fieldConfig: {
          defaults: {
            unit: 'short',
            decimals: 0,
            color: { mode: 'thresholds' },
            thresholds: {
              mode: 'absolute',
              steps: [{ color: 'green', value: null }, { color: 'red', value: 1 }],
            },
          },
          overrides: [],
        },
        options: {
          reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
          colorMode: 'background',
          graphMode: 'none',
          textMode: 'auto',
        },
      },
      {
        id: 4,
        type: 'stat',
        title: 'Kernel log records lost in range',
        description: 'Records the kernel overwrote before oomwatch read them; kills may be missing details.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 18, y: 0, w: 6, h: 4 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sum(%s)' % killsInRange('oomwatch_kmsg_lost_records_total{%(node)s}' % selectors),
            legendFormat: '',
          },
        ],
        fieldConfig: {
          defaults: {
            unit: 'short',
            decimals: 0,
            color: { mode: 'thresholds' },
            thresholds: {
              mode: 'absolute',
              steps: [{ color: 'green', value: null }, { color: 'orange', value: 1 }],
            },
          },
          overrides: [],
        },
        options: {
          reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
          colorMode: 'background',
          graphMode: 'none',
          textMode: 'auto',
        },
      },
      {
        id: 5,
        type: 'timeseries',
        title: 'OOM kills over time by kind',
        description: 'single: only the victim died; group: memory.oom.group=1 killed the victim\'s whole cgroup.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 0, y: 4, w: 12, h: 8 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sum by (kind) (%s)' % killsPerStep('oomwatch_oom_kills_total{%(workload)s}' % selectors),
            legendFormat: '{{kind}}',
          },
        ],
        fieldConfig: {
          defaults: {
            unit: 'short',
            custom: { drawStyle: 'bars', fillOpacity: 20, stacking: { mode: 'normal' } },
          },
          overrides: [],
        },
        options: {
          legend: { displayMode: 'table', placement: 'right', calcs: ['sum'] },
          tooltip: { mode: 'multi', sort: 'desc' },
        },
      },
      {
        id: 6,
        type: 'timeseries',
        title: 'Node OOM incidents by scope',
        description: 'Where the limit was hit: container, pod, node (global OOM) or another cgroup.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 12, y: 4, w: 12, h: 8 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sum by (%s) (%s)' % [utils.labels(cfg, [node, 'scope']),
                                        killsPerStep('oomwatch_node_oom_kills_total{%(node)s}' % selectors)],
            legendFormat: '{{%s}}: {{scope}}' % node,
          },
        ],
        fieldConfig: {
          defaults: {
            unit: 'short',
            custom: { drawStyle: 'bars', fillOpacity: 20, stacking: { mode: 'normal' } },
          },
          overrides: [],
        },
        options: {
          legend: { displayMode: 'table', placement: 'right', calcs: ['sum'] },
          tooltip: { mode: 'multi', sort: 'desc' },
        },
      },
      {
        id: 7,
        type: 'timeseries',
        title: 'Processes killed by role',
        description: 'victim: the process the kernel chose; collateral: every other process of a group kill.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 0, y: 12, w: 12, h: 8 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: named('sum by (%s) (%s)' % [byWorkload(['role']),
                                              killsPerStep('oomwatch_oom_killed_processes_total{%(workload)s}' % selectors)]),
            legendFormat: '{{workload}}: {{role}}',
          },
        ],
        fieldConfig: {
          defaults: {
            unit: 'short',
            custom: { drawStyle: 'bars', fillOpacity: 20, stacking: { mode: 'normal' } },
          },
          overrides: [],
        },
        options: {
          legend: { displayMode: 'table', placement: 'right', calcs: ['sum'] },
          tooltip: { mode: 'multi', sort: 'desc' },
        },
      },
      {
        id: 8,
        type: 'table',
        title: 'Top workloads by OOM kills',
        description: 'Workloads with the most OOM incidents in the dashboard\'s time range: Kubernetes containers and pods (namespace/pod/container), Slurm jobs and steps, systemd units and other cgroups (on their node).',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 12, y: 12, w: 12, h: 8 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: named('topk(10, sum by (%s) (%s) > 0)'
                        % [byWorkload(), killsInRange('oomwatch_oom_kills_total{%(workload)s}' % selectors)], onNode=false),
            legendFormat: '',
            instant: true,
            range: false,
            format: 'table',
          },
        ],
        fieldConfig: { defaults: { decimals: 0 }, overrides: [] },
        transformations: [
          {
            id: 'organize',
            options: {
              excludeByName: hiddenIdentity { Time: true },
              indexByName: { workload: 0, [node]: 1, Value: 2 },
              renameByName: { workload: 'Workload', [node]: 'Node', Value: 'OOM kills' },
            },
          },
          { id: 'sortBy', options: { sort: [{ field: 'OOM kills', desc: true }] } },
        ],
      },
      {
        id: 9,
        type: 'timeseries',
        title: 'Memory usage against limit of OOMing workloads',
        description: 'memory.current, memory.max and memory.peak of the workloads that were OOM-killed in the time range.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 0, y: 20, w: 24, h: 9 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: named('oomwatch_memory_usage_bytes{%(workload)s} and on (%(by)s) (sum by (%(by)s) (increase(oomwatch_oom_kills_total{%(workload)s}[$__range])) > 0)' % (selectors { by: byWorkload() })),
            legendFormat: '{{workload}}: usage',
          },
          {
            refId: 'B',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: named('oomwatch_memory_limit_bytes{%(workload)s} and on (%(by)s) (sum by (%(by)s) (increase(oomwatch_oom_kills_total{%(workload)s}[$__range])) > 0)' % (selectors { by: byWorkload() })),
            legendFormat: '{{workload}}: limit',
          },
          {
            refId: 'C',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: named('oomwatch_memory_peak_bytes{%(workload)s} and on (%(by)s) (sum by (%(by)s) (increase(oomwatch_oom_kills_total{%(workload)s}[$__range])) > 0)' % (selectors { by: byWorkload() })),
            legendFormat: '{{workload}}: peak',
          },
        ],
        fieldConfig: {
          defaults: {
            unit: 'bytes',
            custom: { drawStyle: 'line', fillOpacity: 10, stacking: { mode: 'none' } },
          },
          overrides: [
            {
              matcher: { id: 'byRegexp', options: '.*: limit' },
              properties: [{ id: 'custom.lineStyle', value: { fill: 'dash', dash: [10, 10] } }],
            },
          ],
        },
        options: {
          legend: { displayMode: 'table', placement: 'right', calcs: ['lastNotNull', 'max'] },
          tooltip: { mode: 'multi', sort: 'desc' },
        },
      },
      {
        id: 10,
        type: 'table',
        title: 'Recent incidents',
        description: 'Last OOM kill of each workload, newest first, with its kind and scope. The agent\'s one-sentence explanation of each incident is in the Explanations (Loki) panel below (its events file, on stdout in the DaemonSet and chart, as your log shipper sends it to Loki) and at /incidents on the node\'s agent (the link on each row, from the instance column: installs without Loki), or `oomwatch inspect` on the node. It is not a label: a sentence with pids would start a new series at every incident.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 0, y: 29, w: 14, h: 9 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sort_desc(%s)' % named('max by (%s) (oomwatch_last_oom_kill_timestamp_seconds{%s}) * 1000'
                                             % [byWorkload(['instance']), selectors.workload], onNode=false),
            legendFormat: '',
            instant: true,
            range: false,
            format: 'table',
          },
          {
            refId: 'B',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: named('max by (%s) (oomwatch_last_oom_kill_info{%s})' % [byWorkload(['instance', 'kind', 'scope']), selectors.workload],
                        onNode=false),
            legendFormat: '',
            instant: true,
            range: false,
            format: 'table',
          },
        ],
        fieldConfig: {
          defaults: {
            links: [
              {
                title: 'Explanations: /incidents on this node\'s agent',
                url: 'http://${__data.fields.instance}/incidents',
                targetBlank: true,
              },
            ],
          },
          overrides: [
            {
              matcher: { id: 'byName', options: 'Last OOM kill' },
              properties: [{ id: 'unit', value: 'dateTimeAsIso' }],
            },
          ],
        },
        transformations: [
          { id: 'merge', options: {} },
          {
            id: 'organize',
            options: {
              excludeByName: hiddenIdentity { Time: true, job: true, 'Value #B': true },
              indexByName: { workload: 0, kind: 2, scope: 3, 'Value #A': 4, instance: 5 } + { [node]: 1 },
              renameByName: { workload: 'Workload', 'Value #A': 'Last OOM kill', Value: 'Last OOM kill' },
            },
          },
          { id: 'sortBy', options: { sort: [{ field: 'Last OOM kill', desc: true }] } },
        ],
      },
      {
        id: 11,
        type: 'table',
        title: 'Node posture',
        description: 'Kernel, cgroup version and the kubelet\'s singleProcessOOMKill on each node (unknown: config not readable).',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 14, y: 29, w: 10, h: 9 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'oomwatch_node_info{%(node)s}' % selectors,
            legendFormat: '',
            instant: true,
            range: false,
            format: 'table',
          },
        ],
        transformations: [
          {
            id: 'organize',
            options: { excludeByName: { Time: true, Value: true, __name__: true, job: true } },
          },
        ],
      },
      {
        id: 12,
        type: 'bargauge',
        title: 'Containers with memory.oom.group=1',
        description: 'Share of the Kubernetes containers (not pods, pause sandboxes or system cgroups: what oomwatch inspect counts) whose cgroup has memory.oom.group=1, i.e. an OOM kill takes the whole container.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 0, y: 38, w: 8, h: 8 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'avg by (%s) (oomwatch_memory_oom_group{container!="", %s})' % [utils.labels(cfg, [node]), selectors.node],
            legendFormat: '{{%s}}' % node,
          },
        ],
        fieldConfig: { defaults: { unit: 'percentunit', min: 0, max: 1 }, overrides: [] },
        options: {
          displayMode: 'gradient',
          orientation: 'horizontal',
          reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
        },
      },
      {
        id: 13,
        type: 'timeseries',
        title: 'Kernel log reader',
        description: 'Records read from /dev/kmsg, records lost to ring-buffer overwrites (EPIPE), records that failed to parse.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 8, y: 38, w: 8, h: 8 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sum by (%s) (rate(oomwatch_kmsg_records_total{%s}[$__rate_interval]))' % [utils.labels(cfg, [node]), selectors.node],
            legendFormat: '{{%s}}: records/s' % node,
          },
          {
            refId: 'B',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sum by (%s) (%s)' % [utils.labels(cfg, [node]), killsPerStep('oomwatch_kmsg_lost_records_total{%(node)s}' % selectors)],
            legendFormat: '{{%s}}: lost' % node,
          },
          {
            refId: 'C',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sum by (%s) (%s)' % [utils.labels(cfg, [node]), killsPerStep('oomwatch_kmsg_parse_errors_total{%(node)s}' % selectors)],
            legendFormat: '{{%s}}: parse errors' % node,
          },
        ],
        fieldConfig: {
          defaults: {
            unit: 'short',
            custom: { drawStyle: 'line', fillOpacity: 10, stacking: { mode: 'none' } },
          },
          overrides: [],
        },
        options: {
          legend: { displayMode: 'table', placement: 'right', calcs: ['lastNotNull', 'max'] },
          tooltip: { mode: 'multi', sort: 'desc' },
        },
      },
      {
        id: 14,
        type: 'timeseries',
        title: 'Detection latency',
        description: 'Kernel kill time to incident published.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 16, y: 38, w: 8, h: 8 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'histogram_quantile(0.5, sum by (le) (rate(oomwatch_detection_latency_seconds_bucket{%(node)s}[$__rate_interval])))' % selectors,
            legendFormat: 'p50',
          },
          {
            refId: 'B',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'histogram_quantile(0.99, sum by (le) (rate(oomwatch_detection_latency_seconds_bucket{%(node)s}[$__rate_interval])))' % selectors,
            legendFormat: 'p99',
          },
        ],
        fieldConfig: {
          defaults: { unit: 's', custom: { drawStyle: 'line', fillOpacity: 10, stacking: { mode: 'none' } } },
          overrides: [],
        },
        options: {
          legend: { displayMode: 'table', placement: 'right', calcs: ['lastNotNull', 'max'] },
          tooltip: { mode: 'multi', sort: 'desc' },
        },
      },
      {
        id: 15,
        type: 'table',
        title: 'At risk: working set against limit',
        description: 'Workloads nearest their memory limit: working set (memory.current less inactive file pages, as the kubelet counts it) as a share of memory.max, and the share of time all their tasks stalled on memory (PSI full). Alerts: OomwatchMemoryNearLimitUnderPressure, OomwatchMemoryLimitIn15m (docs/runbooks/memory-risk.md).',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 0, y: 46, w: 12, h: 9 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: named('topk(20, oomwatch_memory_working_set_bytes{%(workload)s} / oomwatch_memory_limit_bytes{%(workload)s})' % selectors,
                        onNode=false),
            legendFormat: '',
            instant: true,
            range: false,
            format: 'table',
          },
          {
            refId: 'B',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: named('rate(oomwatch_memory_pressure_seconds_total{kind="full", %(workload)s}[$__rate_interval])' % selectors,
                        onNode=false),
            legendFormat: '',
            instant: true,
            range: false,
            format: 'table',
          },
        ],
        fieldConfig: {
          defaults: {},
          overrides: [
            {
              matcher: { id: 'byName', options: 'Value #A' },
              properties: [
                { id: 'unit', value: 'percentunit' },
                { id: 'displayName', value: 'Working set / limit' },
              ],
            },
            {
              matcher: { id: 'byName', options: 'Value #B' },
              properties: [{ id: 'unit', value: 'percentunit' }, { id: 'displayName', value: 'Full stall' }],
            },
          ],
        },
        transformations: [
          { id: 'merge', options: {} },
          {
            id: 'organize',
            options: {
              excludeByName: hiddenIdentity { Time: true, job: true, kind: true, instance: node != 'instance' },
              indexByName: { workload: 0, [node]: 1 },
              renameByName: { workload: 'Workload' },
            },
          },
          { id: 'sortBy', options: { sort: [{ field: 'Working set / limit', desc: true }] } },
        ],
      },
      {
        id: 16,
        type: 'stat',
        title: 'OOMKilled: Kubernetes against the kernel',
        description: 'Containers restarted or OOM-killed in the last 15 minutes, by verdict: Kubernetes\' last terminated reason (kube-state-metrics) against the kernel\'s kills in the container\'s run (oomwatch:container_run_oom_kills, recorded from its cgroup\'s memory.events oom_kill). Recording rules of the oomwatch-oomkilled group (0 where they are not loaded; without kube-state-metrics, every recent kill counts as unreported); which containers: query the rule in Explore. docs/runbooks/oomkilled-verdict.md.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 12, y: 46, w: 12, h: 9 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'count(oomwatch:container_oomkilled_confirmed:15m{%(pod)s}) or vector(0)' % selectors,
            legendFormat: 'OOMKilled, and the kernel agrees',
            instant: true,
            range: false,
          },
          {
            refId: 'B',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'count(oomwatch:container_oomkilled_stale:15m{%(pod)s}) or vector(0)' % selectors,
            legendFormat: 'OOMKilled, no kernel kill in that run (stale)',
            instant: true,
            range: false,
          },
          {
            refId: 'C',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'count(oomwatch:container_oom_kill_unreported:15m{%(pod)s}) or vector(0)' % selectors,
            legendFormat: 'OOM-killed, Kubernetes says Error/Completed or nothing',
            instant: true,
            range: false,
          },
        ],
        fieldConfig: { defaults: { unit: 'none', decimals: 0 }, overrides: [] },
        transformations: [],
        options: {
          reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
          textMode: 'value_and_name',
          colorMode: 'value',
          graphMode: 'none',
          orientation: 'horizontal',
        },
      },
      {
        id: 17,
        type: 'table',
        title: 'Jobs hit by OOM kills',
        description: 'OOM kills in the time range by the job of the killed workload (oomwatch_workload_job_info): a Kubernetes pod\'s training or batch job (JobSet, PyTorchJob, TFJob, MPIJob, TrainJob, RayJob, Determined, Kueue), else its controlling owner (a batch Job, RayCluster, ReplicaSet...), a Slurm job (SlurmJob and its id). A row without a job: kills of workloads whose job the agent does not know (no Kubernetes API access, a bare pod, a systemd unit). Workloads: the killed workloads of the row: pods (Kubernetes), Slurm steps (a job\'s own cgroup counts as one), systemd units or other cgroups (one path on two nodes is two). Kill counts are each workload\'s increase() over the range, rounded. The explanations are not labels: each row links to the Explanations panel narrowed to the job; without Loki, to /incidents through the Recent incidents rows. Recording rules oomwatch:workload_oom_kills_total:job and oomwatch:job_oom_kills:increase1h keep the same join for alerts and long ranges.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 0, y: 55, w: 12, h: 9 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: jobsHit,
            legendFormat: '',
            instant: true,
            range: false,
            format: 'table',
          },
          {
            refId: 'B',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sum by (%s) (%s) and on (%s) (%s)'
                  % [jobBy, withJob(jobKills('kind="group", ')), jobBy, jobsHit],
            legendFormat: '',
            instant: true,
            range: false,
            format: 'table',
          },
          {
            refId: 'C',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: killedWorkloads,
            legendFormat: '',
            instant: true,
            range: false,
            format: 'table',
          },
          {
            refId: 'D',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'max by (%s) (%s) * 1000 and on (%s) (%s)'
                  % [jobBy,
                     withJob('max_over_time(oomwatch_last_oom_kill_timestamp_seconds{%s}[$__range])' % selectors.workload),
                     jobBy, jobsHit],
            legendFormat: '',
            instant: true,
            range: false,
            format: 'table',
          },
        ],
        fieldConfig: {
          defaults: {
            decimals: 0,
            links: [
              {
                title: 'Explanations of this job\'s kills (the Explanations panel, narrowed to it)',
                url: '/d/${__dashboard.uid}/${__dashboard}?${__url_time_range}&${datasource:queryparam}&${logs:queryparam}&${cluster:queryparam}&${node:queryparam}&var-namespace=${__data.fields.namespace}&var-pod=$__all&var-job=${__data.fields.job_name}',
              },
            ],
          },
          overrides: [
            {
              matcher: { id: 'byName', options: 'Last kill' },
              properties: [{ id: 'unit', value: 'dateTimeAsIso' }],
            },
          ],
        },
        transformations: [
          { id: 'merge', options: {} },
          {
            id: 'organize',
            options: {
              excludeByName: { Time: true },
              indexByName: { namespace: 0, job_kind: 1, job_name: 2, 'Value #A': 3, 'Value #B': 4, 'Value #C': 5,
                             'Value #D': 6 },
              renameByName: { job_kind: 'Kind', job_name: 'Job', 'Value #A': 'Kills', 'Value #B': 'Group kills',
                              'Value #C': 'Workloads', 'Value #D': 'Last kill' },
            },
          },
          { id: 'sortBy', options: { sort: [{ field: 'Kills', desc: true }] } },
        ],
      },
      {
        id: 18,
        type: 'logs',
        title: 'Explanations (Loki)',
        description: 'The agent\'s one-sentence explanation of each OOM kill of the selected cluster, node, namespace and pod (and the Job box: a job, owner or Slurm job id, regex), from its events file as your log shipper sends it to Loki: the DaemonSet and the chart write it to the agent container\'s stdout (--events-file -), one JSON incident per line. Needs a Loki data source in the Logs variable, and the stream labels of the mixin\'s _config (logsSelector, logsNodeLabel, logsClusterLabel: README "Explanations in Loki"). Without Loki: the Recent incidents rows link to each node agent\'s /incidents, and `oomwatch inspect` on the node explains each kill.',
        datasource: { type: 'loki', uid: '${logs}' },
        gridPos: { x: 12, y: 55, w: 12, h: 9 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'loki', uid: '${logs}' },
            expr: logsQuery,
            queryType: 'range',
          },
        ],
        options: {
          showTime: true,
          showLabels: false,
          showCommonLabels: false,
          wrapLogMessage: true,
          prettifyLogMessage: false,
          enableLogDetails: true,
          dedupStrategy: 'none',
          sortOrder: 'Descending',
        },
      },
      {
        id: 19,
        type: 'bargauge',
        title: 'What held the memory at the last kill',
        description: 'For each workload OOM-killed in the time range: what held the memory of the cgroup whose limit was hit at its last kill, by type (anon, page cache, tmpfs/shmem, kernel, socket buffers, unevictable; the types that held nothing are left out), from the kernel\'s own report (oomwatch_last_oom_kill_memory_bytes). shmem that fills the limit stays charged after a restart; the verdict, the largest processes and what to change are in each incident (Explanations, /incidents). Workloads whose report the kernel\'s ratelimit hid have no bars.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 0, y: 64, w: 24, h: 8 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: named('max by (%(byType)s) (oomwatch_last_oom_kill_memory_bytes{%(workload)s}) > 0 and on (%(by)s) (sum by (%(by)s) (increase(oomwatch_oom_kills_total{%(workload)s}[$__range])) > 0)'
                         % (selectors { by: byWorkload(), byType: byWorkload(['type']) })),
            legendFormat: '{{workload}}: {{type}}',
            instant: true,
            range: false,
          },
        ],
        fieldConfig: { defaults: { unit: 'bytes', min: 0 }, overrides: [] },
        options: { orientation: 'horizontal', displayMode: 'basic', showUnfilled: true },
      },
    ],

  grafanaDashboards+:: {
    'oomwatch-dashboard.json': {
      // What Grafana's "Export for sharing externally" writes for a dashboard whose data source is a variable:
      // no input (the import form offers the variable's choice instead; a provisioned dashboard has nothing
      // to fill in), and the plugins it needs.
      __inputs: [],
      __requires: [
        { type: 'grafana', id: 'grafana', name: 'Grafana', version: cfg.grafanaVersion },
        { type: 'datasource', id: 'prometheus', name: 'Prometheus', version: '1.0.0' },
        { type: 'datasource', id: 'loki', name: 'Loki', version: '1.0.0' },
      ] + [
        { type: 'panel', id: type, name: panelNames[type], version: '' }
        for type in std.set([p.type for p in panels])
      ],
      title: cfg.dashboardTitle,
      uid: cfg.dashboardUid,
      description: 'OOM kills per workload, job and node from the oomwatch agent: group vs single kills, collateral processes, memory against limits, node posture, kernel log health, the jobs hit and, from Loki, each kill explained.',
      tags: cfg.dashboardTags,
      timezone: cfg.dashboardTimezone,
      editable: true,
      graphTooltip: 1,
      refresh: cfg.dashboardRefresh,
      schemaVersion: 39,
      version: 1,
      time: { from: 'now-6h', to: 'now' },
      links: [],
      annotations: {
        list: [
          {
            builtIn: 1,
            datasource: { type: 'grafana', uid: '-- Grafana --' },
            enable: true,
            hide: true,
            iconColor: 'rgba(0, 211, 255, 1)',
            name: 'Annotations & Alerts',
            type: 'dashboard',
          },
        ],
      },
      templating: {
        list: [
          {
            name: 'datasource',
            label: 'Data source',
            type: 'datasource',
            query: 'prometheus',
            regex: '',
            current: {},
            hide: 0,
            refresh: 1,
            options: [],
            includeAll: false,
            multi: false,
          },
          {
            // The Explanations panel's Loki; none: that panel says so, and the rest of the dashboard works.
            name: 'logs',
            label: 'Logs (Loki)',
            type: 'datasource',
            query: 'loki',
            regex: '',
            current: {},
            hide: 0,
            refresh: 1,
            options: [],
            includeAll: false,
            multi: false,
          },
          queryVariable('cluster', 'Cluster', 'label_values(oomwatch_node_info, %s)' % cfg.clusterLabel,
                        hide=if cfg.showMultiCluster then 0 else 2, multi=false),
          queryVariable('node', 'Node', 'label_values(oomwatch_node_info{%s}, %s)' % [cluster, cfg.nodeLabel]),
          queryVariable('namespace', 'Namespace',
                        'label_values(oomwatch_oom_kills_total{%(node)s}, namespace)' % selectors),
          queryVariable('pod', 'Pod',
                        'label_values(oomwatch_oom_kills_total{%(node)s, namespace=~"$namespace"}, pod)' % selectors),
          {
            // The Explanations panel's job (a regex on the incident's job, owner or Slurm job): the rows of
            // "Jobs hit by OOM kills" set it. A text box, not a query: a node without jobs leaves it at .*.
            name: 'job',
            label: 'Job (explanations)',
            type: 'textbox',
            query: '.*',
            current: { selected: false, text: '.*', value: '.*' },
            options: [{ selected: true, text: '.*', value: '.*' }],
            hide: 0,
          },
        ],
      },
      panels: panels,
    },
  },
}
