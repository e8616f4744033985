"""The real serving A/B on vLLM with a tiny Llama pair (slow; skipped, saying why, where vLLM is not importable).

The vLLM interpreter: $DRAFTSMITH_VLLM_PYTHON, else ``.venv-vllm/bin/python`` in the repository when it
exists, else this interpreter (see README: vLLM lives in its own venv).
"""

import os
import sys
from pathlib import Path

import pytest

from conftest import make_model, make_tokenizer, perturbed_copy, prompts
from draftsmith.serve.server import probe_vllm

ROOT = Path(__file__).resolve().parent.parent


def vllm_python() -> str:
    default = ROOT / ".venv-vllm" / "bin" / "python"
    return os.environ.get("DRAFTSMITH_VLLM_PYTHON") or (str(default) if default.exists() else sys.executable)


@pytest.fixture(scope="module")
def vllm_info():
    info = probe_vllm(vllm_python())
    if not info["ok"]:
        pytest.skip(f"vLLM is not importable by {vllm_python()} ({info['reason']}); set DRAFTSMITH_VLLM_PYTHON")
    return info


@pytest.mark.slow
def test_real_serving_ab_on_a_tiny_pair(vllm_info, tmp_path):
    import torch

    from draftsmith.decode import autoregressive_generate
    from draftsmith.eval.serving import run_serving_ab
    from draftsmith.eval.serving_stats import summary_lines
    from draftsmith.eval.settings import ServingSettings

    tokenizer = make_tokenizer()
    target = make_model("llama", seed=0, hidden=128)  # head_dim 32: the smallest vLLM's CPU attention takes
    draft = make_model("llama", seed=0, hidden=128, layers=1)
    noisy = perturbed_copy(target, 0.3).state_dict()
    draft.load_state_dict({k: v for k, v in noisy.items() if k in draft.state_dict()})  # a partly agreeing draft
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    ids = [p[0].tolist() for p in prompts(8, seed=1)]
    max_tokens = 16
    reference = [autoregressive_generate(target, torch.tensor([p]), max_new_tokens=max_tokens).sequences[0, len(p):]
                 .tolist() for p in ids]  # draftsmith's own greedy loop

    settings = ServingSettings(engine="vllm", concurrency=[1, 4], max_tokens=max_tokens, max_prompts=8, warmup=1,
                               python=vllm_python(), startup_timeout_s=300, kvcache_gib=1)
    serving = run_serving_ab(settings, target=str(tmp_path / "target"), drafts={"tiny": str(tmp_path / "draft")},
                             k=[2], prompts=ids, out_dir=tmp_path / "eval", reference=reference)
    for line in summary_lines(serving):
        print(line)
    for c in serving["cells"]:
        print(f"concurrency {c['concurrency']}: spec {c['spec']['output_tokens_per_s']:.1f} tok/s, plain "
              f"{c['plain']['output_tokens_per_s']:.1f} tok/s, speedup {c['speedup']:.2f}, acceptance "
              f"{c['acceptance_rate'] or 0:.2f}, per position "
              f"{[None if a is None else round(a, 2) for a in c['per_position_acceptance']]}, "
              f"TPOT p50 {c['spec']['tpot_ms_p50']:.1f} vs {c['plain']['tpot_ms_p50']:.1f} ms")
    assert serving["vllm"]["device"] == vllm_info["device"]
    # the draft and vLLM's n-gram prompt lookup (serve.baselines' default), on the same requests
    assert [(c["draft"], c["k"], c["concurrency"]) for c in serving["cells"]] == [
        ("tiny", 2, 1), ("tiny", 2, 4), ("ngram", 2, 1), ("ngram", 2, 4)]
    for c in serving["cells"]:
        assert c["spec"]["errors"] == 0 and c["plain"]["errors"] == 0
        assert c["spec"]["output_tokens"] == c["plain"]["output_tokens"] == max_tokens * c["spec"]["requests"]
        assert c["by"] == "token_ids" and c["outputs_equal"] is True, c["first_mismatch"]
        assert c["plain_equals_reference"] is True and c["spec_equals_reference"] is True
        if c["draft"] == "tiny":
            assert 0.0 <= c["acceptance_rate"] <= 1.0 and len(c["per_position_acceptance"]) == 2
        else:  # lookup proposes only where the text repeats, and its tokens never change the output (above)
            assert c["acceptance_rate"] is None or 0.0 <= c["acceptance_rate"] <= 1.0
            # a lookup draft may be shorter than K: only its first position's acceptance is known
            assert c["per_position_acceptance"][1:] in ([], [None])
            assert c["mean_draft_tokens"] is None or 0.0 < c["mean_draft_tokens"] <= 2.0
        assert c["speedup"] > 0
    # the tiny random target falls into loops: lookup finds repeats and drafts
    assert sum(c["vllm_counters"]["draft_tokens"] for c in serving["cells"] if c["draft"] == "ngram") > 0
    assert (tmp_path / "eval" / "serving.json").exists() and (tmp_path / "eval" / "serving_speedup.png").exists()


