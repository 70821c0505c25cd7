{
  // A YAML folded scalar (`>-`) as the rules were first written: the lines of a text block joined by single
  // spaces, so a long expression or annotation reads as lines here and is one line in the rule.
  fold(text):: std.join(' ', std.filter(function(line) line != '', std.split(text, '\n'))),

  // `by (...)`/`on (...)` label lists: the cluster label first where several clusters share a Prometheus.
  // A label named twice (nodeLabel: 'instance') is listed once.
  labels(config, names)::
    local all = (if config.showMultiCluster then [config.clusterLabel] else []) + names;
    std.join(', ', std.foldl(function(seen, name) if std.member(seen, name) then seen else seen + [name], all, [])),
}
