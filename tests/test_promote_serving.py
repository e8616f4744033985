"""Promotion at the serving concurrency (issue 10, section 5): when the eval ran the serving A/B on vLLM,
the speedup gate, the K and the champion comparison come from serving.json at promote.serving_concurrency.

Hand-made eval outputs (metrics.json + serving.json + tiny draft directories, as in
test_promote_concurrent.py): promote() reads them, hashes and copies the draft, and reads the target's
config and tokenizer; no model and no vLLM are needed.
"""

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from test_promote_concurrent import EVAL_SET, config, fake_draft, fake_eval, fake_target, summary_entry

from draftsmith import registry_cli
from draftsmith.promote import k_bands
from draftsmith.promote import promote as promote_stage
from draftsmith.registry import LocalRegistry, format_bands
from draftsmith.eval.serving_stats import summarize
from draftsmith.eval.settings import ServingSettings

def promote(cfg, out_dir, reg):
    """The promote stage as the pipeline runs it: on DIR/serve/serving.json when the serve stage wrote one."""
    serving = Path(out_dir) / "serve" / "serving.json"
    return promote_stage(cfg, out_dir, reg, serving_path=serving if serving.exists() else None)


# speedup per (K, concurrency) of the candidate on vLLM: K=4 wins at 1, K=2 at 4, nothing pays at 16
TABLE = {(2, 1): 1.9, (4, 1): 2.6, (2, 4): 1.3, (4, 4): 1.2, (2, 16): 0.80, (4, 16): 0.84}


def cell(draft: str, k: int, concurrency: int, speedup: float, acceptance: float | None = 0.66,
         equal: bool = True) -> dict:
    """One serving.json cell (the Contract's keys) with plain decoding at 100 output tokens/s."""
    side = {"output_tokens_per_s": 100.0, "ttft_ms_p50": 20.0, "tpot_ms_p50": 10.0}
    return {"draft": draft, "k": k, "concurrency": concurrency, "request_rate": None,
            "spec": {**side, "output_tokens_per_s": 100.0 * speedup, "tpot_ms_p50": 10.0 / speedup}, "plain": side,
            "speedup": speedup, "speedup_ci95": [speedup - 0.005, speedup + 0.005], "repeats": 1,
            "tpot_ratio": 1.0 / speedup, "ttft_ratio": 1.0, "acceptance_rate": acceptance,
            "outputs_equal": equal, "compared": 32, "mismatches": 0 if equal else 3,
            "first_mismatch": None if equal else {"request": 5, "prompt_index": 5, "position": 12,
                                                  "spec": [7, 8], "plain": [7, 9]}}


def fake_serving(run_dir: Path, drafts: dict[str, Path], tables: dict[str, dict], unequal=(), **settings) -> dict:
    """Write run_dir/serve/serving.json (the serve stage's output): for each draft, its {(K, concurrency): speedup} table."""
    cells = [cell(name, k, c, s, equal=(name, k, c) not in unequal)
             for name, table in tables.items() for (k, c), s in sorted(table.items(), key=lambda kv: kv[0][::-1])]
    serving = {"schema_version": 1, "engine": "vllm", "vllm": {"version": "0.32.0", "device": "cpu"},
               "target": "target", "drafts": {n: str(p) for n, p in drafts.items()},
               "settings": asdict(ServingSettings(engine="vllm", concurrency=[1, 4, 16], **settings)),
               "dtype": "float32", "prompts": 32, "cells": cells, "rate_cells": [], "boundary": summarize(cells)}
    (run_dir / "serve").mkdir(parents=True, exist_ok=True)
    (run_dir / "serve" / "serving.json").write_text(json.dumps(serving))
    return serving


def at(concurrency: int | None, name: str = "demo") -> object:
    cfg = config(name)
    cfg.promote.serving_concurrency = concurrency  # read with getattr until PromoteConfig declares the field
    return cfg


