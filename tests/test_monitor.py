"""The monitor of a served draft: window arithmetic and alert rules on recorded /metrics texts (hand-computed),
the promoted version's reference, the real ``draftsmith-monitor`` CLI against a scripted /metrics endpoint, and
(slow) against a real vLLM server on the tiny pair."""

import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from monitor_fakes import NOT_VLLM, PLAIN, RECORDED, ScriptedMetrics, make_registry, metrics_text
from test_serving_vllm import vllm_info, vllm_python  # noqa: F401  (the same skip rule and interpreter)

from draftsmith import monitor_cli
from draftsmith.artifacts.errors import ConfigError
from draftsmith.decode.acceptance import ACCEPTANCE_FLOOR
from draftsmith.monitor import poll
from draftsmith.monitor.poll import Monitor, base_url, metric_names, missing_metrics_message
from draftsmith.monitor.reference import MissingReferenceError, reference_rules, version_reference
from draftsmith.monitor.window import (Rules, Window, WindowStats, check_rules, recommendation, snapshot, status,
                                       window_stats)
from draftsmith.monitor_cli import promoted_reference
from draftsmith.serve.metrics import SpecCounters

T0 = metrics_text({"0": (100, 300, 150, [70, 50, 30])})
T10 = metrics_text({"0": (160, 480, 246, [110, 80, 56])})


# -- window arithmetic --------------------------------------------------------------------------------
def test_window_over_counters_and_sliding():
    # RECORDED holds 200 drafts, 600 drafted, 300 accepted, per position [130, 100, 70]
    snaps = [snapshot(T0, 0.0), snapshot(T10, 10.0), snapshot(RECORDED, 20.0)]
    wide = Window(20.0)
    for s in snaps:
        stats = wide.add(s)
    # increase t0 -> t20: 100 drafts, 300 drafted, 150 accepted; per position 60, 50, 40
    assert stats.counters.drafts == 100 and stats.counters.draft_tokens == 300
    assert stats.acceptance_rate == pytest.approx(0.5)
    assert stats.per_position_acceptance == pytest.approx([0.6, 0.5, 0.4])
    assert stats.accepted_per_draft == pytest.approx(1.5) and stats.mean_accepted_tokens == pytest.approx(2.5)
    assert stats.drafts_per_s == pytest.approx(5.0) and stats.span_s == 20.0
    assert stats.engines == 1 and stats.resets == 0

    narrow = Window(10.0)  # keeps t10 (the base at the cutoff) and t20: 40 drafts, 120 drafted, 54 accepted
    for s in snaps:
        stats = narrow.add(s)
    assert [s.t for s in narrow.snapshots] == [10.0, 20.0]
    assert stats.acceptance_rate == pytest.approx(0.45)
    assert stats.per_position_acceptance == pytest.approx([0.5, 0.5, 0.35])
    assert stats.drafts_per_s == pytest.approx(4.0)


def test_a_counter_reset_inside_the_window_counts_the_new_values():
    before = metrics_text({"0": (1000, 3000, 2400, [900, 800, 700])})
    restarted = metrics_text({"0": (30, 90, 45, [20, 15, 10])})
    later = metrics_text({"0": (50, 150, 60, [28, 20, 12])})
    stats = window_stats([snapshot(before, 0), snapshot(restarted, 10), snapshot(later, 20)])
    # 30 (since the restart) + 20 drafts; 45 + 15 accepted; per position 20+8, 15+5, 10+2
    assert (stats.counters.drafts, stats.counters.draft_tokens, stats.counters.accepted_tokens) == (50, 150, 60)
    assert stats.acceptance_rate == pytest.approx(0.4)
    assert stats.per_position_acceptance == pytest.approx([0.56, 0.40, 0.24])
    assert stats.resets == 6  # three counters and three positions went down at the restart
    last_minus_first = sum(v for k, v in snapshot(later, 20).series.items()) - sum(snapshot(before, 0).series.values())
    assert last_minus_first < 0  # what a plain difference would have said


