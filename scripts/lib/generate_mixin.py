"""Render mixin/ (jsonnet) into the files this repository ships, or check that they are what it renders.

    scripts/generate-mixin            write them
    scripts/generate-mixin --check    exit 1, naming each file that differs (tests/deploy/test_mixin.py)

Written, all from mixin.libsonnet with its default _config:
    deploy/prometheus/oomwatch-rules.yaml        prometheusAlerts' groups, then prometheusRules'
    charts/oomwatch/files/oomwatch-rules.yaml    the same groups (the chart's PrometheusRule reads them)
    daemonset/prometheusrule.yaml                the same groups in the Kustomize base's PrometheusRule
    deploy/grafana/oomwatch-dashboard.json       grafanaDashboards['oomwatch-dashboard.json']
    charts/oomwatch/files/oomwatch-dashboard.json  the same (the chart's grafanaDashboard ConfigMap)

jsonnet (Debian's, scripts/setup-deploy-tools) evaluates; this writes YAML and JSON in one fixed layout, so
that the same mixin always gives the same bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.deploy import sync_rules  # noqa: E402 - the copies' layout is sync_rules', one definition

MIXIN = ROOT / "mixin"
RULES = ROOT / "deploy/prometheus/oomwatch-rules.yaml"
DASHBOARD = ROOT / "deploy/grafana/oomwatch-dashboard.json"
CHART_DASHBOARD = ROOT / "charts/oomwatch/files/oomwatch-dashboard.json"

RULES_HEADER = """\
# oomwatch alerting and recording rules (plain Prometheus rules file).
# GENERATED from mixin/ by scripts/generate-mixin: edit mixin/alerts/alerts.libsonnet or
# mixin/rules/rules.libsonnet (their comments say why each rule is as it is) and re-run it.
#
# The same groups are in the PrometheusRule of the Kustomize base (daemonset/prometheusrule.yaml) and of the
# Helm chart (charts/oomwatch/files/oomwatch-rules.yaml). Every alert's runbook_url is a file under
# docs/runbooks/ of this repository (a path relative to its root; the chart's prometheusRule.runbookBaseURL
# makes it a link).
"""

# Keys in the order a person reads a rule; anything else after them, sorted (jsonnet sorts every object).
_KEY_ORDER = ["name", "interval", "rules", "record", "alert", "expr", "for", "keep_firing_for", "labels",
              "annotations", "summary", "description", "runbook_url"]


def jsonnet_binary() -> str:
    for candidate in (shutil.which("jsonnet"), ROOT / ".cache/tools/bin/jsonnet"):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    raise SystemExit("generate-mixin: jsonnet not found: run `bash scripts/setup-deploy-tools` "
                     "(it installs Debian's jsonnet)")


def render(jsonnet: str) -> dict[str, Any]:
    """The mixin's rules (alerts' groups, then rules') and dashboards, as jsonnet evaluates them."""
    program = ("local m = import 'mixin.libsonnet'; "
               "{rules: {groups: m.prometheusAlerts.groups + m.prometheusRules.groups}, "
               "dashboards: m.grafanaDashboards}")
    out = subprocess.run([jsonnet, "-e", program], cwd=MIXIN, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"generate-mixin: jsonnet failed:\n{out.stderr}")
    return json.loads(out.stdout)


class _Dumper(yaml.SafeDumper):
    """Block YAML with sequences indented under their key, as the rules were written by hand."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _represent_dict(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.Node:
    rank = {k: i for i, k in enumerate(_KEY_ORDER)}
    items = sorted(data.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))
    return dumper.represent_mapping("tag:yaml.org,2002:map", items)


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    # Long expressions and annotations as folded scalars (>-): one line once loaded, lines here.
    style = ">" if len(data) > 80 and "\n" not in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(dict, _represent_dict)
_Dumper.add_representer(str, _represent_str)


def rules_text(rules: dict[str, Any]) -> str:
    body = yaml.dump(rules, Dumper=_Dumper, width=110, sort_keys=False, allow_unicode=True)
    if yaml.safe_load(body) != rules:  # the layout must never change what Prometheus reads
        raise SystemExit("generate-mixin: the rules' YAML does not load back to what jsonnet rendered")
    return RULES_HEADER + body


def dashboard_text(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def outputs(rendered: dict[str, Any]) -> dict[Path, str]:
    rules = rules_text(rendered["rules"])
    dashboard = dashboard_text(rendered["dashboards"]["oomwatch-dashboard.json"])
    return {
        RULES: rules,
        sync_rules.CHART_RULES: sync_rules.chart_rules(rules),
        sync_rules.KUSTOMIZE_RULE: sync_rules.kustomize_rule(rules),
        DASHBOARD: dashboard,
        CHART_DASHBOARD: dashboard,
    }


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print(__doc__, file=sys.stderr)
        return 2
    differ = []
    for path, text in outputs(render(jsonnet_binary())).items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        differ.append(path.relative_to(ROOT))
        if not check:
            path.write_text(text)
    verb = "differ from mixin/ (run scripts/generate-mixin)" if check else "written"
    for path in differ:
        print(f"generate-mixin: {path}: {verb}", file=sys.stderr)
    if not differ:
        print("generate-mixin: every generated file is up to date", file=sys.stderr)
    return 1 if check and differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
