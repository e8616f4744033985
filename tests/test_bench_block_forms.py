"""scripts/bench_block_forms.py on a tiny llama: every product form timed on every matrix, equal to float rounding."""

import json
import sys
from pathlib import Path

from conftest import make_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import bench_block_forms  # noqa: E402

sys.path.pop(0)


def test_block_forms_bench_prints_both_forms(tmp_path, tokenizer, monkeypatch, capsys):
    make_model("llama", seed=0, layers=2).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    monkeypatch.setattr("sys.argv", ["bench_block_forms.py", "--model", str(tmp_path / "m"), "--t", "1", "3",
                                     "--repeats", "2", "--context", "8"])
    bench_block_forms.main()
    out = json.loads(capsys.readouterr().out)
    assert out["matrices"] == 2 * 7 + 1 and set(out["products_ms"]) == {"1", "3"}
    for cell in out["products_ms"].values():
        assert cell["F.linear"] > 0 and cell["weight-first"] > 0 and cell["max_abs_diff"] < 1e-5
    assert "padded" not in out["products_ms"]["1"] and out["products_ms"]["3"]["padded"] > 0
    assert set(out["forward_one_token_ms"]) == {"F.linear", "weight-first", "measured"}
    assert set(out["forward_block_ms"]) == {"3"} and set(out["forward_block_ms"]["3"]) == {
        "F.linear", "weight-first", "padded", "measured"}
    assert "layer@1" in out["measured_choice"] and "head@1" in out["measured_choice"]