def test_two_engines_are_summed_and_a_new_engine_counts_from_zero():
    t0 = metrics_text({"0": (100, 300, 200, [80, 70, 50]), "1": (50, 150, 60, [30, 20, 10])})
    t10 = metrics_text({"0": (150, 450, 300, [120, 105, 75]), "1": (100, 300, 90, [45, 30, 15])})
    stats = window_stats([snapshot(t0, 0), snapshot(t10, 10)])
    # engine 0: +50, +150, +100, [40, 35, 25]; engine 1: +50, +150, +30, [15, 10, 5]
    assert (stats.counters.drafts, stats.counters.draft_tokens, stats.counters.accepted_tokens) == (100, 300, 130)
    assert stats.acceptance_rate == pytest.approx(130 / 300)
    assert stats.per_position_acceptance == pytest.approx([0.55, 0.45, 0.30])
    assert stats.engines == 2
    t20 = metrics_text({"0": (150, 450, 300, [120, 105, 75]), "1": (100, 300, 90, [45, 30, 15]),
                        "2": (10, 30, 30, [10, 10, 10])})
    grown = window_stats([snapshot(t10, 10), snapshot(t20, 20)])
    assert grown.engines == 3 and grown.counters.drafts == 10 and grown.acceptance_rate == 1.0


def test_missing_spec_metrics_are_explained():
    assert snapshot(PLAIN, 0).series == {} and snapshot(NOT_VLLM, 0).series == {}
    plain = missing_metrics_message("http://h:8000", metric_names(PLAIN))
    assert "without --speculative-config" in plain and "http://h:8000/metrics" in plain
    other = missing_metrics_message("http://h:9100", metric_names(NOT_VLLM))
    assert "no vllm:* metrics" in other and "speculative-config" not in other


def test_window_edges():
    window = Window(30.0)
    assert status(window.add(snapshot(T0, 0)), Rules()) == "warming up"
    assert status(window.add(snapshot(T0, 5)), Rules()) == "idle"  # nothing drafted between the two polls
    with pytest.raises(ValueError, match="older"):
        window.add(snapshot(T0, 1))
    with pytest.raises(ConfigError, match="--window"):
        Window(0)


# -- alert rules ----------------------------------------------------------------------------------------
def stats_with(accepted: float, drafted: float = 400) -> WindowStats:
    return WindowStats(span_s=60, snapshots=2, counters=SpecCounters(drafts=drafted / 4, draft_tokens=drafted,
                                                                     accepted_tokens=accepted))


@pytest.mark.parametrize("accepted, drafted, reference, expected", [
    (264, 400, 0.7, []),                     # 0.66 >= 0.70 - 0.05
    (260, 400, 0.7, []),                     # 0.65: at the threshold, not below it
    (256, 400, 0.7, ["drift"]),              # 0.64 < 0.65
    (180, 400, 0.7, ["drift", "floor"]),     # 0.45: below both
    (180, 400, None, ["floor"]),             # no reference: the floor only
    (18, 40, 0.7, []),                       # 40 drafted tokens < min_draft_tokens 100: too few to judge
])
def test_drift_and_floor_rules(accepted, drafted, reference, expected):
    rules = Rules(reference=reference, margin=0.05, min_acceptance=0.5, min_draft_tokens=100)
    alerts = check_rules(stats_with(accepted, drafted), rules)
    assert [a.rule for a in alerts] == expected
    expected_status = "alert" if expected else "low sample" if drafted < 100 else "ok"
    assert status(stats_with(accepted, drafted), rules) == expected_status
    for a in alerts:
        assert a.value == pytest.approx(accepted / drafted) and a.value < a.threshold
    if "drift" in expected:
        assert alerts[0].threshold == pytest.approx(0.65) and "0.700 - margin 0.05" in alerts[0].message


def test_rule_settings_are_checked_naming_the_flag():
    with pytest.raises(ConfigError, match="--margin"):
        Rules(margin=1.5)
    with pytest.raises(ConfigError, match="--min-acceptance"):
        Rules(min_acceptance=-0.1)


def test_recommendation_disables_below_the_floor_and_names_the_retrain_command():
    command = "draftsmith data.prompts=recent.jsonl pair.draft=/r/demo/v1/draft"
    floor = recommendation({"floor"}, command)
    assert floor[0].startswith("disable speculation") and "--speculative-config" in floor[0]
    assert f"`{command}`" in floor[1] and "champion gate" in floor[1]
    drift = recommendation({"drift"}, command)
    assert len(drift) == 1 and "disable" not in drift[0] and command in drift[0]
    assert recommendation(set(), command) == []


