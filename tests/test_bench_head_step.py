"""scripts/bench_head_step.py on a tiny llama and an EAGLE-3 head: both product forms timed, the same proposals."""

import sys
from pathlib import Path

import torch

from conftest import make_model
from draftsmith.decode.eagle3 import head_for_target, save_eagle3

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import bench_head_step  # noqa: E402

sys.path.pop(0)


def test_head_step_bench_times_both_forms(tmp_path, tokenizer, monkeypatch):
    # the lean form fixed to W @ [x; 0]^T (its timing could pick F.linear on some machine, and both columns would
    # then run the same products)
    monkeypatch.setattr("draftsmith.decode.lean.fastest_form", lambda weights, t, repeats=5: "padded")
    target = make_model("llama", seed=0, layers=4)
    target.save_pretrained(tmp_path / "t")
    tokenizer.save_pretrained(tmp_path / "t")
    head = head_for_target(target, [0, 1, 3], torch.arange(4, 60))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    save_eagle3(tmp_path / "h", head, verifier=str(tmp_path / "t"), verifier_architectures=["LlamaForCausalLM"], k=2)
    out = bench_head_step.main(["--target", str(tmp_path / "t"), "--head", str(tmp_path / "h"), "--k", "2",
                                "--context", "12", "--repeats", "3"])
    assert set(out["c"]) == {"F.linear", "lean"} and all(v > 0 for v in out["c"].values())
    assert out["plain_step_ms"] > 0 and out["proposal_ms"]["lean"] > 0
    assert out["same_proposals"] is True  # the forms differ by float rounding only
    assert out["lean_forms"]["layer@1"] == out["lean_forms"]["layer@2"] == "padded"  # the runner asked for both sizes


def test_head_step_bench_takes_an_eagle1_head_with_its_vocabulary(tmp_path, tokenizer, monkeypatch):
    from draftsmith.decode.eagle import EagleHead, save_eagle
    from draftsmith.decode.vocab import save_vocab

    monkeypatch.setattr("draftsmith.decode.lean.fastest_form", lambda weights, t, repeats=5: "padded")
    target = make_model("llama", seed=0, layers=2)
    target.save_pretrained(tmp_path / "t")
    tokenizer.save_pretrained(tmp_path / "t")
    save_eagle(tmp_path / "h", EagleHead(target))
    save_vocab(tmp_path / "vocab.json", torch.arange(4, 40))
    out = bench_head_step.main(["--target", str(tmp_path / "t"), "--head", str(tmp_path / "h"), "--vocab",
                                str(tmp_path / "vocab.json"), "--k", "2", "--context", "12", "--repeats", "2"])
    assert all(v > 0 for v in out["c"].values()) and out["same_proposals"] is True
    assert out["lean_forms"]["layer@2"] == "padded"