@pytest.fixture
def job(tmp_path):
    """An eval of candidate draft 1 (batch 1: 2.5x at K=4) with the serving A/B of TABLE."""
    target = fake_target(tmp_path / "target")
    draft = fake_draft(tmp_path / "d1", 1)
    out = fake_eval(tmp_path / "job1", target, draft, summary_entry(2.5))
    serving = fake_serving(out, {"trained": draft}, {"trained": TABLE})
    return {"tmp": tmp_path, "target": target, "draft": draft, "out": out, "serving": serving,
            "reg": LocalRegistry(tmp_path / "reg")}


# (a) -------------------------------------------------------------------------------------------
def test_best_k_at_the_serving_concurrency_goes_to_the_registry(job, capsys):
    reg = job["reg"]
    record = promote(at(4), job["out"], reg)
    assert record["promote"] and record["basis"] == "serving" and record["registry"]["version"] == 1
    assert record["reasons"] == ["all gates passed in the serving A/B at K=2, concurrency 4"]
    candidate = record["candidate"]
    assert (candidate["best_k"], candidate["speedup"], candidate["acceptance_rate"]) == (2, 1.3, 0.66)
    assert candidate["acceptance_source"] == "vLLM at K=2, concurrency 4"
    assert candidate["batch1"] == summary_entry(2.5)  # batch 1 said K=4 at 2.5x: kept for the record
    bands = [{"from": 1, "to": 1, "k": 4}, {"from": 4, "to": 4, "k": 2}, {"from": 16, "k": 0}]
    assert record["serving"]["k_by_concurrency"] == bands and record["serving"]["concurrency_note"] is None

    path = reg.path("demo", 1)
    config = json.loads((path / "speculative_config.json").read_text())
    # the measured schedule, as vLLM takes it: contiguous from batch size 1, switching at the geometric means of the
    # measured levels (1 | 4: 2, 4 | 16: 8), off at the top; num_speculative_tokens is its largest K
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 8, 2], [9, 16, 0]]
    assert config["num_speculative_tokens"] == 4
    assert json.loads((path / "serving.json").read_text()) == job["serving"]
    version = reg.resolve("demo", 1)
    assert version["best_k"] == 2 and version["k_by_concurrency"] == bands and version["serving_concurrency"] == 4
    assert registry_cli.main(["--root", str(reg.root), "show", "demo"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["serving_bands"] == "concurrency 1: K=4; 4: K=2; >=16: off"
    assert shown["serving_table"] == str(path / "serving.json")


@pytest.mark.parametrize("requested, used, k, note", [
    (None, 1, 4, "promote.serving_concurrency is unset: decided at the lowest measured concurrency, 1 (measured: "
                 "[1, 4, 16]); set it to the concurrency you serve at"),
    (2, 4, 2, "promote.serving_concurrency=2 was not measured: decided at 4, the nearest measured concurrency above "
              "it (measured: [1, 4, 16])"),
])
def test_the_concurrency_used_is_recorded(job, requested, used, k, note):
    record = promote(at(requested), job["out"], job["reg"])
    assert record["promote"] and record["serving"]["concurrency"] == used and record["candidate"]["best_k"] == k
    assert record["serving"]["requested_concurrency"] == requested and record["serving"]["concurrency_note"] == note
    assert record["reasons"][-1] == f"note: {note}"
    assert json.loads((job["reg"].path("demo", 1) / "speculative_config.json").read_text())[
        "num_speculative_tokens"] == 4  # the schedule's largest K, whatever K the decision was taken at


def test_promote_k_schedule_false_keeps_the_static_k(job):
    cfg = at(4)
    cfg.promote.k_schedule = False
    assert promote(cfg, job["out"], job["reg"])["promote"]
    config = json.loads((job["reg"].path("demo", 1) / "speculative_config.json").read_text())
    assert config["num_speculative_tokens"] == 2 and "num_speculative_tokens_per_batch_size" not in config


def test_the_measured_schedules_shortfall_is_recorded_with_what_to_do(job):
    """The scheduled column fell short at 16 (a K 0 band: vLLM still runs the draft there): the promotion record and
    the version say where, and the decision notes it; at 1 and 4 it tracked, so those levels are not listed."""
    from draftsmith.eval.serving import track_schedule

    serving = json.loads((job["out"] / "serve" / "serving.json").read_text())
    scheduled = {"draft": "trained", "bands": [], "schedule": [[1, 2, 4], [3, 8, 2], [9, 16, 0]],
                 "cells": [{**cell("trained", None, c, s), "column": "scheduled"}
                           for c, s in ((1, 2.6), (4, 1.3))]
                 + [{**cell("trained", None, 16, 0.7), "speedup_ci95": [0.6, 0.8], "column": "scheduled"}]}
    scheduled.update(track_schedule(serving["cells"], scheduled))
    (job["out"] / "serve" / "serving.json").write_text(json.dumps({**serving, "scheduled": scheduled}))
    record = promote(at(4), job["out"], job["reg"])
    measured = record["serving"]["schedule_measured"]
    assert record["promote"] and measured["tracks"] is False and measured["not_tracked_at"] == [16]
    assert "0.70x [0.60, 0.80] at concurrency 16 against off (1.00x)" in measured["shortfall"]
    assert record["reasons"][-1] == f"note: {measured['shortfall']}" and "not speculation off" in measured["shortfall"]
    assert job["reg"].resolve("demo", 1)["summary"]["serving"]["schedule_measured"] == measured


def test_no_measured_schedule_adds_no_note(job):
    record = promote(at(4), job["out"], job["reg"])
    assert record["serving"]["schedule_measured"] is None
    assert not any("schedule" in r for r in record["reasons"])


def test_bands_merge_equal_neighbours():
    best = [{"concurrency": 1, "k": 4}, {"concurrency": 2, "k": 4}, {"concurrency": 4, "k": 4},
            {"concurrency": 8, "k": 2}, {"concurrency": 16, "k": 0}, {"concurrency": 32, "k": 0}]
    bands = k_bands(best)
    assert bands == [{"from": 1, "to": 4, "k": 4}, {"from": 8, "to": 8, "k": 2}, {"from": 16, "k": 0}]
    assert format_bands(bands) == "concurrency 1-4: K=4; 8: K=2; >=16: off"


# (b) -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("requested, note", [(16, None), (8, "was not measured: decided at 16"),
                                             (64, "is above every measured concurrency: decided at the highest, 16")])