# -- the promoted version's reference -------------------------------------------------------------------
CELLS = [{"draft": "trained", "k": 2, "concurrency": 4, "acceptance_rate": 0.8},
         {"draft": "trained", "k": 2, "concurrency": 1, "acceptance_rate": 0.9},
         {"draft": "trained", "k": 4, "concurrency": 4, "acceptance_rate": 0.6},
         {"draft": "production", "k": 2, "concurrency": 4, "acceptance_rate": 0.55}]


def test_reference_prefers_vllms_figure_at_the_served_k_and_concurrency(tmp_path):
    registry = make_registry(tmp_path / "registry", cells=CELLS)
    ref = promoted_reference(registry, "demo")
    assert ref["acceptance_rate"] == 0.8 and ref["source"] == "vLLM serving A/B at K=2, concurrency 4"
    assert ref["version"] == 1 and ref["k"] == 2
    command = shlex.split(ref["retrain_command"])
    draft = str(registry.path("demo", 1) / "draft")
    assert command == ["draftsmith", "data.prompts=recent.jsonl", f"pair.draft={draft}", "pair.target=/models/target",
                       "pair.dtype=bfloat16", "pair.device=cuda", "promote.name=demo", f"registry.root={registry.root}"]


def test_reference_falls_back_to_the_promotion_summary(tmp_path):
    no_cell = make_registry(tmp_path / "a", cells=CELLS[1:])  # no cell at K=2, concurrency 4
    ref = promoted_reference(no_cell, "demo")
    assert ref["acceptance_rate"] == 0.75 and ref["source"] == "vLLM at K=2, concurrency 4"
    batch1 = make_registry(tmp_path / "b", serving=False, summary_rate=0.7)
    ref = promoted_reference(batch1, "demo")
    assert ref["acceptance_rate"] == 0.7 and ref["source"] == "eval (batch 1) at K=2"


def test_the_retrain_command_composes_as_a_draftsmith_config(tmp_path):
    registry = make_registry(tmp_path / "registry", cells=CELLS)
    args = shlex.split(promoted_reference(registry, "demo")["retrain_command"])[1:]
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", *args, "--cfg", "job"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert "prompts: recent.jsonl" in proc.stdout and f"draft: {registry.path('demo', 1) / 'draft'}" in proc.stdout


def test_the_room_reads_the_reference_from_what_the_spine_resolves(tmp_path):
    """monitor/reference.py takes the version directory and its version.json record (no registry object)."""
    registry = make_registry(tmp_path / "registry", cells=CELLS)
    record, path = registry.resolve("demo", "production"), registry.path("demo", "production")
    ref = version_reference(path, record, ref="production", root=registry.root)
    assert ref == promoted_reference(registry, "demo") and ref["root"] == str(registry.root)
    assert ref["acceptance_rate"] == 0.8 and ref["draft"] == str(path / "draft")
    rules = reference_rules(ref, margin=0.1)
    assert rules.reference == 0.8 and rules.drift_threshold == pytest.approx(0.7)
    assert rules.reference_label == "production v1's" and rules.min_acceptance == ACCEPTANCE_FLOOR
    assert reference_rules(None).reference is None and reference_rules(None).drift_threshold is None