@pytest.mark.slow
def test_real_suffix_decoding_keeps_vllms_greedy_outputs_and_proposes(vllm_info, tmp_path):
    """serve.baselines=[suffix] on the real vLLM (Arctic Inference installed beside it; skipped, saying why, where
    it is not): the suffix-decoding server's greedy outputs equal the plain server's and draftsmith's own loop's, and
    its trees propose (the tiny random target falls into loops)."""
    import subprocess

    import torch

    from draftsmith.decode import autoregressive_generate
    from draftsmith.eval.serving import run_serving_ab
    from draftsmith.eval.settings import ServingSettings

    found = subprocess.run([vllm_python(), "-c", "import arctic_inference.suffix_decoding"], capture_output=True,
                           text=True)
    if found.returncode:
        pytest.skip(f"{vllm_python()} does not import Arctic Inference (pip install --no-deps arctic-inference==0.3.0 "
                    f"there): {found.stderr.strip().splitlines()[-1:]}")
    tokenizer = make_tokenizer()
    target = make_model("llama", seed=0, hidden=128)
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    draft = make_model("llama", seed=0, hidden=128, layers=1)
    draft.save_pretrained(tmp_path / "draft")
    tokenizer.save_pretrained(tmp_path / "draft")
    ids = [p[0].tolist() for p in prompts(6, seed=2)]
    max_tokens = 24
    reference = [autoregressive_generate(target, torch.tensor([p]), max_new_tokens=max_tokens).sequences[0, len(p):]
                 .tolist() for p in ids]
    settings = ServingSettings(engine="vllm", concurrency=[1], max_tokens=max_tokens, max_prompts=6, warmup=1,
                               python=vllm_python(), startup_timeout_s=300, kvcache_gib=1, baselines=["suffix"],
                               decision_servers=0)
    serving = run_serving_ab(settings, target=str(tmp_path / "target"), drafts={"tiny": str(tmp_path / "draft")},
                             k=[3], prompts=ids, out_dir=tmp_path / "eval", reference=reference)
    (cell,) = [c for c in serving["cells"] if c["draft"] == "suffix"]
    print(f"suffix: speedup {cell['speedup']:.2f}, acceptance {cell['acceptance_rate']}, counters "
          f"{cell['vllm_counters']}")
    assert serving["drafts"]["suffix"] == "suffix" and cell["k"] == 3
    assert cell["spec"]["errors"] == 0 and cell["outputs_equal"] is True, cell["first_mismatch"]
    assert cell["plain_equals_reference"] is True and cell["spec_equals_reference"] is True
    assert cell["vllm_counters"]["draft_tokens"] > 0
    assert '"method": "suffix"' in (tmp_path / "eval" / "serving_logs" / "suffix-k3.log").read_text().splitlines()[0]