def test_every_k_slower_at_the_serving_concurrency_is_not_promoted(job, requested, note):
    record = promote(at(requested), job["out"], job["reg"])
    assert record["promote"] is False and record["registry"] is None and record["candidate"]["best_k"] == 0
    assert record["reasons"][0] == ("at concurrency 16 speculation is slower than plain decoding for every K "
                                    "(best speedup 0.84 at K=4): serve without speculation")
    assert len(record["reasons"]) == (1 if note is None else 2)
    assert note is None or note in record["reasons"][1]
    assert job["reg"].versions("demo") == []


# (c) -------------------------------------------------------------------------------------------
def test_unequal_greedy_outputs_in_any_cell_are_refused_naming_the_cell(job):
    fake_serving(job["out"], {"trained": job["draft"]}, {"trained": TABLE}, unequal=[("trained", 2, 16)])
    record = promote(at(4), job["out"], job["reg"])  # K=2 at 4 passes every other gate
    assert record["promote"] is False and record["registry"] is None
    assert record["reasons"] == [
        "vLLM's greedy outputs differ with speculation on vs off in draft 'trained' K=2 concurrency 16 (3 of 32 "
        "requests; first at prompt 5, token 12): this points to a broken pair or engine (serving.json first_mismatch)"]
    assert job["reg"].versions("demo") == []


# (d) -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("serving", ["none", "other draft"])
def test_without_serving_cells_of_the_candidate_promotion_is_unchanged(job, serving):
    if serving == "none":
        (job["out"] / "serve" / "serving.json").unlink()
    else:
        fake_serving(job["out"], {"base": job["draft"]}, {"base": TABLE})
    record = promote(at(16), job["out"], job["reg"])
    assert record["promote"] and record["basis"] == "batch-1" and record["serving"] is None
    assert record["reasons"] == ["all gates passed"] and record["candidate"] == summary_entry(2.5)
    path = job["reg"].path("demo", 1)
    assert json.loads((path / "speculative_config.json").read_text())["num_speculative_tokens"] == 4
    assert not (path / "serving.json").exists() and "k_by_concurrency" not in job["reg"].resolve("demo", 1)


