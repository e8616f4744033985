"""An EAGLE-3 head folder served by the real vLLM as it is (slow; skipped, saying why, where vLLM is not importable).

``vllm serve HEAD_DIR`` with no other flag serves the verifier the folder names with the head: greedy outputs equal
plain vLLM's and draftsmith's own, vLLM's speculative counters show proposals made and accepted; the speculators
library (installed beside vLLM) loads the folder, every tensor equal to what was written.
"""

import json
import subprocess
import urllib.request

import pytest
import torch

from conftest import make_model, make_tokenizer
from test_eagle3 import trained_head
from test_serving_vllm import vllm_info, vllm_python  # noqa: F401 (the fixture)


def completions(url: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    model = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=30).read())["data"][0]["id"]
    out = []
    for p in prompts:
        body = {"model": model, "prompt": p, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        out.append(json.loads(urllib.request.urlopen(req, timeout=120).read())["choices"][0]["token_ids"])
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from draftsmith.decode.eagle3 import save_eagle3

    root = tmp_path_factory.mktemp("eagle3-vllm")
    tokenizer = make_tokenizer()
    target = make_model("llama", seed=0, hidden=128, layers=8)  # head_dim 32: vLLM's CPU attention takes it
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    head, _ = trained_head(target, steps=60, layers=None, vocab=torch.arange(3, 50))  # vLLM's layers (2, 4, 5)
    save_eagle3(root / "head", head, verifier=str(root / "target"), verifier_architectures=["LlamaForCausalLM"], k=3)
    tokenizer.save_pretrained(root / "head")
    return root, target, head


@pytest.mark.slow
def test_vllm_serves_the_head_folder_alone(vllm_info, folder):  # noqa: F811
    from draftsmith.decode import autoregressive_generate
    from draftsmith.serve.metrics import parse_spec_counters, scrape_metrics
    from draftsmith.serve.server import ServerSpec, VllmServer

    root, target, _ = folder
    prompts = [[5, 9, 13, 20, 40], [7, 8, 9, 10], [30, 31, 12, 5, 6, 7], [11, 12, 13]]
    reference = [autoregressive_generate(target, torch.tensor([p]), max_new_tokens=16).sequences[0, len(p):].tolist()
                 for p in prompts]
    with VllmServer(ServerSpec(model=str(root / "head"), python=vllm_python(), kvcache_gib=1),
                    log_path=root / "head.log", startup_timeout_s=400) as server:
        spec = completions(server.url, prompts, 16)
        counters = parse_spec_counters(scrape_metrics(server.url))
    with VllmServer(ServerSpec(model=str(root / "target"), python=vllm_python(), kvcache_gib=1),
                    log_path=root / "plain.log", startup_timeout_s=400) as server:
        plain = completions(server.url, prompts, 16)
    assert spec == plain == reference
    assert counters.draft_tokens > 0 and counters.drafts > 0 and counters.accepted_tokens > 0, counters
    assert len(counters.accepted_per_pos) == 3  # K=3, read from the folder's speculators_config


@pytest.mark.slow
def test_the_speculators_library_loads_the_folder(vllm_info, folder):  # noqa: F811
    root, _, _ = folder
    script = f"""
import json, torch
from safetensors.torch import load_file
from speculators import SpeculatorModel
model = SpeculatorModel.from_pretrained({str(root / "head")!r})
written = load_file({str(root / "head" / "model.safetensors")!r})
state = model.state_dict()
print(json.dumps({{"kind": type(model).__name__, "vocab": model.config.draft_vocab_size,
                  "layers": model.config.eagle_aux_hidden_state_layer_ids,
                  "norm_before_residual": model.config.norm_before_residual,
                  "missing": sorted(set(written) - set(state)),
                  "equal": all(torch.equal(state[k].to(v.dtype), v) for k, v in written.items() if k in state),
                  "not_written": sorted(set(state) - set(written))}}))
"""
    probe = subprocess.run([vllm_python(), "-c", "import speculators"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"speculators is not importable by {vllm_python()} (README: installed beside vLLM)")
    out = subprocess.run([vllm_python(), "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["kind"] == "Eagle3DraftModel" and doc["vocab"] == 47 and doc["layers"] == [2, 4, 5]
    assert doc["norm_before_residual"] is False and doc["missing"] == [] and doc["equal"] is True
    # what speculators holds and the folder leaves out: the verifier's own (embedding, norm, head), shared at load
    assert set(doc["not_written"]) <= {"embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight"}
