"""Keep the alert rules in one place.

mixin/ is the source, rendered to deploy/prometheus/oomwatch-rules.yaml by scripts/generate-mixin, which
uses these functions for the two copies. This writes the same groups into the Kustomize
PrometheusRule (daemonset/prometheusrule.yaml) and the Helm chart's copy
(charts/oomwatch/files/oomwatch-rules.yaml, read with .Files.Get, so Helm never templates the
alerts' {{ $labels }}). tests/deploy/test_rules.py fails when they drift:

    .venv/bin/python tests/deploy/sync_rules.py
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "deploy/prometheus/oomwatch-rules.yaml"
KUSTOMIZE_RULE = ROOT / "daemonset/prometheusrule.yaml"
CHART_RULES = ROOT / "charts/oomwatch/files/oomwatch-rules.yaml"

_HEADER = """\
# GENERATED from mixin/ by scripts/generate-mixin (through deploy/prometheus/oomwatch-rules.yaml): edit
# mixin/alerts/alerts.libsonnet or mixin/rules/rules.libsonnet and re-run `scripts/generate-mixin`.
"""

_PROMETHEUS_RULE = """\
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: oomwatch
  labels:
    app.kubernetes.io/name: oomwatch
    app.kubernetes.io/component: agent
spec:
"""


def _rules_body(text: str) -> str:
    """The rules file without its leading comment block: from `groups:` on."""
    start = text.index("\ngroups:") + 1 if not text.startswith("groups:") else 0
    return text[start:]


def kustomize_rule(source_text: str) -> str:
    body = _rules_body(source_text)
    indented = "".join(("  " + line) if line.strip() else line for line in body.splitlines(keepends=True))
    return _HEADER + _PROMETHEUS_RULE + indented


def chart_rules(source_text: str) -> str:
    return _HEADER + _rules_body(source_text)


def main() -> None:
    text = SOURCE.read_text()
    KUSTOMIZE_RULE.write_text(kustomize_rule(text))
    CHART_RULES.write_text(chart_rules(text))
    print(f"wrote {KUSTOMIZE_RULE.relative_to(ROOT)} and {CHART_RULES.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
