"""The alert rules and the Grafana dashboard: promtool checks them, and they name only what the
daemons export.

promtool (Debian's `prometheus` package, which `make install` installs) checks the rules,
runs their unit tests (veritap.rules.test.yml), and parses every dashboard query (written as
recording rules, Grafana's variables replaced by values).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from collector.metrics import CollectorMetrics
from verifierd.metrics import VerifierMetrics

MONITORING = Path(__file__).resolve().parents[2] / "appliance" / "monitoring"
RULES = MONITORING / "prometheus" / "veritap.rules.yml"
RULE_TESTS = MONITORING / "prometheus" / "veritap.rules.test.yml"
DASHBOARD = MONITORING / "grafana" / "veritap.json"
_METRIC = re.compile(r"\b(?:veritap|process|python)_[a-z0-9_]+\b")
_GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$verifier": ".*", "$collector": ".*"}


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is needed (Debian package prometheus; make install installs it)")
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        target["expr"]
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]


def _exported_names(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry can export, labelled children or not."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def test_the_rules_are_valid() -> None:
    checked = _promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_rules_unit_tests_pass() -> None:
    tested = _promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    queries = _dashboard_expressions()
    assert len(queries) > 20
    rules = []
    for i, query in enumerate(queries):
        expression = query
        for variable, value in _GRAFANA_VARIABLES.items():
            expression = expression.replace(variable, value)
        assert "$" not in expression, query
        rules.append({"record": f"veritap:dashboard_query_{i}", "expr": expression})
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = _promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dashboard_has_unique_panel_ids_and_a_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in _panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v["type"] for v in dashboard["templating"]["list"]}
    assert variables["datasource"] == "datasource"
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_metric_named_is_one_the_daemons_export() -> None:
    exported = _exported_names(CollectorMetrics().registry) | _exported_names(
        VerifierMetrics().registry
    )
    named = {
        name
        for expression in _rule_expressions() + _dashboard_expressions()
        for name in _METRIC.findall(expression)
    }
    assert named - exported == set()
    assert {"veritap_prover_alarm", "veritap_verifier_intake_stopped"} <= named


def test_verdict_counts_are_of_current_verdicts() -> None:
    """A verdict a later one superseded (the collector amended its record) is withdrawn: every
    rule and panel that counts verdicts takes the superseded ones off."""
    counting = [
        expression
        for expression in _rule_expressions() + _dashboard_expressions()
        if "veritap_verifier_verdicts_total" in expression
    ]
    assert len(counting) >= 4
    for expression in counting:
        assert "veritap_verifier_verdicts_superseded_total" in expression, expression