def test_a_batch_1_eval_that_left_its_verdict_to_the_serving_ab_says_so_when_decided_on(job):
    """An eval run beside a serving A/B adds no passes (its contract's decided_here False); a promotion that finds no
    serving cells of the candidate and decides on that eval anyway says so, and how to settle it."""
    (job["out"] / "serve" / "serving.json").unlink()
    path = job["out"] / "eval" / "metrics.json"
    doc = json.loads(path.read_text())
    doc["repeats"] = {"initial": 2, "max": 6, "time_budget_s": 0.0, "rounds": 0, "seconds": 1.0,
                      "stopped": "no passes added: the promotion decides on the serving A/B", "undecided": []}
    path.write_text(json.dumps(doc))
    record = promote(at(16), job["out"], job["reg"])
    assert record["basis"] == "batch-1"
    notes = [r for r in record["reasons"] if r.startswith("note: decided on the batch-1 eval, which added no passes")]
    assert len(notes) == 1 and "stages=[eval,promote] without serve" in notes[0]


# (e) -------------------------------------------------------------------------------------------
def candidate_with_production(job, i: int, batch1: float, at4: float, production_at4: float | None,
                              **settings) -> Path:
    """Eval `i` of a new draft beside production v1 (batch 1: 2.5x); its serving A/B measures production at
    concurrency 4 when `production_at4` is given."""
    v1 = job["reg"].path("demo", 1) / "draft"
    draft = fake_draft(job["tmp"] / f"d{i}", i)
    measured = production_at4 is not None
    out = fake_eval(job["tmp"] / f"job{i}", job["target"], draft, summary_entry(batch1),
                    production=(v1, summary_entry(2.5)) if measured else None)
    tables = {"trained": {**TABLE, (2, 4): at4}}
    drafts = {"trained": draft}
    if measured:
        tables["production"], drafts["production"] = {**TABLE, (2, 4): production_at4}, v1
    fake_serving(out, drafts, tables, **settings)
    return out


@pytest.mark.parametrize("at4, promoted", [(1.5, True), (1.31, False)])
def test_champion_measured_in_the_serving_ab_is_compared_at_the_same_concurrency(job, at4, promoted):
    assert promote(at(4), job["out"], job["reg"])["promote"]
    # batch 1 says the candidate is slower (2.0x vs 2.5x): only the serving figures at concurrency 4 count
    record = promote(at(4), candidate_with_production(job, 2, 2.0, at4, production_at4=1.3), job["reg"])
    assert record["compared_with"] == {"version": 1, "speedup": 1.3, "best_k": 2, "concurrency": 4,
                                       "source": "measured in this serving A/B at concurrency 4", "eval_set": EVAL_SET}
    assert record["promote"] is promoted and record["decision_retaken"] is False
    if promoted:
        assert record["reasons"] == ["all gates passed in the serving A/B at K=2, concurrency 4; beats production v1 "
                                     "(1.300)"]
        assert job["reg"].aliases("demo") == {"production": 2}
    else:
        assert record["reasons"] == ["speedup 1.310 [1.305, 1.315] does not beat production v1's 1.300 [1.295, 1.305] by the margin 0.02"]
        assert job["reg"].aliases("demo") == {"production": 1}


def test_champion_recorded_with_its_version_is_used_on_the_same_eval_set_and_settings(job):
    assert promote(at(4), job["out"], job["reg"])["promote"]
    record = promote(at(4), candidate_with_production(job, 2, 2.0, 1.31, production_at4=None), job["reg"])
    assert record["promote"] is False and record["decision_retaken"] is True
    assert record["compared_with"]["source"] == "recorded with v1 at concurrency 4 on the same eval set and serving " \
                                                "settings"
    assert record["reasons"][0] == "speedup 1.310 [1.305, 1.315] does not beat production v1's 1.300 [1.295, 1.305] by the margin 0.02"

    record = promote(at(4), candidate_with_production(job, 3, 2.0, 1.5, production_at4=None, max_tokens=32),
                     job["reg"])
    assert record["promote"] is False and record["compared_with"] is None
    assert record["reasons"] == [
        "the production draft v1 was not measured in this serving A/B, so the candidate's serving speedup at "
        "concurrency 4 cannot be compared with it (v1's serving A/B ran with other settings "
        "(serve.max_tokens)): run eval and serve again with eval.compare_production=true, serve.engine=vllm and "
        "serve.drafts naming production (or [candidate], which serves it beside the candidate), which measures the "
        "current production draft beside the candidate"]


