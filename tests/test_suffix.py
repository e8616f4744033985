"""vLLM's suffix decoding as a training-free rival (decode/free.py): its spec string, its vLLM config, the settings
that take it (serve.baselines, eval.baselines where Arctic Inference imports), the start-up check for Arctic
Inference, and the serving A/B serving it beside a draft through the fake vLLM (tests/serving_fakes.py). In
draftsmith's loop: tests/test_suffix_loop.py; the real engine: tests/test_serving_vllm.py (slow)."""

import json
import sys

import pytest

from draftsmith.artifacts.errors import ConfigError
from draftsmith.decode import free
from draftsmith.eval.policy import Roles
from draftsmith.eval.serving import run_serving_ab
from draftsmith.eval.settings import EvalSettings, ServingSettings, training_free, with_training_free
from draftsmith.serve.errors import VllmError
from draftsmith.serve.server import require_suffix_decoding, speculative_config, speculative_method
from serving_fakes import write_fake_python  # noqa: E402


def test_the_spec_strings_of_the_training_free_methods():
    assert free.is_free_spec("suffix") and free.is_suffix_spec("suffix") and not free.is_suffix_spec("ngram")
    assert free.is_free_spec("ngram") and free.is_free_spec("ngram:1-3")
    assert not free.is_free_spec("suffix:3") and not free.is_free_spec("/models/suffix") and not free.is_free_spec(None)
    assert free.canonical("suffix") == "suffix" and free.canonical("ngram") == free.canonical("ngram:2-4")
    with pytest.raises(ValueError, match="serve.baselines"):
        free.canonical("ngram:x", key="serve.baselines")
    assert [free.method(s) for s in ("suffix", "ngram", "ngram:1-3")] == ["suffix", "ngram", "ngram"]


def test_vllm_serves_suffix_decoding_with_its_own_config_and_a_k_schedule():
    assert speculative_method("suffix") == "suffix"
    # no global tree of past responses: the A/B replays its prompts, greedy (decode/free.py vllm_config)
    assert speculative_config("suffix", 3) == {"method": "suffix", "num_speculative_tokens": 3,
                                               "suffix_decoding_max_cached_requests": 0}
    scheduled = speculative_config("suffix", None, [[1, 2, 3], [3, 8, 0]])
    assert scheduled == {"method": "suffix", "num_speculative_tokens": 3, "suffix_decoding_max_cached_requests": 0,
                         "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 8, 0]]}
    assert speculative_config("ngram", 2)["method"] == "ngram"  # prompt lookup's unchanged


def test_serve_and_eval_baselines_take_suffix():
    assert training_free(["ngram", "suffix"], "serve.baselines") == {"ngram": free.canonical("ngram"),
                                                                                   "suffix": "suffix"}
    assert training_free(["suffix", "suffix"], "serve.baselines") == {"suffix": "suffix"}
    assert set(training_free(["ngram:1-3", "ngram:2-4", "suffix"], "serve.baselines")) == \
        {"ngram:1-3", "ngram:2-4", "suffix"}  # several windows keep their spec names; suffix keeps its own
    assert ServingSettings(baselines=["suffix"]).baselines == ["suffix"]
    with pytest.raises(ConfigError, match=r"suffix \(vLLM.s suffix decoding\)"):
        ServingSettings(baselines=["suffx"])
    drafts = with_training_free({"trained": "/d"}, ["suffix"], "serve.baselines")
    assert drafts == {"trained": "/d", "suffix": "suffix"} and Roles.of(drafts).free == ("suffix",)


def test_eval_baselines_with_suffix_need_arctic_inference_here(monkeypatch):
    from draftsmith.decode import suffix

    monkeypatch.setattr(suffix, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"eval.baselines lists suffix.*pip install --no-deps arctic-inference"):
        EvalSettings(baselines=["ngram", "suffix"])
    monkeypatch.setattr(suffix, "available", lambda: True)
    assert EvalSettings(baselines=["ngram", "suffix"]).baselines == ["ngram", "suffix"]


def interpreter(tmp_path, imports: bool):
    """A stand-in for vLLM's python whose ``-c 'import arctic_inference.suffix_decoding'`` succeeds or fails."""
    path = tmp_path / f"python-{'with' if imports else 'without'}-arctic"
    fail = "" if imports else "sys.stderr.write(\"ModuleNotFoundError: No module named 'arctic_inference'\\n\"); sys.exit(1)"
    path.write_text(f"#!{sys.executable}\nimport sys\n{fail}\n")
    path.chmod(0o755)
    return str(path)


def test_the_start_up_check_names_the_key_and_how_to_install(tmp_path):
    with pytest.raises(VllmError) as refused:
        require_suffix_decoding(interpreter(tmp_path, imports=False))
    message = str(refused.value)
    assert "serve.baselines lists suffix" in message and "No module named 'arctic_inference'" in message
    assert "pip install --no-deps arctic-inference==0.3.0" in message and "drop suffix from serve.baselines" in message
    require_suffix_decoding(interpreter(tmp_path, imports=True))  # no error


@pytest.mark.parametrize("engine, url, found, checked", [
    ("vllm", None, True, True), ("auto", None, True, True),  # servers launched here: checked before any work
    ("auto", None, False, False),  # auto found no vLLM: no serving A/B, nothing to check
    ("vllm", "http://127.0.0.1:1", True, False),  # the user's own servers: theirs to configure
])
def test_the_pipeline_checks_for_arctic_inference_only_where_it_launches_suffix_servers(monkeypatch, engine, url, found,
                                                                                         checked):
    from types import SimpleNamespace

    import draftsmith.serve.server as server
    from draftsmith.pipeline import Pipeline

    asked = []
    monkeypatch.setattr(server, "require_vllm", lambda *a, **kw: {"ok": True})
    monkeypatch.setattr(server, "probe_vllm", lambda *a, **kw: {"ok": found, "reason": None if found else "absent"})
    monkeypatch.setattr(server, "require_suffix_decoding", lambda python=None, **kw: asked.append(python))
    urls = {"url": url, "baseline_url": url + "/plain"} if url else {}
    pipeline = SimpleNamespace(cfg=SimpleNamespace(serve=ServingSettings(engine=engine, python="/py",
                                                                         baselines=["ngram", "suffix"], **urls)))
    Pipeline.resolve_serving_engine(pipeline)
    assert asked == (["/py"] if checked else [])
    pipeline.cfg.serve = ServingSettings(engine="vllm", python="/py", baselines=["ngram"])
    Pipeline.resolve_serving_engine(pipeline)  # no suffix asked for: no check
    assert len(asked) == (1 if checked else 0)


def test_the_serving_ab_serves_suffix_beside_the_draft_as_a_rival(tmp_path, monkeypatch):
    fake = write_fake_python(tmp_path)
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(tmp_path))
    settings = ServingSettings(engine="vllm", baselines=["ngram", "suffix"], concurrency=[1], max_tokens=4,
                               max_prompts=2, warmup=0, python=str(fake), startup_timeout_s=30, repeats=1,
                               decision_servers=0)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval", log=lambda *_: None)
    assert serving["drafts"]["suffix"] == "suffix"
    assert {c["draft"] for c in serving["cells"]} == {"trained", "ngram", "suffix"}
    log = (tmp_path / "eval" / "serving_logs" / "suffix-k2.log").read_text()
    config = json.loads(log.splitlines()[0].split("--speculative-config ", 1)[1].split(" --", 1)[0])
    assert config == {"method": "suffix", "num_speculative_tokens": 2, "suffix_decoding_max_cached_requests": 0}
    assert set(Roles.of(serving["drafts"]).free) == {"ngram", "suffix"}
