"""Read the PromQL (and LogQL) behind the Grafana dashboard's panels.

    from tests.deploy.dashboard import panel_queries
    for title, expr in panel_queries("deploy/grafana/oomwatch-dashboard.json",
                                     {"namespace": ".*", "pod": ".*", "node": ".*"}):
        ...  # run expr against Prometheus, expect data

`panel_queries` gives the Prometheus queries only: the "Explanations (Loki)" panel's LogQL cannot be run
against Prometheus (`panel_queries(path, variables, datasource="loki")` gives it). `prometheus_targets(panel)` is
the same choice for one panel, for code that walks the panels itself.

Template variables are substituted in every form Grafana accepts (`$name`, `${name}`,
`${name:format}`, `[[name]]`). Grafana's built-in `$__rate_interval`, `$__interval` and `$__range`
(plus `_s`/`_ms`), and the mixin's `$cluster` ("All"), get defaults that `variables` can override. A variable that neither `variables`
nor the defaults define raises KeyError, so a query cannot silently keep a `$`.
"""

from __future__ import annotations

import json
import re
from os import PathLike
from typing import Any, Iterator

BUILTINS: dict[str, str] = {
    # The mixin's cluster variable (mixin/config.libsonnet) is hidden unless showMultiCluster: always "All".
    "cluster": ".*",
    "__rate_interval": "5m",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}

# The dashboard's data source types: every panel queries Prometheus through the `datasource` variable but the
# logs panel, which queries Loki through the `logs` variable.
PROMETHEUS, LOKI = "prometheus", "loki"

# ${name}, ${name:format}, [[name]], $name (longest name first: $__range_s before $__range). `$1` is not a variable:
# label_replace's replacement refers to the regex's groups so, and Grafana leaves a name it does not know as it is.
_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)(?::[^\]]*)?\]\]|\$(?![0-9]+\b)(\w+)")


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        # Collapsed rows keep their panels inside.
        yield from _panels(panel.get("panels", []))


def datasource_type(panel: dict[str, Any], target: dict[str, Any]) -> str:
    """The type of data source a target queries: its own, else its panel's, else Prometheus (the dashboard's)."""
    for where in (target, panel):
        ds = where.get("datasource")
        if isinstance(ds, dict) and ds.get("type"):
            return str(ds["type"])
    return PROMETHEUS


def query_targets(panel: dict[str, Any], datasource: str = PROMETHEUS) -> list[dict[str, Any]]:
    """The panel's targets that query `datasource` (a type), shown and with a query."""
    return [t for t in panel.get("targets", [])
            if not t.get("hide") and t.get("expr") and datasource_type(panel, t) == datasource]


def prometheus_targets(panel: dict[str, Any]) -> list[dict[str, Any]]:
    return query_targets(panel, PROMETHEUS)


def substitute(expr: str, variables: dict[str, str]) -> str:
    values = {**BUILTINS, **variables}

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name not in values:
            raise KeyError(f"template variable ${name} has no value in {expr!r}")
        return values[name]

    return _VARIABLE.sub(replace, expr)


def panel_queries(path: str | PathLike[str], variables: dict[str, str],
                  datasource: str = PROMETHEUS) -> list[tuple[str, str]]:
    """(panel title, query) for every target of every panel that queries `datasource` (Prometheus: PromQL; loki:
    LogQL), in dashboard order."""
    with open(path, encoding="utf-8") as f:
        dashboard = json.load(f)
    queries: list[tuple[str, str]] = []
    for panel in _panels(dashboard.get("panels", [])):
        for target in query_targets(panel, datasource):
            queries.append((panel.get("title", ""), substitute(target["expr"], variables)))
    return queries
