// The Grafana dashboard (monitoring-mixins: grafanaDashboards), rendered to deploy/grafana/oomwatch-dashboard.json
// and the chart's copy by scripts/generate-mixin. Plain jsonnet objects in Grafana's JSON model (schemaVersion
// 39), no grafonnet: the panels below are the dashboard's JSON, with the variables' matchers from `selectors`.
local panelNames = {
  bargauge: 'Bar gauge',
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
            expr: 'sum(increase(oomwatch_oom_kills_total{%(workload)s}[$__range]))' % selectors,
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
            expr: 'sum(increase(oomwatch_oom_killed_processes_total{role="collateral", %(workload)s}[$__range]))' % selectors,
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
            expr: 'sum(increase(oomwatch_node_oom_kills_total{scope="node", %(node)s}[$__range]))' % selectors,
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
            expr: 'sum(increase(oomwatch_kmsg_lost_records_total{%(node)s}[$__range]))' % selectors,
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
            expr: 'sum by (kind) (increase(oomwatch_oom_kills_total{%(workload)s}[$__rate_interval]))' % selectors,
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
            expr: 'sum by (node, instance, scope) (increase(oomwatch_node_oom_kills_total{%(node)s}[$__rate_interval]))' % selectors,
            legendFormat: '{{node}}{{instance}} {{scope}}',
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
            expr: 'sum by (namespace, pod, container, cgroup, role) (increase(oomwatch_oom_killed_processes_total{%(workload)s}[$__rate_interval]))' % selectors,
            legendFormat: '{{namespace}}/{{pod}}/{{container}}{{cgroup}} {{role}}',
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
        title: 'Top containers by OOM kills',
        description: 'Workloads with the most OOM incidents in the dashboard\'s time range.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 12, y: 12, w: 12, h: 8 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'topk(10, sum by (namespace, pod, container, cgroup) (increase(oomwatch_oom_kills_total{%(workload)s}[$__range])) > 0)' % selectors,
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
            options: { excludeByName: { Time: true }, renameByName: { Value: 'OOM kills' } },
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
            expr: 'oomwatch_memory_usage_bytes{%(workload)s} and on (namespace, pod, container, cgroup) (sum by (namespace, pod, container, cgroup) (increase(oomwatch_oom_kills_total{%(workload)s}[$__range])) > 0)' % selectors,
            legendFormat: '{{namespace}}/{{pod}}/{{container}}{{cgroup}} usage',
          },
          {
            refId: 'B',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'oomwatch_memory_limit_bytes{%(workload)s} and on (namespace, pod, container, cgroup) (sum by (namespace, pod, container, cgroup) (increase(oomwatch_oom_kills_total{%(workload)s}[$__range])) > 0)' % selectors,
            legendFormat: '{{namespace}}/{{pod}}/{{container}}{{cgroup}} limit',
          },
          {
            refId: 'C',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'oomwatch_memory_peak_bytes{%(workload)s} and on (namespace, pod, container, cgroup) (sum by (namespace, pod, container, cgroup) (increase(oomwatch_oom_kills_total{%(workload)s}[$__range])) > 0)' % selectors,
            legendFormat: '{{namespace}}/{{pod}}/{{container}}{{cgroup}} peak',
          },
        ],
        fieldConfig: {
          defaults: {
            unit: 'bytes',
            custom: { drawStyle: 'line', fillOpacity: 10, stacking: { mode: 'none' } },
          },
          overrides: [
            {
              matcher: { id: 'byRegexp', options: '.* limit' },
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
        description: 'Last OOM kill of each workload, newest first, with its kind and scope. The agent\'s one-sentence explanation of each incident is in its events file (on stdout in the DaemonSet and chart: your log pipeline, e.g. Loki `{container="oomwatch"} | json | line_format "{{.explanation}}"`) and at /incidents on the node\'s agent (the link on each row, from the instance column), or `oomwatch inspect` on the node. It is not a label: a sentence with pids would start a new series at every incident.',
        datasource: { type: 'prometheus', uid: '${datasource}' },
        gridPos: { x: 0, y: 29, w: 14, h: 9 },
        targets: [
          {
            refId: 'A',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sort_desc(max by (namespace, pod, container, cgroup, node) (oomwatch_last_oom_kill_timestamp_seconds{%(workload)s}) * 1000)' % selectors,
            legendFormat: '',
            instant: true,
            range: false,
            format: 'table',
          },
          {
            refId: 'B',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'max by (namespace, pod, container, cgroup, node, instance, kind, scope) (oomwatch_last_oom_kill_info{%(workload)s})' % selectors,
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
              excludeByName: { Time: true, job: true, 'Value #B': true },
              renameByName: { 'Value #A': 'Last OOM kill', Value: 'Last OOM kill' },
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
            expr: 'avg by (node, instance) (oomwatch_memory_oom_group{container!="", %(node)s})' % selectors,
            legendFormat: '{{node}}{{instance}}',
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
            expr: 'sum by (node, instance) (rate(oomwatch_kmsg_records_total{%(node)s}[$__rate_interval]))' % selectors,
            legendFormat: '{{node}}{{instance}} records/s',
          },
          {
            refId: 'B',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sum by (node, instance) (increase(oomwatch_kmsg_lost_records_total{%(node)s}[$__rate_interval]))' % selectors,
            legendFormat: '{{node}}{{instance}} lost',
          },
          {
            refId: 'C',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'sum by (node, instance) (increase(oomwatch_kmsg_parse_errors_total{%(node)s}[$__rate_interval]))' % selectors,
            legendFormat: '{{node}}{{instance}} parse errors',
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
            expr: 'topk(20, oomwatch_memory_working_set_bytes{%(workload)s} / oomwatch_memory_limit_bytes{%(workload)s})' % selectors,
            legendFormat: '',
            instant: true,
            range: false,
            format: 'table',
          },
          {
            refId: 'B',
            datasource: { type: 'prometheus', uid: '${datasource}' },
            expr: 'rate(oomwatch_memory_pressure_seconds_total{kind="full", %(workload)s}[$__rate_interval])' % selectors,
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
          { id: 'organize', options: { excludeByName: { Time: true, job: true, kind: true } } },
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
      ] + [
        { type: 'panel', id: type, name: panelNames[type], version: '' }
        for type in std.set([p.type for p in panels])
      ],
      title: cfg.dashboardTitle,
      uid: cfg.dashboardUid,
      description: 'OOM kills per workload and node from the oomwatch agent: group vs single kills, collateral processes, memory against limits, node posture and kernel log health.',
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
          queryVariable('cluster', 'Cluster', 'label_values(oomwatch_node_info, %s)' % cfg.clusterLabel,
                        hide=if cfg.showMultiCluster then 0 else 2, multi=false),
          queryVariable('node', 'Node', 'label_values(oomwatch_node_info{%s}, %s)' % [cluster, cfg.nodeLabel]),
          queryVariable('namespace', 'Namespace',
                        'label_values(oomwatch_oom_kills_total{%(node)s}, namespace)' % selectors),
          queryVariable('pod', 'Pod',
                        'label_values(oomwatch_oom_kills_total{%(node)s, namespace=~"$namespace"}, pod)' % selectors),
        ],
      },
      panels: panels,
    },
  },
}
