"""The serving A/B inside the pipeline: serve.engine=vllm|auto|none, wired through start-up checks, its own
stage (DIR/serve/serving.json, its own config hash) and the end-of-run table. vLLM is played by the fake interpreter of
tests/serving_fakes.py (a real OpenAI-compatible streaming server with vLLM's counters); the real engine runs in
tests/test_serving_vllm.py."""

import json

import pytest
from serving_fakes import write_fake_python
from test_pipeline import _expect_user_error, pair, run_cli, tiny_args  # noqa: F401  (pair is a fixture)


def serving_args(pair, tmp_path, *extra):  # noqa: F811
    return tiny_args(pair, tmp_path, "stages=[eval,serve]", "eval.k=[2]", "serve.concurrency=[1,2]",
                     "serve.max_tokens=4", "serve.max_prompts=3", "serve.warmup=0",
                     "serve.startup_timeout_s=60", *extra)


def eval_contracts(monkeypatch) -> list:
    """The decision contract of every batch-1 eval the pipeline runs (eval/runner.py run, wrapped)."""
    from draftsmith.eval import runner

    seen, run = [], runner.run
    monkeypatch.setattr(runner, "run", lambda cfg: seen.append(cfg.decide) or run(cfg))
    return seen


def test_the_serve_stage_runs_the_serving_ab_and_the_table_shows_it(pair, tmp_path, monkeypatch, capsys):  # noqa: F811
    fake = write_fake_python(tmp_path)
    contracts = eval_contracts(monkeypatch)
    run_cli(monkeypatch, serving_args(pair, tmp_path, "serve.engine=vllm", f"serve.python={fake}"))
    # the promotion decides on the serving A/B: the batch-1 eval adds no passes to settle its own verdicts
    assert [c.decided_here for c in contracts] == [False]
    repeats = json.loads((tmp_path / "run/eval/metrics.json").read_text())["repeats"]
    assert repeats["rounds"] == 0 and repeats["stopped"] in (
        "decided", "no passes added: the promotion decides on the serving A/B")
    serving = json.loads((tmp_path / "run/serve/serving.json").read_text())
    assert {(c["draft"], c["k"], c["concurrency"]) for c in serving["cells"]} == {
        ("base", 2, 1), ("base", 2, 2), ("ngram", 2, 1), ("ngram", 2, 2)}  # serve.baselines' default: ngram
    assert all(c["outputs_equal"] for c in serving["cells"]) and "base" in serving["boundary"]
    assert (tmp_path / "run/eval/metrics.json").exists()  # the batch-1 eval has its own output
    assert not (tmp_path / "run/eval/serving.json").exists() and "Serving A/B" not in (
        tmp_path / "run/eval/report.md").read_text()
    report = (tmp_path / "run/serve/report.md").read_text()
    assert "## Serving A/B on vLLM" in report and "| base | 2 | 2 |" in report and "serving_speedup.png" in report
    assert (tmp_path / "run/serve/serving_speedup.png").exists() and (tmp_path / "run/serve/serving_logs").is_dir()
    printed = capsys.readouterr().out
    assert "serving base K=2:" in printed and "at concurrency 1" in printed and "serving A/B on vLLM:" in printed
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["serving"]["path"].endswith("serve/serving.json") and summary["stages"]["serve"] == "ran"


@pytest.mark.parametrize("stages, engine, url, served, decides", [
    (["eval", "serve", "promote"], "vllm", None, ["candidate"], True),
    (["eval", "promote"], "vllm", None, ["candidate"], False),  # no serving A/B in this run
    (["eval", "serve", "promote"], "none", None, ["candidate"], False),
    (["eval", "serve", "promote"], "vllm", None, ["base"], False),  # the candidate (trained) not served
    (["eval", "serve", "promote"], "vllm", "http://h:1", ["trained"], True),  # the user's server, one draft
    (["eval", "serve", "promote"], "vllm", "http://h:1", [], False),  # two drafts there: cells named "served"
])
def test_the_promotion_decides_on_the_serving_ab_only_where_it_has_the_candidates_cells(tmp_path, stages, engine,
                                                                                        url, served, decides):
    from draftsmith.config import DraftsmithConfig
    from draftsmith.pipeline import Pipeline

    cfg = DraftsmithConfig()
    cfg.stages, cfg.serve.engine, cfg.serve.url, cfg.serve.drafts = stages, engine, url, served
    assert Pipeline(cfg, tmp_path).serving_decides({"trained": "t", "base": "b"}) is decides


def test_changing_where_or_how_much_vllm_serves_reruns_serve_never_the_batch_1_eval(pair, tmp_path, monkeypatch,  # noqa: F811
                                                                                  capsys):
    fake = write_fake_python(tmp_path)
    args = serving_args(pair, tmp_path, "serve.engine=vllm", f"serve.python={fake}")
    run_cli(monkeypatch, args)
    eval_stage = (tmp_path / "run/eval/stage.json").read_text()
    serve_stage = json.loads((tmp_path / "run/serve/stage.json").read_text())
    capsys.readouterr()
    run_cli(monkeypatch, [*args, "serve.concurrency=[1]"])  # another load: serve again, not eval
    printed = capsys.readouterr().out
    assert "eval: up to date" in printed and "serve: running" in printed
    assert (tmp_path / "run/eval/stage.json").read_text() == eval_stage
    again = json.loads((tmp_path / "run/serve/stage.json").read_text())
    assert again["hash"] != serve_stage["hash"]
    assert {c["concurrency"] for c in json.loads((tmp_path / "run/serve/serving.json").read_text())["cells"]} == {1}
    run_cli(monkeypatch, [*args, "serve.concurrency=[1]", "serve.startup_timeout_s=99"])  # only how long to wait
    assert "serve: up to date" in capsys.readouterr().out


