// What a deployment may change: override with `(import 'mixin.libsonnet') + { _config+:: { ... } }`.
// The defaults render the files this repository ships (scripts/generate-mixin).
{
  _config+:: {
    // The agent's scrape targets, in `up` (OomwatchAgentDown, OomwatchAgentAbsent): the chart's and the Kustomize
    // base's ServiceMonitor name the job after the Service (oomwatch, or RELEASE-oomwatch).
    oomwatchSelector: 'job=~".*oomwatch.*"',

    // The label naming the node on the agent's series: the ServiceMonitor adds `node`; a plain Prometheus
    // scrape config has `instance` (or relabel __meta_kubernetes_pod_node_name to node, as docs/deploy.md shows).
    nodeLabel: 'node',

    // Several clusters in one Prometheus (Thanos, Mimir): the external label naming the cluster. With
    // showMultiCluster the dashboard's cluster variable is shown, and the alerts and recording rules that
    // aggregate keep the label (kubernetes-mixin's convention). The dashboard always filters on it: without
    // the label, its "All" matches every series.
    clusterLabel: 'cluster',
    showMultiCluster: false,

    // runbook_url of every alert: a file under docs/runbooks/ of this repository. The chart's
    // prometheusRule.runbookBaseURL prefixes the shipped rules; here, e.g.
    // 'https://git.example.com/infra/oomwatch/-/blob/v0.1.0/docs/runbooks/%s'.
    runbookURLPattern: 'docs/runbooks/%s',

    // The dashboard's "Explanations (Loki)" panel reads each incident's sentence from the agent's events file as
    // your log shipper sends it to Loki: the DaemonSet and the chart write it to the agent container's stdout
    // (--events-file -). logsSelector picks the agent's log streams (a matcher that cannot match an empty value:
    // Loki refuses a selector without one); the node and cluster variables (Prometheus' values) are matched on
    // logsNodeLabel and logsClusterLabel ('' leaves that matcher out). The defaults are the stream labels of the
    // Promtail chart's pod-log pipeline (namespace, pod, container, node_name; Alloy's configuration converted from
    // it keeps them); Grafana's k8s-monitoring chart labels pod logs namespace, pod, container and job, with no
    // node label: there, logsNodeLabel: '' (README "Explanations in Loki").
    logsSelector: 'container="oomwatch"',
    logsNodeLabel: 'node_name',
    logsClusterLabel: self.clusterLabel,

    // The dashboard.
    dashboardUid: 'oomwatch',
    dashboardTitle: 'oomwatch: OOM kills',
    dashboardTags: ['oomwatch', 'oom', 'memory', 'kubernetes'],
    dashboardTimezone: 'browser',
    dashboardRefresh: '30s',
    // The Grafana version the dashboard's __requires names (grafana.com import); schemaVersion 39 is 10.3's.
    grafanaVersion: '10.3.0',
  },
}
