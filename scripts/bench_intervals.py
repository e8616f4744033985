"""How often the speedup's 95% interval (eval/intervals.py) covers the true speedup: a simulation, printed as JSON.

Prompts differ (plain time L ~ U(0.5, 1.5) s, per-prompt speedup s ~ U(1.3, 1.7)) and every run is noisy (each
time times N(1, noise)); the true speedup is E[L] / E[L / s] (by a large Monte Carlo). For each number of
prompts and repeats, `--trials` samples are drawn and the share of intervals containing the truth is reported,
for the plain percentile bootstrap (tail 0.025) and the expanded one the project uses.

    python scripts/bench_intervals.py --trials 400
"""

from __future__ import annotations

import argparse
import json
import random

from draftsmith.eval import intervals
from draftsmith.eval.intervals import ratio_ci


def sample(rng: random.Random, n: int, r: int, noise: float):
    units = []
    for _ in range(n):
        length, speedup = rng.uniform(0.5, 1.5), rng.uniform(1.3, 1.7)
        units.append([(length * rng.gauss(1, noise), length / speedup * rng.gauss(1, noise)) for _ in range(r)])
    return units


def truth(rng: random.Random, draws: int = 400_000) -> float:
    num = den = 0.0
    for _ in range(draws):
        length, speedup = rng.uniform(0.5, 1.5), rng.uniform(1.3, 1.7)
        num, den = num + length, den + length / speedup
    return num / den


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    true = truth(random.Random(args.seed + 1))
    expanded = intervals.expanded_tail
    rows = []
    for n, r in ((4, 1), (6, 1), (8, 1), (8, 2), (8, 4), (16, 1), (32, 1)):
        hits = {"percentile": 0, "expanded": 0}
        for _ in range(args.trials):
            units = sample(rng, n, r, args.noise)
            seed = rng.randrange(1 << 30)
            for name, tail in (("percentile", lambda _n: 0.025), ("expanded", expanded)):
                intervals.expanded_tail = tail  # the same resamples (same seed), two tails
                lo, hi = ratio_ci(units, n_boot=args.n_boot, seed=seed)
                hits[name] += lo <= true <= hi
        intervals.expanded_tail = expanded
        rows.append({"prompts": n, "repeats": r, **{f"coverage_{k}": v / args.trials for k, v in hits.items()}})
    print(json.dumps({"true_speedup": true, "trials": args.trials, "n_boot": args.n_boot, "noise": args.noise,
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