def test_a_renamed_key_fails_in_one_line_naming_its_new_name(monkeypatch, capsys):
    from draftsmith import cli

    monkeypatch.setattr("sys.argv", ["draftsmith", "eval.serving.concurrency=[1,8]"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in err
    assert err == ("draftsmith: error: eval.serving.concurrency is now serve.concurrency: write "
                   "serve.concurrency=[1,8] (the eval.serving.* keys were renamed serve.*)")


def test_the_candidate_is_served_with_the_production_draft_beside_it():
    """serve.drafts=[candidate]: the champion gate compares the candidate with production on the serving A/B, so
    production is served beside it when the eval measured one (the drift recipe's retrain was refused for want
    of it)."""
    from types import SimpleNamespace

    from draftsmith.pipeline import served_drafts

    drafts = {"trained": "t", "base": "b", "production": "p"}
    assert served_drafts(SimpleNamespace(drafts=["candidate"]), drafts) == {"trained": "t", "production": "p"}
    assert served_drafts(SimpleNamespace(drafts=["candidate"]), {"trained": "t", "base": "b"}) == {"trained": "t"}
    assert served_drafts(SimpleNamespace(drafts=["candidate"]), {"base": "b"}) == {"base": "b"}
    assert served_drafts(SimpleNamespace(drafts=["trained"]), drafts) == {"trained": "t"}  # as named
    assert served_drafts(SimpleNamespace(drafts=[]), drafts) == drafts


def test_serving_drafts_and_k_choose_the_servers(pair, tmp_path, monkeypatch, capsys):  # noqa: F811
    fake = write_fake_python(tmp_path)
    run_cli(monkeypatch, serving_args(pair, tmp_path, "serve.engine=vllm", f"serve.python={fake}",
                                      "serve.drafts=[base]", "serve.k=[1]"))
    serving = json.loads((tmp_path / "run/serve/serving.json").read_text())
    assert {(c["draft"], c["k"], c["concurrency"]) for c in serving["cells"]} == {
        ("base", 1, 1), ("base", 1, 2), ("ngram", 1, 1), ("ngram", 1, 2)}
    assert {r["k"] for r in json.loads((tmp_path / "run/eval/metrics.json").read_text())["records"]} == {2}
    # a list that names none of the eval's drafts (stages=[eval]: only base) fails before the eval runs
    capsys.readouterr()
    _expect_user_error(monkeypatch, capsys, serving_args(pair, tmp_path / "again", "serve.engine=vllm",
                                                         f"serve.python={fake}", "serve.drafts=[trained]"),
                       "serve.drafts=['trained'] names none of this eval's drafts (base)")
    assert not (tmp_path / "again" / "run" / "eval").exists()


def test_engine_auto_without_vllm_turns_the_ab_off_and_says_how_to_turn_it_on(pair, tmp_path, monkeypatch,  # noqa: F811
                                                                               capsys):
    missing = tmp_path / "no-such-python"
    contracts = eval_contracts(monkeypatch)
    run_cli(monkeypatch, serving_args(pair, tmp_path, "serve.engine=auto", f"serve.python={missing}"))
    assert not (tmp_path / "run/serve").exists()
    assert [c.decided_here for c in contracts] == [True]  # no serving A/B: the promotion decides at batch 1
    printed = capsys.readouterr().out
    assert "serving A/B on vLLM: off (" in printed
    assert f"looked at {missing} (serve.python)" in printed  # where it looked, not only "No module named 'vllm'"


def test_engine_vllm_without_vllm_fails_before_any_work(pair, tmp_path, monkeypatch, capsys):  # noqa: F811
    missing = tmp_path / "no-such-python"
    capsys.readouterr()
    _expect_user_error(monkeypatch, capsys, serving_args(pair, tmp_path, "serve.engine=vllm",
                                                         f"serve.python={missing}"), "vLLM is not importable")
    assert not (tmp_path / "run" / "eval").exists()


@pytest.mark.parametrize("override, message", [
    ("serve.engine=sglang", "serve.engine='sglang' is not one of"),
    ("serve.concurrency=[0]", "serve.concurrency must be"),
    ("promote.serving_concurrency=0", "promote.serving_concurrency must be >= 1"),
    ("serve.drafts=[champion]", "serve.drafts=['champion']: ['champion'] is not one of"),
    ("serve.k=[0]", "serve.k must be a list of integers >= 1"),
])
def test_serving_settings_are_checked_at_start_up(pair, tmp_path, monkeypatch, capsys, override, message):  # noqa: F811
    _expect_user_error(monkeypatch, capsys, serving_args(pair, tmp_path, override), message)


def test_the_vllm_venv_in_the_working_directory_is_used_as_is(tmp_path, monkeypatch):
    """./.venv-vllm/bin/python is a symlink to the base interpreter: resolving it would lose the venv (and vLLM)."""
    import os
    import sys

    from draftsmith.serve.server import vllm_python

    (tmp_path / ".venv-vllm" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, tmp_path / ".venv-vllm" / "bin" / "python")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DRAFTSMITH_VLLM_PYTHON", raising=False)
    assert vllm_python() == str(tmp_path / ".venv-vllm" / "bin" / "python")
    assert vllm_python("/opt/other/python") == "/opt/other/python"
    monkeypatch.setenv("DRAFTSMITH_VLLM_PYTHON", "/from/env/python")
    assert vllm_python() == "/from/env/python"