def test_production_promoted_on_batch_1_is_not_compared_with_a_serving_speedup(job):
    (job["out"] / "serve" / "serving.json").unlink()
    assert promote(at(4), job["out"], job["reg"])["promote"]  # v1 on batch 1 (2.5x)
    record = promote(at(4), candidate_with_production(job, 2, 2.0, 1.5, production_at4=None), job["reg"])
    assert record["promote"] is False and "(v1 has no recorded serving A/B)" in record["reasons"][-1]


def test_batch_1_candidate_is_compared_with_the_batch_1_figures_of_a_serving_promotion(job):
    assert promote(at(4), job["out"], job["reg"])["promote"]  # v1: 1.3x at concurrency 4, 2.5x at batch 1
    out = fake_eval(job["tmp"] / "job2", job["target"], fake_draft(job["tmp"] / "d2", 2), summary_entry(2.51))
    record = promote(at(4), out, job["reg"])
    assert record["basis"] == "batch-1" and record["compared_with"]["speedup"] == 2.5
    assert record["promote"] is False and record["reasons"][0] == ("speedup 2.510 [2.505, 2.515] does not beat "
                                                                   "production v1's 2.500 [2.495, 2.505] by the margin 0.02")


# the gates on a serving summary (eval/gates.py) ----------------------------------------------------
def test_off_fails_even_when_min_speedup_allows_one_and_skips_the_champion():
    from draftsmith.eval.gates import Gates, decide

    serving = {"concurrency": 8, "best_speedup": 1.0, "best_speedup_k": 2, "outputs_unequal": []}
    off = {"best_k": 0, "speedup": 1.0, "acceptance_rate": 0.7, "greedy_match": 1.0, "serving": serving}
    d = decide(off, Gates(min_speedup=0.9), champion={"speedup": 0.5})
    assert not d["promote"] and d["reasons"] == [
        "at concurrency 8 speculation is no faster than plain decoding for every K (best speedup 1.00 at K=2): serve "
        "without speculation"]
    assert decide(off | {"best_k": 2, "speedup_ci95": [0.95, 1.05], "serving": serving | {"outputs_unequal": ["cell x"]}},
                  Gates(min_speedup=0.9, require_greedy_match=False))["promote"]


def test_a_serving_json_from_before_intervals_is_still_comparable():
    """A recorded champion's serving.json written before serve.repeats / interleave / max_repeats / slo_* existed
    ran the same measurement: only settings that change what a cell measures count."""
    from draftsmith.artifacts.formats import ServingTable
    from draftsmith.promote import _setting_differences as differ

    def _setting_differences(a, b):
        return differ(ServingTable(Path("a/serving.json"), {"cells": [], **a}),
                      ServingTable(Path("b/serving.json"), {"cells": [], **b}))

    now = {"vllm": {"version": "0.32.0"}, "dtype": "float32", "prompts": 32,
           "settings": asdict(ServingSettings(engine="vllm", slo_tpot_ms=50.0))}
    old_settings = {k: v for k, v in now["settings"].items()
                    if k not in ("repeats", "max_repeats", "interleave", "slo_tpot_ms", "slo_ttft_ms")}
    assert _setting_differences({**now, "settings": old_settings}, now) == []
    other = {**now, "settings": {**now["settings"], "max_tokens": 128}}
    assert _setting_differences(other, now) == ["serve.max_tokens"]


