(import 'oomwatch.libsonnet')
