"""scripts/drift_demo.py without vLLM: the prompt sets really come from where they say (shifted traffic from
outside the demo domain), a phase's bookkeeping against a scripted /metrics endpoint, the retrain command,
and the errors a user meets first."""

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from monitor_fakes import ScriptedMetrics, make_registry, metrics_text
from test_pipeline import pair, run_cli, tiny_args  # noqa: F401  (pair is a fixture)

from draftsmith.demo import DOMAIN_PACKAGES, in_domain, stdlib_files, train_tokenizer
from draftsmith.eval.load import LoadResult, RequestResult
from draftsmith.monitor.window import Rules
from draftsmith.monitor_cli import promoted_reference

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import drift_demo  # noqa: E402

sys.path.pop(0)


# -- prompt sets ----------------------------------------------------------------------------------------
def test_shifted_text_lies_outside_the_domain_and_the_demo_training():
    files = drift_demo.shifted_files()
    assert files and all(f.is_file() for f in files)
    trained_on = set(stdlib_files())  # what the demo target and base draft were trained on (and the domain)
    assert not set(files) & trained_on and not any(in_domain(f, DOMAIN_PACKAGES) for f in files)
    assert [f.name for f in drift_demo.shifted_files(("tkinter", "string"))][-1] == "string.py"  # a module too
    with pytest.raises(drift_demo.DriftDemoError, match=r"\['json'\] belong to the demo domain"):
        drift_demo.shifted_files(("pydoc_data", "json"))
    with pytest.raises(drift_demo.DriftDemoError, match="'no_such_package' has no source files"):
        drift_demo.shifted_files(("no_such_package",))


def ids_text(ids) -> str:
    return "," + ",".join(map(str, ids)) + ","


@pytest.fixture(scope="module")
def stdlib_tokenizer():
    """A small byte-level BPE (the demo's recipe) trained on a few standard-library files."""
    files = stdlib_files()
    return train_tokenizer([f.read_text(encoding="utf-8", errors="replace") for f in files[::40]], 320)


def test_prompt_sets_come_from_their_text(stdlib_tokenizer):
    """Every shifted prompt is a token window of a shifted file and of no domain file; every in-domain prompt one
    of a domain file; the unseen shifted prompts share no 16-token run with the recent (retrained-on) ones."""
    shifted = drift_demo.shifted_files()
    sets = drift_demo.prompt_sets(stdlib_tokenizer, prompts=6, recent=40, prompt_tokens=24, shifted=shifted, mix=8)
    assert {k: len(v) for k, v in sets.items()} == {"in_domain": 6, "shifted": 40, "shifted_unseen": 6, "mix": 8}
    assert all(len(p) == 24 for v in sets.values() for p in v)
    for yardstick, trained_on in (("shifted_unseen", "shifted"), ("in_domain", "mix")):
        runs = set().union(*map(drift_demo.ngrams, sets[trained_on]))
        assert all(not drift_demo.ngrams(p) & runs for p in sets[yardstick])

    def tokenized(files):
        texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
        return [ids_text(ids) for ids in stdlib_tokenizer(texts, add_special_tokens=False).input_ids]

    domain_files = tokenized([f for f in stdlib_files() if in_domain(f, DOMAIN_PACKAGES)])
    shifted_files = tokenized(shifted)
    for prompt in sets["shifted"] + sets["shifted_unseen"]:
        window = ids_text(prompt)
        assert any(window in f for f in shifted_files) and not any(window in f for f in domain_files)
    for prompt in sets["in_domain"] + sets["mix"]:
        assert any(ids_text(prompt) in f for f in domain_files)
    lines = drift_demo.recent_jsonl(stdlib_tokenizer, sets["shifted"]).splitlines()
    assert [json.loads(line)["prompt"] for line in lines] == [stdlib_tokenizer.decode(p) for p in sets["shifted"]]


def test_ngrams_and_disjoint():
    assert drift_demo.ngrams([1, 2, 3, 4], 3) == {(1, 2, 3), (2, 3, 4)} and drift_demo.ngrams([1, 2], 3) == set()
    taken = [list(range(20))]
    candidates = [list(range(4, 24)), list(range(100, 120)), list(range(200, 220))]  # the first overlaps by 16
    assert drift_demo.disjoint(candidates, taken, 2) == candidates[1:]
    with pytest.raises(drift_demo.DriftDemoError, match="only 2 of 3 prompts"):
        drift_demo.disjoint(candidates, taken, 3)


# -- a phase against a scripted /metrics endpoint -------------------------------------------------------------
def fake_load(tokens_per_request: list[int], wall_s: float, error_at: int | None = None) -> LoadResult:
    requests = [RequestResult(index=i, prompt_index=i, start_s=0.0, e2e_s=wall_s, ttft_s=0.01, output_tokens=n,
                              token_ids=None, text="", error="boom" if i == error_at else None)
                for i, n in enumerate(tokens_per_request)]
    return LoadResult(concurrency=2, request_rate=None, wall_s=wall_s, requests=requests)


