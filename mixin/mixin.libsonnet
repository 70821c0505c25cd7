// The oomwatch monitoring mixin (monitoring-mixins layout): prometheusAlerts, prometheusRules,
// grafanaDashboards, configured by _config (config.libsonnet). README.md says how to use it.
(import 'config.libsonnet') +
(import 'alerts/alerts.libsonnet') +
(import 'rules/rules.libsonnet') +
(import 'dashboards/dashboards.libsonnet')