def test_prompt_lookup_served_beside_the_draft_decides_whether_training_paid(job):
    """serve.baselines: n-gram lookup's cells in serving.json (its value a spec string, not a folder). Where lookup
    is faster at the serving concurrency the draft is refused, saying what to serve; where the draft is faster it
    is promoted; promotion.json names the method either way."""
    drafts = {"trained": job["draft"], "ngram": "ngram:2-4"}
    lookup = {(2, 1): 1.5, (4, 1): 1.6, (2, 4): 1.6, (4, 4): 1.5, (2, 16): 0.9, (4, 16): 0.85}
    fake_serving(job["out"], drafts, {"trained": TABLE, "ngram": lookup})
    record = promote(at(4), job["out"], job["reg"])  # the draft: 1.3x at K=2; lookup 1.6x at K=2
    assert record["decision"] == "refused" and record["training_free"]["name"] == "ngram"
    assert record["reasons"][0].startswith("serve ngram with K=2: 1.60x")
    assert "adds nothing measurable over speculation that needs no training" in record["reasons"][0]
    assert job["reg"].find("demo", "production") is None
    record = promote(at(16), job["out"], job["reg"])  # the draft pays for no K there: refused before any rival
    assert not record["promote"] and not any(c["gate"] == "training_free" for c in record["checks"])
    record = promote(at(1), job["out"], job["reg"])  # the draft: 2.6x at K=4; lookup at most 1.6x
    assert record["promote"] and record["training_free"]["best_k"] == 4
    gate = next(c for c in record["checks"] if c["gate"] == "training_free")
    assert gate["result"] == "pass" and "beats ngram (K=4" in gate["reason"]


# -- no draft needed: a training-free method recorded as a version (issue 41) -----------------------------
LOOKUP = {(2, 1): 1.5, (4, 1): 1.6, (2, 4): 1.6, (4, 4): 1.5, (2, 16): 0.9, (4, 16): 0.85}


def with_lookup_in_the_eval(out: Path, lookup: dict, production: tuple[str, dict] | None = None) -> None:
    """Add n-gram lookup (eval.baselines) to out's batch-1 eval, and a production entry measured beside it."""
    path = out / "eval" / "metrics.json"
    metrics = json.loads(path.read_text())
    metrics["config"]["baselines"] = ["ngram"]
    metrics["summary"]["ngram"] = lookup
    if production is not None:
        metrics["config"]["drafts"]["production"], metrics["summary"]["production"] = production
    path.write_text(json.dumps(metrics))