def test_a_phase_is_watched_from_before_to_after_its_load(tmp_path):
    """The phase's monitor window and vLLM's counters cover the load exactly; a window below the reference
    minus the margin alerts drift, below the floor too, with the retrain command in the recommendation."""
    start = metrics_text({"0": (100, 300, 270, [100, 90, 80])})  # the server's life so far: acceptance 0.9
    end = metrics_text({"0": (300, 900, 534, [180, 160, 194])})  # +200 drafts, +600 drafted, +264 accepted
    rules = Rules(reference=0.8, margin=0.05, min_acceptance=0.5, min_draft_tokens=10)
    with ScriptedMetrics([start, start, end]) as server, open(tmp_path / "m.jsonl", "w") as jsonl:
        records, load, counters, wall = drift_demo.watch_phase(
            server.url, rules, "draftsmith data.prompts=recent.jsonl pair.draft=D",
            lambda: (time.sleep(0.3), fake_load([8, 8, 5], 0.3, error_at=2))[1], 0.05, jsonl, "before/shifted")
    summary = drift_demo.phase_summary("before/shifted", records, counters, load, wall)
    assert summary["vllm_counters"]["acceptance_rate"] == pytest.approx(264 / 600)
    assert summary["vllm_counters"]["per_position_acceptance"] == pytest.approx([80 / 200, 70 / 200, 114 / 200])
    assert summary["vllm_counters"]["mean_accepted_tokens"] == pytest.approx(1 + 264 / 200)
    monitor = summary["monitor"]
    assert monitor["acceptance_rate"] == pytest.approx(264 / 600) and monitor["drafts"] == 200
    assert monitor["alerts"] == ["drift", "floor"] and monitor["status"] == "alert"
    assert monitor["drift_below"] == pytest.approx(0.75) and monitor["polls"] == len(records) >= 3
    assert any("pair.draft=D" in line for line in monitor["recommendation"])
    assert (summary["requests"], summary["errors"], summary["output_tokens"]) == (3, 1, 16)
    written = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in written] == ["before/shifted"] * len(records)
    assert written[0]["status"] == "warming up"


def test_deltas_compare_the_positions_both_drafted_and_take_the_same_k_phases():
    def phase(rate, per_position, tau):
        return {"vllm_counters": {"acceptance_rate": rate, "per_position_acceptance": per_position,
                                  "mean_accepted_tokens": tau}}

    phases = {"before/in_domain": phase(0.9, [0.95, 0.85], 2.8), "before/shifted": phase(0.6, [0.65, 0.55], 2.2),
              "before/shifted_unseen": phase(0.5, [0.55, 0.45], 2.0),
              "after/shifted_unseen": phase(0.65, [0.8, 0.7, 0.6, 0.5], 3.6),  # a new version drafting K=4
              "after/in_domain": phase(0.7, [0.75, 0.7, 0.68, 0.67], 3.8)}
    out = drift_demo.deltas(phases)
    assert out["shifted_vs_in_domain"] == {"k": [2, 2], "acceptance_rate": -0.3,
                                           "per_position_acceptance": [-0.3, -0.3], "mean_accepted_tokens": -0.6}
    assert out["recovery_on_shifted_unseen"] == {"k": [2, 4], "acceptance_rate": 0.15,
                                                 "per_position_acceptance": [0.25, 0.25], "mean_accepted_tokens": 1.6}
    assert out["change_on_in_domain"]["per_position_acceptance"] == [-0.2, -0.15]
    assert drift_demo.deltas({"before/in_domain": phases["before/in_domain"]})["shifted_vs_in_domain"] is None
    same_k = {**phases, "after_k2/shifted_unseen": phase(0.75, [0.8, 0.7], 2.5)}  # the new draft at the old K
    assert drift_demo.deltas(same_k, "after_k2")["recovery_on_shifted_unseen"] == {
        "k": [2, 2], "acceptance_rate": 0.25, "per_position_acceptance": [0.25, 0.25], "mean_accepted_tokens": 0.5}
    assert drift_demo.deltas(same_k, "after_k2")["change_on_in_domain"] is None  # no after_k2/in_domain phase


# -- the retrain and the registry ---------------------------------------------------------------------------
def test_the_retrain_is_the_monitors_command_with_out_dir(tmp_path):
    registry = make_registry(tmp_path / "registry", serving=False)
    command = promoted_reference(registry, "demo")["retrain_command"]
    argv = drift_demo.retrain_argv(command, tmp_path / "out", ["eval.compare_base=false"])
    assert argv[:len(shlex.split(command))] == shlex.split(command)
    assert argv[-2:] == [f"out_dir={tmp_path / 'out'}", "eval.compare_base=false"]
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", *argv[1:], "--cfg", "job"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"out_dir: {tmp_path / 'out'}" in proc.stdout and "compare_base: false" in proc.stdout
    with pytest.raises(drift_demo.DriftDemoError, match="unexpected retrain command"):
        drift_demo.retrain_argv("rm -rf /", tmp_path, [])


