"""``draftsmith-registry export-alerts``: Prometheus alerting rules from the promoted version's measurements,
read back (YAML + the structure Prometheus' rule loader requires), and checked by promtool when it is on PATH
(a stand-in promtool here: the real one is not installed)."""

import os
import shlex
import stat
from pathlib import Path

import pytest
import yaml
from monitor_fakes import make_registry

from draftsmith import registry_cli
from draftsmith.monitor.alert_rules import (AlertRulesError, acceptance_expr, check_rules_file, prometheus_rules,
                                            rules_yaml)

CELLS = [{"draft": "trained", "k": 2, "concurrency": 4, "acceptance_rate": 0.8},
         {"draft": "trained", "k": 2, "concurrency": 1, "acceptance_rate": 0.9}]
ACCEPTED = "increase(vllm:spec_decode_num_accepted_tokens_total[10m])"
DRAFTED = "increase(vllm:spec_decode_num_draft_tokens_total[10m])"


@pytest.fixture
def registry(tmp_path):
    return make_registry(tmp_path / "registry", cells=CELLS)  # production v1: vLLM measured 0.8 at K=2, concurrency 4


@pytest.fixture
def no_promtool(monkeypatch, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def fake_promtool(directory, exit_code: int):
    """A promtool stand-in that records its arguments and exits `exit_code`."""
    directory.mkdir(exist_ok=True)
    script = directory / "promtool"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {directory / 'args'}\ncp \"$3\" {directory / 'checked.yml'}\n"
                      f"echo 'Checking rules: fake says {exit_code}'\nexit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return directory


def rules_by_name(doc):
    (group,) = doc["groups"]
    return {r["alert"]: r for r in group["rules"]}


def test_export_alerts_thresholds_from_the_promoted_version(registry, tmp_path, capsys, no_promtool):
    out = tmp_path / "alerts" / "demo.rules.yml"
    code = registry_cli.main(["--root", str(registry.root), "export-alerts", "demo", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "promtool not on PATH, not run" in printed
    doc = yaml.safe_load(out.read_text())
    assert check_rules_file(out.read_text()) == doc
    assert doc["groups"][0]["name"] == "draftsmith-demo"
    rules = rules_by_name(doc)
    assert set(rules) == {"DraftAcceptanceDrift", "DraftAcceptanceBelowFloor", "DraftSpecDecodeMetricsAbsent"}
    drift, floor = rules["DraftAcceptanceDrift"], rules["DraftAcceptanceBelowFloor"]
    for rule in (drift, floor):  # acceptance over the window from the same counters, summed over engines
        assert f"sum by (model_name) ({ACCEPTED})" in rule["expr"]
        assert f"sum by (model_name) ({DRAFTED})" in rule["expr"]
        assert f"{DRAFTED}) >= 100" in rule["expr"] and rule["for"] == "15m"
        assert rule["labels"]["draftsmith_name"] == "demo" and rule["labels"]["draftsmith_version"] == "v1"
    assert ") < 0.75\nand" in drift["expr"] and drift["labels"]["severity"] == "warning"  # 0.8 - 0.05
    assert ") < 0.5\nand" in floor["expr"] and floor["labels"]["severity"] == "critical"
    assert "vLLM serving A/B at K=2, concurrency 4" in drift["annotations"]["description"]
    draft = registry.path("demo", 1) / "draft"
    assert f"pair.draft={draft}" in drift["annotations"]["recommendation"]
    assert floor["annotations"]["recommendation"].startswith("disable speculation")
    assert rules["DraftSpecDecodeMetricsAbsent"]["expr"] == "absent(vllm:spec_decode_num_drafts_total)"


def test_export_options_change_the_thresholds_and_selector(registry, capsys, no_promtool):
    code = registry_cli.main(["--root", str(registry.root), "export-alerts", "demo", "--margin", "0.1",
                              "--min-acceptance", "0.6", "--window", "30m", "--for", "1h", "--selector",
                              'job="vllm"', "--min-draft-tokens", "500"])
    assert code == 0
    captured = capsys.readouterr()
    rules = rules_by_name(check_rules_file(captured.out))  # printed to stdout without --out
    assert "read back as Prometheus rules" in captured.err
    drift = rules["DraftAcceptanceDrift"]
    assert ") < 0.7\nand" in drift["expr"] and ") < 0.6\nand" in rules["DraftAcceptanceBelowFloor"]["expr"]
    assert 'increase(vllm:spec_decode_num_accepted_tokens_total{job="vllm"}[30m])' in drift["expr"]
    assert ">= 500" in drift["expr"] and drift["for"] == "1h"
    assert rules["DraftSpecDecodeMetricsAbsent"]["expr"] == 'absent(vllm:spec_decode_num_drafts_total{job="vllm"})'


def test_promtool_runs_when_on_path_and_its_refusal_keeps_the_old_file(registry, tmp_path, monkeypatch, capsys):
    out = tmp_path / "rules.yml"
    ok = fake_promtool(tmp_path / "ok-bin", 0)
    monkeypatch.setenv("PATH", f"{ok}{os.pathsep}{os.environ['PATH']}")
    assert registry_cli.main(["--root", str(registry.root), "export-alerts", "demo", "--out", str(out)]) == 0
    assert "promtool check rules passed" in capsys.readouterr().out
    assert (ok / "args").read_text().split()[:2] == ["check", "rules"]
    assert (ok / "checked.yml").read_text() == out.read_text()  # promtool saw exactly what was written

    before = out.read_text()
    bad = fake_promtool(tmp_path / "bad-bin", 1)
    monkeypatch.setenv("PATH", f"{bad}{os.pathsep}{os.environ['PATH']}")
    assert registry_cli.main(["--root", str(registry.root), "export-alerts", "demo", "--out", str(out),
                              "--margin", "0.2"]) == 2
    err = capsys.readouterr().err
    assert "promtool check rules` rejected" in err and "fake says 1" in err
    assert out.read_text() == before  # not replaced by rules promtool refused


@pytest.mark.parametrize("args, message", [
    (["export-alerts", "nope"], "no alias 'production'"),
    (["export-alerts", "demo", "--window", "10 minutes"], "--window"),
    (["export-alerts", "demo", "--for", "soon"], "--for"),
    (["export-alerts", "demo", "--selector", '{job="x"}'], "without braces"),
    (["export-alerts", "demo", "--margin", "-1"], "--margin"),
])
def test_export_errors_are_one_line(registry, args, message, capsys, no_promtool):
    assert registry_cli.main(["--root", str(registry.root), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftsmith-registry: error: ") and message in err


def good_doc():
    return prometheus_rules(name="demo", version=1, measured=0.8, source="test", margin=0.05, min_acceptance=0.5)


@pytest.mark.parametrize("break_it, message", [
    (lambda d: d.update(extra=1), "one key, 'groups'"),
    (lambda d: d["groups"].append(dict(d["groups"][0])), "repeated"),
    (lambda d: d["groups"][0].update(name=""), "non-empty"),
    (lambda d: d["groups"][0].update(evaluation="1m"), "unknown key 'evaluation'"),
    (lambda d: d["groups"][0]["rules"][0].pop("expr"), "'expr'"),
    (lambda d: d["groups"][0]["rules"][0].update(record="x:y"), "exactly one of 'alert' and 'record'"),
    (lambda d: d["groups"][0]["rules"][0].update({"for": "15 minutes"}), "not a Prometheus duration"),
    (lambda d: d["groups"][0]["rules"][0]["labels"].update({"bad-name": "x"}), "label name 'bad-name'"),
    (lambda d: d["groups"][0]["rules"][0]["labels"].update(version=2), "must be a string"),
    (lambda d: d["groups"][0]["rules"][0].update(expr="sum(rate(x[5m])"), "unbalanced"),
    (lambda d: d["groups"][0]["rules"].append({"record": "a{b}", "expr": "x"}), "not a metric name"),
])
def test_the_read_back_check_rejects_what_prometheus_would(break_it, message):
    doc = good_doc()
    check_rules_file(rules_yaml(doc))  # the generated rules pass
    break_it(doc)
    with pytest.raises(AlertRulesError, match=message.replace("(", r"\(")):
        check_rules_file(rules_yaml(doc))


def test_acceptance_expression_reads_like_vllms_documented_query():
    expr = acceptance_expr("5m")
    numerator, denominator = expr.split("\n  / ")
    assert numerator == "sum by (model_name) (increase(vllm:spec_decode_num_accepted_tokens_total[5m]))"
    assert denominator == "sum by (model_name) (increase(vllm:spec_decode_num_draft_tokens_total[5m]))"


SCHEDULED_CELLS = [
    {"draft": "trained", "k": 2, "concurrency": 4, "acceptance_rate": 0.8, "per_position_acceptance": [0.9, 0.7]},
    {"draft": "trained", "k": 4, "concurrency": 4, "acceptance_rate": 0.6,
     "per_position_acceptance": [0.9, 0.7, 0.5, 0.3]}]
BANDS = [{"from": 1, "to": 1, "k": 4}, {"from": 4, "to": 4, "k": 2}, {"from": 16, "k": 0}]  # K 4, 2, off by load
FIRST = 'increase(vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}[10m])'
DRAFTS = "increase(vllm:spec_decode_num_drafts_total[10m])"


def test_a_scheduled_version_alerts_on_the_first_position_acceptance(tmp_path, capsys, no_promtool):
    """K follows the load under a batch-size K schedule, so the rules watch accepted at position 0 / drafts against
    the serving cell's per_position_acceptance[0] (0.9), as the monitor does, with the volume counted in drafts."""
    registry = make_registry(tmp_path / "registry", cells=SCHEDULED_CELLS, bands=BANDS)
    out = tmp_path / "rules.yml"
    assert registry_cli.main(["--root", str(registry.root), "export-alerts", "demo", "--out", str(out)]) == 0
    assert "(measured first-position acceptance 0.900, vLLM serving A/B first-position acceptance at K=2, " \
           "concurrency 4)" in capsys.readouterr().out
    text = out.read_text()
    assert "measured first-position acceptance 0.900" in text.splitlines()[1]
    rules = rules_by_name(check_rules_file(text))
    drift, floor = rules["DraftAcceptanceDrift"], rules["DraftAcceptanceBelowFloor"]
    for rule in (drift, floor):
        assert f"sum by (model_name) ({FIRST})\n  / sum by (model_name) ({DRAFTS})" in rule["expr"]
        assert f"{DRAFTS}) >= 100" in rule["expr"] and ACCEPTED not in rule["expr"] and DRAFTED not in rule["expr"]
        assert "first-position acceptance over 10m" in rule["annotations"]["description"]
    assert ") < 0.85\nand" in drift["expr"] and ") < 0.5\nand" in floor["expr"]  # 0.9 - 0.05

    assert registry_cli.main(["--root", str(registry.root), "export-alerts", "demo", "--selector", 'job="vllm"']) == 0
    expr = rules_by_name(check_rules_file(capsys.readouterr().out))["DraftAcceptanceDrift"]["expr"]
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{job="vllm", position="0"}[10m]' in expr
    assert 'vllm:spec_decode_num_drafts_total{job="vllm"}[10m]' in expr


README_COMMAND = "draftsmith-registry export-alerts demo --out draftsmith-alerts.yml"


def test_readme_export_alerts_command(registry, tmp_path, monkeypatch, no_promtool):
    """The README's command as written, in a directory whose registry/ holds demo (tests/test_readme.py)."""
    from test_readme import documented_text

    assert README_COMMAND in documented_text()  # README.md or a docs/ page
    monkeypatch.chdir(registry.root.parent)
    assert registry_cli.main(shlex.split(README_COMMAND)[1:]) == 0
    doc = check_rules_file((registry.root.parent / "draftsmith-alerts.yml").read_text())
    assert ") < 0.75\nand" in rules_by_name(doc)["DraftAcceptanceDrift"]["expr"]