def test_no_draft_needed_is_a_version_the_registry_monitor_and_a_later_run_read(job, capsys):
    """The draft loses to prompt lookup at the serving concurrency and lookup clears the gates itself: the registry
    records lookup as the production version (no draft folder; vLLM's ngram config with the K schedule measured for
    lookup), promotion.json keeps the draft's refusal and says what was recorded; re-run, it is not a second
    version; the monitor watches vLLM's acceptance of lookup; a later run that measures that version as production
    (its spec string) promotes a draft that beats it."""
    from draftsmith.monitor.reference import version_reference

    reg = job["reg"]
    with_lookup_in_the_eval(job["out"], summary_entry(1.8))
    serving = fake_serving(job["out"], {"trained": job["draft"], "ngram": "ngram:2-4"},
                           {"trained": TABLE, "ngram": LOOKUP})
    for c in serving["cells"]:  # vLLM's counters per position (lookup's first position: accepted / rounds it drafted)
        c["per_position_acceptance"] = [0.7, 0.5] if c["draft"] == "ngram" else [0.9, 0.8]
    (job["out"] / "serve" / "serving.json").write_text(json.dumps(serving))
    record = promote(at(4), job["out"], reg)  # the draft: 1.3x at K=2; lookup 1.6x at K=2
    assert record["decision"] == "refused" and not record["promote"]
    free = record["no_draft_needed"]
    assert free["decision"] == "promoted" and free["spec"] == "ngram:2-4" and free["registry"]["version"] == 1
    assert record["registry"] == free["registry"]
    assert record["reasons"][-1].startswith("no draft needed: ngram:2-4 with K=2 is demo v1 (production)")

    version = reg.find("demo", "production")
    path = reg.path("demo", 1)
    assert version["training_free"] == "ngram:2-4" and version["best_k"] == 2 and not (path / "draft").exists()
    config = json.loads((path / "speculative_config.json").read_text())
    assert config["method"] == "ngram" and "model" not in config
    assert (config["prompt_lookup_min"], config["prompt_lookup_max"]) == (2, 4)
    # lookup's own bands: K=4 at 1, K=2 at 4, off at 16 (0.9x / 0.85x)
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 8, 2], [9, 16, 0]]
    assert json.loads((path / "promotion.json").read_text())["refused_draft"]["name"] == "trained"
    assert registry_cli.main(["list", "demo", "--root", str(reg.root)]) == 0
    assert "ngram:2-4 (no draft)" in capsys.readouterr().out

    again = promote(at(4), job["out"], reg)
    assert again["no_draft_needed"]["reasons"] == ["already production: v1 of 'demo' is ngram:2-4; no new version"]
    assert [v["version"] for v in reg.versions("demo")] == [1]

    reference = version_reference(path, version, ref="production", root=reg.root)
    # a schedule of two K's is watched on the first position: lookup's own cell, not the draft's
    assert reference["draft"] == "ngram:2-4" and reference["figure"] == "first_position_acceptance"
    assert reference["acceptance_rate"] == 0.7
    assert reference["full_positions"] == 1  # a lookup draft may be shorter than K: only its first position is known
    # nothing to train further: a draft trained as the run that recorded lookup did (its pair.draft and method)
    assert reference["retrain_command"].startswith("draftsmith data.prompts=recent.jsonl pair.draft=demo method=kd ")
    assert "ngram" not in reference["retrain_command"]

    # a later run: a new draft measured beside the production version (lookup, by its spec string)
    later = fake_eval(job["tmp"] / "job2", job["target"], fake_draft(job["tmp"] / "d2", 2), summary_entry(2.5),
                      production=(Path("ngram:2-4"), summary_entry(1.8)))
    faster = {key: s + 0.5 for key, s in LOOKUP.items()}  # 2.1x at K=2, concurrency 4
    fake_serving(later, {"trained": job["tmp"] / "d2", "production": "ngram:2-4"},
                 {"trained": faster, "production": LOOKUP})
    record = promote(at(4), later, reg)
    assert record["promote"] and record["compared_with"]["source"].startswith("measured in this serving A/B")
    assert record["compared_with"]["version"] == 1 and not record["decision_retaken"]
    assert reg.find("demo", "production")["version"] == 2 and reg.find("demo", "production")["training_free"] is None


@pytest.mark.parametrize("lookup, recorded, decision", [
    (3.0, True, "promoted"),  # lookup 3.0x vs the draft's 2.5x at batch 1, and it clears min_speedup: recorded
    (1.05, False, "refused"),  # lookup beats the draft's 1.0x but not min_speedup 1.1: nothing recorded
])
def test_no_draft_needed_at_batch_1(tmp_path, lookup, recorded, decision):
    """Without a serving A/B the batch-1 eval decides: lookup's static K goes into speculative_config.json."""
    target = fake_target(tmp_path / "target")
    out = fake_eval(tmp_path / "job", target, fake_draft(tmp_path / "d1", 1), summary_entry(2.5 if recorded else 1.0))
    with_lookup_in_the_eval(out, summary_entry(lookup))
    reg = LocalRegistry(tmp_path / "reg")
    record = promote(at(None), out, reg)
    assert record["decision"] == "refused"
    assert record["no_draft_needed"]["decision"] == decision and (record["registry"] is not None) == recorded
    if recorded:
        config = json.loads((reg.path("demo", 1) / "speculative_config.json").read_text())
        assert config == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                          "prompt_lookup_max": 4}


def test_promote_record_free_false_records_the_refusal_only(job):
    with_lookup_in_the_eval(job["out"], summary_entry(1.8))
    fake_serving(job["out"], {"trained": job["draft"], "ngram": "ngram:2-4"}, {"trained": TABLE, "ngram": LOOKUP})
    cfg = at(4)
    cfg.promote.record_free = False
    record = promote(cfg, job["out"], job["reg"])
    assert record["decision"] == "refused" and "no_draft_needed" not in record and record["registry"] is None
    assert job["reg"].find("demo", "production") is None