def test_no_production_draft_says_to_run_draftsmith_first(tmp_path):
    with pytest.raises(drift_demo.DriftDemoError, match=r"no production draft of 'demo': run `draftsmith registry"):
        drift_demo.production(tmp_path / "registry", "demo", "production")


def test_the_demo_watches_with_the_monitors_defaults():
    from draftsmith.decode.acceptance import ACCEPTANCE_FLOOR
    from draftsmith.monitor.window import DEFAULT_MARGIN

    args = drift_demo.parse_args([])
    assert (args.margin, args.min_acceptance) == (DEFAULT_MARGIN, ACCEPTANCE_FLOOR)


def test_promotion_summary_reads_the_gate_decision():
    record = {"promote": False, "reasons": ["speedup 1.2 does not beat production v1's 1.5 by the margin 0.02"],
              "basis": "batch-1", "registry": None, "candidate": {"best_k": 4, "speedup": 1.2, "acceptance_rate": 0.6,
                                                                  "greedy_match": 1.0},
              "champion": {"best_k": 4, "speedup": 1.5, "acceptance_rate": 0.5}, "compared_with": {"version": 1}}
    summary = drift_demo.promotion_summary(record)
    assert summary["promoted"] is False and summary["reasons"] == record["reasons"]
    assert summary["candidate"]["speedup"] == 1.2 and summary["champion"]["speedup"] == 1.5
    assert drift_demo.promotion_summary({**record, "promote": True, "registry": {"version": 2}})["promoted"] is True


# -- the README's commands ----------------------------------------------------------------------------------
def readme_command(prefix: str) -> str:
    from test_readme import COVERED

    return next(c for c in COVERED if c.startswith(prefix))


def test_readme_retrain_command_is_the_monitors_and_runs(pair, tmp_path, monkeypatch):  # noqa: F811
    """The README's retrain command is what draftsmith-monitor prints for the demo's registry; on the tiny pair
    (promoted first) it retrains production on recent.jsonl and the champion gate decides against v1."""
    from draftsmith.registry import LocalRegistry

    command = readme_command("draftsmith data.prompts=recent.jsonl")
    monkeypatch.chdir(tmp_path)
    draft = tmp_path / "some-draft"
    draft.mkdir()
    (draft / "config.json").write_text('{"model_type": "llama"}')
    demo = LocalRegistry("registry")
    demo.register("demo", draft, metrics={}, promotion={"candidate": {"acceptance_rate": 0.8}}, k=4,
                  source={"config": {"pair": {"target": "demo"}, "demo": {"preset": "default"}}})
    assert promoted_reference(demo, "demo")["retrain_command"] == command

    tiny = tmp_path / "tiny"
    tiny.mkdir()
    monkeypatch.chdir(tiny)
    (tiny / "recent.jsonl").write_text((pair / "prompts.jsonl").read_text())
    keys = ("data.prompts=", "pair.draft=", "pair.target=", "promote.name=", "registry.root=", "out_dir=")
    base = [a for a in tiny_args(pair, tiny) if not a.startswith(keys)]
    run_cli(monkeypatch, base + [f"pair.target={pair / 'target'}", f"pair.draft={pair / 'base'}",
                                 "data.prompts=recent.jsonl", "stages=[eval,promote]", "promote.name=demo",
                                 "registry.root=registry", f"out_dir={tiny / 'first'}"])
    assert LocalRegistry("registry").aliases("demo") == {"production": 1}
    args = [a.replace("pair.target=demo", f"pair.target={pair / 'target'}") for a in shlex.split(command)[1:]]
    run_cli(monkeypatch, base + args + [f"out_dir={tiny / 'retrain'}"])
    promotion = json.loads((tiny / "retrain/promote/promotion.json").read_text())
    assert promotion["compared_with"]["version"] == 1
    assert promotion["compared_with"]["source"] == "measured in this eval"
    assert promotion["promote"] and LocalRegistry("registry").aliases("demo") == {"production": 2}


def test_readme_drift_demo_command_says_to_run_draftsmith_first(tmp_path):
    command = readme_command("python scripts/drift_demo.py")
    script = Path(__file__).resolve().parent.parent / "scripts" / "drift_demo.py"
    argv = [sys.executable, str(script)] + shlex.split(command)[2:]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"registry {tmp_path / 'registry'} has no production draft of 'demo': run `draftsmith" in proc.stderr