def test_a_version_without_an_acceptance_rate_says_to_watch_the_floor_only(tmp_path, capsys):
    registry = make_registry(tmp_path / "registry", serving=False, summary_rate=None)
    with pytest.raises(MissingReferenceError, match="records no acceptance rate .*without --registry"):
        promoted_reference(registry, "demo")
    assert monitor_cli.main(["http://127.0.0.1:9", "--registry", "demo", "--root", str(registry.root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftsmith-monitor: error: registry ") and len(err.splitlines()) == 1


def test_the_floor_default_is_the_one_acceptance_floor():
    assert ACCEPTANCE_FLOOR == 0.5 and Rules().min_acceptance == ACCEPTANCE_FLOOR
    assert monitor_cli.parse_args(["http://h:8000"]).min_acceptance == ACCEPTANCE_FLOOR


# -- the poll loop ------------------------------------------------------------------------------------
def test_the_poll_loop_stops_on_count_and_right_after_until_is_set():
    with ScriptedMetrics([T0, T10]) as server:
        records = list(Monitor(server.url, Rules(), 60).run(0.01, count=3))
        assert [r["status"] for r in records] == ["warming up", "ok", "ok"]
        done = threading.Event()
        threading.Timer(0.3, done.set).start()
        start = time.monotonic()
        watched = list(Monitor(server.url, Rules(), 60).run(30.0, until=done))  # the set cuts the 30 s wait short
    assert time.monotonic() - start < 10 and [r["status"] for r in watched] == ["warming up", "idle"]
    assert server.gets == 5


def test_a_poll_with_alerts_carries_the_recommendation_with_the_retrain_command():
    base = metrics_text({"0": (100, 200, 160, [85, 75])})
    drifted = metrics_text({"0": (300, 600, 260, [150, 110])})  # +400 drafted, +100 accepted: 0.25
    with ScriptedMetrics([base, drifted]) as server:
        monitor = Monitor(server.url, Rules(reference=0.8, min_draft_tokens=10), 60, retrain_command="draftsmith X=1")
        first, second = monitor.poll(t=0.0), monitor.poll(t=5.0)
    assert "recommendation" not in first and [a.rule for a in monitor.alerts] == ["drift", "floor"]
    assert second["recommendation"][0].startswith("disable speculation") and "`draftsmith X=1`" in \
        second["recommendation"][1]


# -- the CLI against a scripted /metrics endpoint ------------------------------------------------------
def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_base_url_accepts_the_metrics_url():
    assert base_url("http://h:8000/metrics") == base_url("h:8000/") == "http://h:8000"


def test_cli_writes_one_record_per_poll_through_a_restart(tmp_path, capsys):
    texts = [T0, T10, None, metrics_text({"0": (20, 60, 45, [20, 15, 10])}), RECORDED]
    out = tmp_path / "mon" / "series.jsonl"
    with ScriptedMetrics(texts) as server:
        code = monitor_cli.main([server.url + "/metrics", "--interval", "0.05", "--window", "60", "--count", "5",
                                 "--jsonl", str(out), "--min-draft-tokens", "10"])
    assert code == 0
    records = read_jsonl(out)
    assert [r["status"] for r in records] == ["warming up", "ok", "no answer", "ok", "ok"]
    assert records[1]["acceptance_rate"] == pytest.approx(96 / 180) and records[1]["drafts"] == 60
    # after the restart: 60 drafts before it, then 20 after it: 80 drafts, 180 + 60 drafted, 96 + 45 accepted
    assert records[3]["drafts"] == 80 and records[3]["resets"] == 6
    assert records[3]["acceptance_rate"] == pytest.approx(141 / 240)
    # RECORDED (200 drafts) after 20: +180 more
    assert records[4]["drafts"] == 260
    assert records[4]["per_position_acceptance"][0] == pytest.approx((40 + 20 + 110) / 260)
    assert all(r["alerts"] == [] for r in records) and "503" in records[2]["error"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("draftsmith-monitor: watching http://127.0.0.1:") and "floor 0.5" in printed[0]
    assert len([line for line in printed if "acceptance 0." in line]) == 3 and "counters reset" in printed[4]
    assert "no answer" in printed[3] and "counters reset" not in printed[2]


def test_cli_flags_drift_against_the_registry_and_fails_on_alert(tmp_path, capsys):
    registry = make_registry(tmp_path / "registry", cells=CELLS)  # production v1 measured at 0.8 by vLLM
    base = metrics_text({"0": (100, 200, 160, [85, 75])})
    good = metrics_text({"0": (200, 400, 320, [170, 150])})  # +200 drafted, +160 accepted: 0.80
    drifted = metrics_text({"0": (300, 600, 420, [230, 190])})  # since base: 400 drafted, 260 accepted: 0.65 < 0.75
    out = tmp_path / "series.jsonl"
    common = ["--registry", "demo", "--root", str(registry.root), "--interval", "0.05", "--window", "60",
              "--min-draft-tokens", "10", "--jsonl", str(out), "--fail-on-alert"]
    with ScriptedMetrics([base, good, drifted, good]) as server:
        code = monitor_cli.main([server.url, "--count", "5", *common])
    assert code == monitor_cli.ALERT_EXIT
    records = read_jsonl(out)
    assert len(records) == 3 and [r["alerts"] for r in records[:2]] == [[], []]
    assert records[2]["acceptance_rate"] == pytest.approx(0.65)
    assert all(r["reference"] == 0.8 and r["drift_below"] == pytest.approx(0.75) and r["floor"] == 0.5 for r in records)
    (alert,) = records[2]["alerts"]
    assert alert["rule"] == "drift" and alert["threshold"] == pytest.approx(0.75)
    assert records[2]["recommendation"] and f"pair.draft={registry.path('demo', 1) / 'draft'}" in \
        records[2]["recommendation"][0]
    printed = capsys.readouterr().out
    assert "production demo v1 was measured at acceptance 0.800 (vLLM serving A/B at K=2, concurrency 4)" in printed
    assert "ALERT drift: window acceptance 0.650 < 0.750 = production v1's 0.800 - margin 0.05" in printed
    assert "recommendation: retrain" in printed

    out.unlink()
    with ScriptedMetrics([good, drifted]) as server:  # +200 drafted, +100 accepted (0.5), against a floor of 0.75
        code = monitor_cli.main([server.url, "--count", "3", "--interval", "0.05", "--min-acceptance", "0.75",
                                 "--min-draft-tokens", "10", "--jsonl", str(out), "--fail-on-alert"])
    assert code == monitor_cli.ALERT_EXIT and len(read_jsonl(out)) == 2
    assert [a["rule"] for a in read_jsonl(out)[-1]["alerts"]] == ["floor"]
    assert read_jsonl(out)[-1]["recommendation"][0].startswith("disable speculation")


def test_cli_without_alerts_runs_to_its_duration(tmp_path):
    out = tmp_path / "series.jsonl"
    with ScriptedMetrics([T0, T10]) as server:
        start = time.monotonic()
        code = monitor_cli.main([server.url, "--interval", "0.1", "--duration", "0.35", "--jsonl", str(out),
                                 "--fail-on-alert", "--min-acceptance", "0.1"])
    assert code == 0 and time.monotonic() - start < 5
    assert len(read_jsonl(out)) == 4  # polls at 0, 0.1, 0.2, 0.3 s


@pytest.mark.parametrize("texts, message", [
    ([PLAIN], "without --speculative-config"),
    ([NOT_VLLM], "no vllm:* metrics"),
    ([None], "answered 503"),
])
def test_cli_errors_are_one_line(texts, message, capsys):
    with ScriptedMetrics(texts) as server:
        assert monitor_cli.main([server.url, "--count", "2", "--interval", "0.05"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftsmith-monitor: error: ") and message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--interval", "0"], "--interval"), (["--window", "5", "--interval", "10"], "--window"),
    (["--count", "0"], "--count"), (["--margin", "2"], "--margin"),
    (["--registry", "nope", "--root", "{root}"], "no alias 'production'"),
])
def test_cli_bad_options_are_one_line(args, message, tmp_path, capsys):
    args = [a.replace("{root}", str(tmp_path)) for a in args]
    assert monitor_cli.main(["http://127.0.0.1:9", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftsmith-monitor: error: ") and message in err


def test_ctrl_c_stops_cleanly(tmp_path, monkeypatch, capsys):
    def interrupt(_):
        raise KeyboardInterrupt

    with ScriptedMetrics([T0, T10]) as server:
        monkeypatch.setattr(poll.time, "sleep", interrupt)  # the poll loop's wait (monitor/poll.py)
        assert monitor_cli.main([server.url, "--interval", "1", "--jsonl", str(tmp_path / "s.jsonl")]) == 0
    assert "stopped after 1 poll(s)" in capsys.readouterr().out
    assert len(read_jsonl(tmp_path / "s.jsonl")) == 1


README_COMMANDS = ["draftsmith-monitor http://localhost:8000 --registry demo --jsonl monitor.jsonl",
                   "draftsmith-monitor http://localhost:8000 --registry demo --duration 600 --fail-on-alert"]


def test_readme_monitor_commands(tmp_path, monkeypatch):
    """The README's commands as written, against a scripted server and a registry in tmp_path (tests/test_readme.py)."""
    from test_readme import documented_text

    assert all(command in documented_text() for command in README_COMMANDS)  # README.md or a docs/ page
    registry = make_registry(tmp_path / "registry", cells=CELLS)  # production measured at 0.8
    monkeypatch.chdir(tmp_path)  # the registry root is the default "registry"; monitor.jsonl lands here
    good = metrics_text({"0": (200, 400, 320, [170, 150])})
    with ScriptedMetrics([T0, good]) as server:
        args = shlex.split(README_COMMANDS[0].replace("http://localhost:8000", server.url))[1:]
        assert monitor_cli.main(args + ["--count", "2", "--interval", "0.05", "--min-draft-tokens", "10"]) == 0
    assert [r["status"] for r in read_jsonl(tmp_path / "monitor.jsonl")] == ["warming up", "ok"]
    drifted = metrics_text({"0": (300, 600, 420, [230, 190])})
    with ScriptedMetrics([good, drifted]) as server:  # 0.5 since the first poll: below 0.8 - 0.05
        args = shlex.split(README_COMMANDS[1].replace("http://localhost:8000", server.url))[1:]
        assert monitor_cli.main(args + ["--interval", "0.05", "--min-draft-tokens", "10"]) == monitor_cli.ALERT_EXIT
    assert registry.root.resolve() == (tmp_path / "registry").resolve()


# -- a version served with a batch-size K schedule ----------------------------------------------------------
# The serving A/B chose K=4 at concurrency 1, K=2 at 4 and off at 16: vLLM serves the schedule
# [[1, 2, 4], [3, 8, 2], [9, 16, 0]], so at low load a draft proposes 4 tokens and at higher load 2.
BANDS = [{"from": 1, "to": 1, "k": 4}, {"from": 4, "to": 4, "k": 2}, {"from": 16, "k": 0}]
SCHEDULED_CELLS = [
    {"draft": "trained", "k": 2, "concurrency": 4, "acceptance_rate": 0.8, "per_position_acceptance": [0.9, 0.7]},
    {"draft": "trained", "k": 4, "concurrency": 4, "acceptance_rate": 0.6,
     "per_position_acceptance": [0.9, 0.7, 0.5, 0.3]}]
# 100 drafts at K=4 accepting [90, 70, 50, 30] and 100 at K=2 accepting [90, 70]: the same draft quality as
# measured, yet accepted / drafted = 400 / 600 = 0.667, far below the 0.8 measured at K=2.
ZERO = metrics_text({"0": (0, 0, 0, [0, 0, 0, 0])})
MIXED = metrics_text({"0": (200, 600, 400, [180, 140, 50, 30])})
# the same mix with a worse draft/traffic fit: first position 140 / 200 = 0.7 < 0.9 - 0.05
WORSE = metrics_text({"0": (200, 600, 280, [140, 90, 30, 20])})


def test_per_position_acceptance_under_a_schedule_stops_at_its_smallest_k():
    mixed = SpecCounters(drafts=200, draft_tokens=600, accepted_tokens=400, accepted_per_pos={0: 180, 1: 140, 2: 50,
                                                                                             3: 30})
    assert mixed.per_position_acceptance() == pytest.approx([0.9, 0.7, 0.25, 0.15])  # static K: over all drafts
    # only the 100 K=4 drafts reached positions 2 and 3 (their true acceptance 0.5, 0.3): not known from /metrics
    assert mixed.per_position_acceptance(full_positions=2) == [pytest.approx(0.9), pytest.approx(0.7), None, None]
    assert mixed.per_position_acceptance(full_positions=1)[1:] == [None, None, None]
    assert mixed.first_position_acceptance() == pytest.approx(0.9)
    assert SpecCounters().first_position_acceptance() is None and SpecCounters().per_position_acceptance(2) == []
    static = SpecCounters(drafts=100, draft_tokens=300, accepted_tokens=150, accepted_per_pos={0: 60, 1: 50, 2: 40})
    assert static.per_position_acceptance(full_positions=3) == static.per_position_acceptance() == \
        pytest.approx([0.6, 0.5, 0.4])  # a static K: unchanged


def test_a_scheduled_version_is_watched_on_its_first_position_acceptance(tmp_path):
    registry = make_registry(tmp_path / "registry", cells=SCHEDULED_CELLS, bands=BANDS)
    assert registry.resolve("demo", 1)["k_schedule"] == [[1, 2, 4], [3, 8, 2], [9, 16, 0]]
    ref = promoted_reference(registry, "demo")
    assert ref["figure"] == "first_position_acceptance" and ref["acceptance_rate"] == 0.9
    assert ref["source"] == "vLLM serving A/B first-position acceptance at K=2, concurrency 4"
    assert (ref["k"], ref["k_max"], ref["full_positions"]) == (2, 4, 2)
    rules = reference_rules(ref, min_draft_tokens=10)
    assert rules.figure == "first_position_acceptance" and rules.drift_threshold == pytest.approx(0.85)

    window = Window(60, full_positions=ref["full_positions"])
    window.add(snapshot(ZERO, 0))
    stats = window.add(snapshot(MIXED, 10))
    assert stats.acceptance_rate == pytest.approx(400 / 600)  # below 0.8 - 0.05: the old comparison alerted
    assert check_rules(stats, Rules(reference=0.8, min_draft_tokens=10))[0].rule == "drift"
    assert check_rules(stats, rules) == [] and status(stats, rules) == "ok"  # the draft is as good as measured
    assert stats.per_position_acceptance == [pytest.approx(0.9), pytest.approx(0.7), None, None]
    worse = Window(60, full_positions=2)
    worse.add(snapshot(ZERO, 0))
    (alert,) = check_rules(worse.add(snapshot(WORSE, 10)), rules)
    assert alert.rule == "drift" and alert.value == pytest.approx(0.7)
    assert alert.message.startswith("window first-position acceptance 0.700 < 0.850 = production v1's 0.900")


def test_the_volume_of_the_first_position_figure_is_counted_in_drafts():
    rules = Rules(reference=0.9, min_draft_tokens=300, figure="first_position_acceptance")
    stats = window_stats([snapshot(ZERO, 0), snapshot(WORSE, 10)])  # 600 drafted tokens but 200 drafts
    assert status(stats, rules) == "low sample" and check_rules(stats, rules) == []
    with pytest.raises(ConfigError, match="watched figure"):
        Rules(figure="tau")


def test_a_schedule_with_one_speculating_k_keeps_the_acceptance_rate(tmp_path):
    bands = [{"from": 1, "to": 4, "k": 2}, {"from": 16, "k": 0}]  # K=2 or off: every counted draft has K=2
    registry = make_registry(tmp_path / "registry", cells=CELLS, bands=bands)
    assert registry.resolve("demo", 1)["k_schedule"] == [[1, 8, 2], [9, 16, 0]]
    ref = promoted_reference(registry, "demo")
    assert ref["figure"] == "acceptance_rate" and ref["acceptance_rate"] == 0.8
    assert (ref["k_max"], ref["full_positions"]) == (2, 2)
    one = promoted_reference(make_registry(tmp_path / "one", cells=CELLS), "demo")  # K=2 at every level: one range
    assert one["figure"] == "acceptance_rate" and one["schedule"] == [[1, 1, 2]] and one["acceptance_rate"] == 0.8
    static = promoted_reference(make_registry(tmp_path / "static", serving=False), "demo")
    assert static["figure"] == "acceptance_rate" and static["schedule"] is None and static["full_positions"] is None


def test_a_scheduled_version_without_per_position_figures_says_to_watch_the_floor_only(tmp_path):
    cells = [{k: v for k, v in c.items() if k != "per_position_acceptance"} for c in SCHEDULED_CELLS]
    registry = make_registry(tmp_path / "registry", cells=cells, bands=BANDS)
    with pytest.raises(MissingReferenceError, match="batch-size K schedule.*per_position_acceptance.*without --registry"):
        promoted_reference(registry, "demo")


def test_cli_watches_a_scheduled_version_without_a_false_drift_alert(tmp_path, capsys):
    registry = make_registry(tmp_path / "registry", cells=SCHEDULED_CELLS, bands=BANDS)
    out = tmp_path / "series.jsonl"
    common = ["--registry", "demo", "--root", str(registry.root), "--interval", "0.05", "--window", "60",
              "--min-draft-tokens", "10", "--jsonl", str(out), "--fail-on-alert", "--count", "2"]
    with ScriptedMetrics([ZERO, MIXED]) as server:
        assert monitor_cli.main([server.url, *common]) == 0  # the acceptance rate 0.667 alone would alert
    records = read_jsonl(out)
    assert [r["figure"] for r in records] == ["first_position_acceptance"] * 2
    last = records[-1]
    assert last["status"] == "ok" and last["alerts"] == [] and last["first_position_acceptance"] == pytest.approx(0.9)
    assert last["reference"] == 0.9 and last["drift_below"] == pytest.approx(0.85)
    assert last["per_position_acceptance"][2:] == [None, None]
    printed = capsys.readouterr().out
    assert ("production demo v1 (served with the batch-size K schedule batch 1-2: K=4; 3-8: K=2; >=9: off) was "
            "measured at first-position acceptance 0.900") in printed
    assert "first position 0.900" in printed and "per position [0.90 0.70 - -]" in printed
    assert "note:" not in printed  # the server's 4 positions are the schedule's largest K

    out.unlink()
    with ScriptedMetrics([ZERO, WORSE]) as server:
        assert monitor_cli.main([server.url, *common]) == monitor_cli.ALERT_EXIT
    (alert,) = read_jsonl(out)[-1]["alerts"]
    assert alert["rule"] == "drift" and alert["value"] == pytest.approx(0.7)


# -- a real vLLM server on the tiny pair (slow) --------------------------------------------------------
@pytest.mark.slow
def test_monitor_sees_a_real_vllm_server(vllm_info, tmp_path):
    from conftest import prompts, save_vllm_pair
    from draftsmith.serve.metrics import counters_delta, scrape_metrics
    from draftsmith.serve.server import ServerSpec, VllmServer
    from draftsmith.eval.load import run_load
    from draftsmith.serve.client import served_model

    save_vllm_pair(tmp_path)
    ids = [p[0].tolist() for p in prompts(6, seed=1)]
    spec = ServerSpec(model=str(tmp_path / "target"), draft=str(tmp_path / "draft"), k=2, python=vllm_python(),
                      kvcache_gib=1)
    out = tmp_path / "monitor.jsonl"
    with VllmServer(spec, log_path=tmp_path / "vllm.log", startup_timeout_s=300) as server:
        codes = []
        watcher = threading.Thread(target=lambda: codes.append(monitor_cli.main(
            [server.url + "/metrics", "--interval", "1", "--window", "120", "--duration", "20", "--jsonl", str(out),
             "--min-draft-tokens", "1"])))
        watcher.start()
        time.sleep(1.5)  # the monitor's first poll (its window's base) happens before the load
        before = scrape_metrics(server.url)
        load = run_load(server.url, served_model(server.url), ids, num_requests=6, max_tokens=16, concurrency=2)
        watcher.join(timeout=120)
        direct = counters_delta(before, scrape_metrics(server.url))  # as the serving A/B reads a load level
    assert codes == [0] and all(r.error is None for r in load.requests)
    records = read_jsonl(out)
    last = records[-1]
    print(json.dumps({k: last[k] for k in ("acceptance_rate", "per_position_acceptance", "mean_accepted_tokens",
                                            "drafts", "draft_tokens", "engines")}))
    assert records[0]["status"] == "warming up" and last["drafts"] > 0 and last["engines"] >= 1
    assert 0.0 <= last["acceptance_rate"] <= 1.0 and len(last["per_position_acceptance"]) == 2
    assert last["draft_tokens"] == 2 * last["drafts"]  # K=2 tokens per draft round
    assert (last["drafts"], last["accepted_tokens"]) == (direct.drafts, direct.accepted_tokens)  # the window = the load



def test_an_eagle_versions_retrain_command_trains_the_head_further(tmp_path):
    """A production EAGLE head is retrained as one (method=eagle, starting from it), a draft model as before."""
    from draftsmith.monitor.reference import retrain_command

    record = {"name": "demo", "source": {"config": {"pair": {"target": "/models/target"}}}}
    head, model = tmp_path / "v1" / "draft", tmp_path / "v2" / "draft"
    for path, arch in ((head, "EagleLlamaForCausalLM"), (model, "LlamaForCausalLM")):
        path.mkdir(parents=True)
        (path / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": "llama"}))
    args = shlex.split(retrain_command(record, head, tmp_path / "registry"))[1:]
    assert "method=eagle" in args and f"pair.draft={head}" in args
    assert "method=eagle" not in shlex.split(retrain_command(record, model, tmp_path / "registry"))
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", *args, "--cfg", "job"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert "finetune: eagle" in proc.stdout and f"draft: {head}" in proc.stdout