def test_a_lookup_that_does_not_beat_production_is_not_recorded(job):
    """The champion gate judges the training-free method too: a production draft faster than lookup stays."""
    reg = job["reg"]
    prod = fake_draft(job["tmp"] / "prod", 7)
    reg.register("demo", prod, metrics={}, promotion={"candidate": summary_entry(2.0)}, k=2,
                 target=None)
    out = fake_eval(job["tmp"] / "job3", job["target"], job["draft"], summary_entry(2.5),
                    production=(prod, summary_entry(2.0)))
    with_lookup_in_the_eval(out, summary_entry(1.8))
    best = {key: s + 0.6 for key, s in LOOKUP.items()}  # production: 2.2x at K=2, concurrency 4
    fake_serving(out, {"trained": job["draft"], "production": prod, "ngram": "ngram:2-4"},
                 {"trained": TABLE, "production": best, "ngram": LOOKUP})
    record = promote(at(4), out, reg)
    assert record["decision"] == "refused"
    assert record["no_draft_needed"]["decision"] == "refused" and record["no_draft_needed"]["registry"] is None
    assert any(c["gate"] == "champion" and c["result"] == "fail" for c in record["no_draft_needed"]["checks"])
    assert reg.find("demo", "production")["version"] == 1


def test_no_draft_needed_finds_the_methods_batch_1_record_by_its_spec(job):
    """serve.baselines with two windows names its methods by spec string; eval.baselines with one names it "ngram":
    the version is still recorded, its batch-1 figures found by the spec."""
    with_lookup_in_the_eval(job["out"], summary_entry(1.8))
    fake_serving(job["out"], {"trained": job["draft"], "ngram:2-4": "ngram:2-4", "ngram:1-3": "ngram:1-3"},
                 {"trained": TABLE, "ngram:2-4": LOOKUP, "ngram:1-3": {key: s - 0.3 for key, s in LOOKUP.items()}})
    record = promote(at(4), job["out"], job["reg"])
    free = record["no_draft_needed"]
    assert (free["spec"], free["decision"]) == ("ngram:2-4", "promoted")
    assert free["candidate"]["batch1"] == summary_entry(1.8)
    assert job["reg"].find("demo", "production")["training_free"] == "ngram:2-4"


def test_suffix_decoding_ahead_refuses_the_draft_and_prompt_lookup_is_what_gets_recorded(job):
    """serve.baselines=[ngram, suffix]: suffix decoding, the fastest, refuses the draft through the training_free
    gate; "no draft needed" then judges prompt lookup (the registry records it), never suffix — not even where the
    batch-1 eval measured suffix too; with suffix alone nothing is recorded."""
    with_lookup_in_the_eval(job["out"], summary_entry(1.8))
    path = job["out"] / "eval" / "metrics.json"
    metrics = json.loads(path.read_text())
    metrics["config"]["baselines"] = ["ngram", "suffix"]
    metrics["summary"]["suffix"] = summary_entry(2.0)
    path.write_text(json.dumps(metrics))
    suffix = {key: s + 0.3 for key, s in LOOKUP.items()}
    fake_serving(job["out"], {"trained": job["draft"], "ngram": "ngram:2-4", "suffix": "suffix"},
                 {"trained": TABLE, "ngram": LOOKUP, "suffix": suffix})
    record = promote(at(4), job["out"], job["reg"])
    assert record["decision"] == "refused" and record["training_free"]["name"] == "suffix"
    assert record["reasons"][0].startswith("serve suffix with K=2")
    free = record["no_draft_needed"]
    assert (free["spec"], free["decision"]) == ("ngram:2-4", "promoted")
    assert job["reg"].find("demo", "production")["training_free"] == "ngram:2-4"


def test_suffix_decoding_alone_refuses_the_draft_and_records_nothing(job):
    fake_serving(job["out"], {"trained": job["draft"], "suffix": "suffix"},
                 {"trained": TABLE, "suffix": {key: s + 0.3 for key, s in LOOKUP.items()}})
    record = promote(at(4), job["out"], job["reg"])
    assert record["decision"] == "refused" and record["training_free"]["name"] == "suffix"
    assert "no_draft_needed" not in record and job["reg"].find("demo", "production") is None
