"""The product forms of the lean forward (decode/lean.py), side by side on one model's own matrices.

    python scripts/bench_block_forms.py --model MODEL_DIR [--t 1 2 3 4 5 8 16] [--repeats 15]

For each block size T: the model's decoder-layer matrices and its head, every one of them in forward order (as a
forward streams them from memory), as ``F.linear`` (what nn.Linear does), as the weight-first product
(``W @ x^T``; one token: ``W @ [x; 0]^T``) and, for T >= 2, as the weight-first product padded with a zero column
to T + 1 columns ("padded": whether an odd T runs faster at the next even width, as one token does at two),
interleaved (the order alternates per repeat), medians; then the lean forward of one token after a 200-token
prefix with each form forced, and with the measured choice (what decoding uses), and the same for a forward of
each T >= 2 (a verification of T - 1 draft tokens). Prints JSON. Results agree to float rounding (checked: max
|difference| per T).
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from draftsmith.decode.lean import LINEAR, PADDED, WEIGHT_FIRST, LeanModel, product
from draftsmith.decode.pair import load_model


def _forward_ms(lean: LeanModel, prefix: torch.Tensor, forms: dict, t: int, repeats: int) -> dict:
    """Median ms of a `t`-token forward after `prefix` with each of `forms` (name -> LeanModel.block_form) forced,
    interleaved (the order alternates per repeat; the first round warms up)."""
    times = {k: [] for k in forms}
    for r in range(repeats + 1):
        for name in (list(forms) if r % 2 else list(forms)[::-1]):
            lean.block_form = forms[name]
            lean.crop(0)
            lean.forward(prefix, 1)
            started = time.perf_counter()
            lean.forward(prefix[:, :t], t)
            if r:
                times[name].append((time.perf_counter() - started) * 1e3)
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a Llama-family model dir (e.g. the preset's float32 target)")
    ap.add_argument("--t", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8, 16])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--context", type=int, default=200, help="cached positions before the timed one-token forwards")
    args = ap.parse_args()
    model = load_model(args.model, "target", "float32", "cpu")
    lean = LeanModel(model, capacity=args.context + 64)
    weights = [w for layer in lean.layers for w, _ in (*layer.qkv_o, *layer.mlp)] + [lean.head[0]]
    out = {"model": args.model, "threads": torch.get_num_threads(), "matrices": len(weights),
           "mbytes": round(sum(w.numel() * w.element_size() for w in weights) / 2**20, 1), "repeats": args.repeats,
           "products_ms": {}, "forward_one_token_ms": {}}
    with torch.inference_mode():
        for t in args.t:
            inputs = [torch.randn(1, t, w.shape[1]) for w in weights]
            forms = {LINEAR: F.linear, WEIGHT_FIRST: product(WEIGHT_FIRST, t)}
            if t > 1:
                forms[PADDED] = product(PADDED, t)
            err = max((f(x, w) - F.linear(x, w)).abs().max().item() for f in forms.values()
                      for x, w in zip(inputs, weights))
            times = {name: [] for name in forms}
            for r in range(args.repeats + 1):
                for name in (list(forms) if r % 2 else list(forms)[::-1]):
                    f = forms[name]
                    started = time.perf_counter()
                    for x, w in zip(inputs, weights):
                        f(x, w)
                    if r:
                        times[name].append((time.perf_counter() - started) * 1e3)
            med = {k: round(statistics.median(v), 2) for k, v in times.items()}
            out["products_ms"][str(t)] = {**med, "ratio": round(med["F.linear"] / med["weight-first"], 3),
                                          "max_abs_diff": err}
        prefix = torch.randint(0, lean.head[0].shape[0], (1, args.context), generator=torch.Generator().manual_seed(0))
        one = {LINEAR: LINEAR, WEIGHT_FIRST: PADDED, "measured": None}  # one token: W @ [x; 0]^T
        out["forward_one_token_ms"] = _forward_ms(lean, prefix, one, 1, args.repeats)
        block = {LINEAR: LINEAR, WEIGHT_FIRST: WEIGHT_FIRST, PADDED: PADDED, "measured": None}
        out["forward_block_ms"] = {str(t): _forward_ms(lean, prefix, block, t, args.repeats)
                                   for t in args.t if t > 1}  # a verification forward of t tokens after the prefix
        out["measured_choice"] = {f"{where}@{t}": form for (where, t), form in sorted(lean._forms.items())}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
