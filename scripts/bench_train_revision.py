"""Benchmark the train stage against an earlier revision of itself: a refactor of the training loop must not cost
speed or change what it trains.

Builds one datagen output from the demo target (cached by the demo bootstrap) and a draft initialisation, then
runs the whole train stage (``draftsmith.train.trainer.run``: data loading, the loop, checkpoints, the written
draft) of this checkout and of git revision `--rev`, each in a fresh process, alternating which goes first per
repeat. Per kind (``distill``: a draft model, fkl on the cached top-k; ``eagle``: an EAGLE-1 head over the demo
target's features, float32), medians over repeats: the loop's own time ratio, this / rev (the inverse ratio of
the stage's ``train_tokens_per_s``: both train on the same batches, so the same tokens), the whole stage's wall
seconds per step (loading, features, checkpoints and writing included) of each, and whether the two wrote
bit-identical weights.

    python scripts/bench_train_revision.py --rev HEAD~1 --steps 60 --repeats 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("artifacts", "decode", "serve", "train", "eval", "monitor", "conf")

RUN = """
import json, sys, time
from draftsmith.train import trainer
fields = json.loads(sys.argv[1])
started = time.perf_counter()
metrics = trainer.run(trainer.TrainConfig(**fields))
print(json.dumps({"module": trainer.__file__, "steps": len(metrics["history"]["train"]),
                  "tokens_per_s": metrics["train_tokens_per_s"], "wall_s": time.perf_counter() - started}))
"""


def package_of_revision(rev: str, into: Path) -> Path:
    """A folder importable as ``draftsmith`` holding revision `rev` (git archive, the rooms linked as subpackages
    as pyproject.toml maps them); -> the folder to put on PYTHONPATH."""
    src = into / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pkg = into / "pkg"
    (pkg / "draftsmith").mkdir(parents=True)
    for item in (src / "draftsmith").iterdir():
        (pkg / "draftsmith" / item.name).symlink_to(item)
    for room in ROOMS:
        target = src / ("draftsmith/conf" if room == "conf" else room)
        if room != "conf" and target.exists():
            (pkg / "draftsmith" / room).symlink_to(target)
    return pkg


def weights_digest(folder: Path) -> str:
    """sha256 over the folder's safetensors files (the trained weights), in name order."""
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        h.update(path.read_bytes())
    return h.hexdigest()


def train_once(fields: dict, pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath  # before the editable install's finder: the revision's package wins
    # run outside the checkout: `python -c` puts the working directory first on sys.path, and the checkout's own
    # draftsmith/ folder would shadow the revision's
    out = subprocess.run([sys.executable, "-c", RUN, json.dumps(fields)], env=env, capture_output=True, text=True,
                         cwd=fields["out_dir"].rsplit("/", 1)[0])
    if out.returncode != 0:
        raise SystemExit(f"train failed ({'rev' if pythonpath else 'this checkout'}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", required=True, help="the git revision to compare with (e.g. HEAD~1)")
    ap.add_argument("--kinds", nargs="+", default=["distill", "eagle"], choices=["distill", "eagle"])
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer

    from draftsmith.demo import DraftSpec, build_demo_target, demo_prompts, make_model
    from draftsmith.train import datagen

    target = str(build_demo_target(log=lambda m: print(m, file=sys.stderr)))
    tokenizer = AutoTokenizer.from_pretrained(target)
    report: dict = {"rev": args.rev, "settings": vars(args), "host": platform.processor() or platform.machine(),
                    "kinds": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pkg = package_of_revision(args.rev, tmp / "rev")
        jsonl = tmp / "prompts.jsonl"
        jsonl.write_text("".join(json.dumps({"prompt": tokenizer.decode(p[0])}) + "\n"
                                 for p in demo_prompts(tokenizer, args.prompts, 48, seed=3)))
        datagen.run(datagen.DatagenConfig(target=target, prompts=str(jsonl), out_dir=str(tmp / "data"),
                                          max_new_tokens=48, batch_size=32, top_k_logprobs=32,
                                          max_prompt_tokens=256))
        make_model(DraftSpec().model, tokenizer, 128, seed=1).save_pretrained(tmp / "init")
        tokenizer.save_pretrained(tmp / "init")
        for kind in args.kinds:
            base = dict(data_dir=str(tmp / "data"), target=target, steps=args.steps, batch_size=args.batch_size,
                        eval_every=args.steps // 2, save_every=args.steps // 2, device="cpu", mixed_precision="no")
            base |= dict(draft=str(tmp / "init"), loss="fkl", teacher="cached") if kind == "distill" else \
                dict(draft=target, finetune="eagle", lr=1e-3)
            per_step, rate = {"this": [], "rev": []}, {"this": [], "rev": []}
            digests = {"this": set(), "rev": set()}
            for rep in range(args.repeats):
                for side in (("this", "rev") if rep % 2 == 0 else ("rev", "this")):
                    out = tmp / f"{kind}-{side}-{rep}"
                    result = train_once({**base, "out_dir": str(out)}, str(pkg) if side == "rev" else None)
                    if side == "rev" and not result["module"].startswith(str(pkg)):
                        raise SystemExit(f"the revision's run imported {result['module']}, not {pkg}")
                    per_step[side].append(result["wall_s"] / max(result["steps"], 1))
                    rate[side].append(result["tokens_per_s"])
                    digests[side].add(weights_digest(out / "draft"))
            med = {side: statistics.median(v) for side, v in per_step.items()}
            tps = {side: statistics.median(v) for side, v in rate.items()}
            report["kinds"][kind] = {"loop_time_this_over_rev": tps["rev"] / tps["this"], "train_tokens_per_s": tps,
                                     "stage_s_per_step_median": med, "stage_this_over_rev": med["this"] / med["rev"],
                                     "all_repeats": {"stage_s_per_step": per_step, "train_tokens_per_s": rate},
                                     "weights_equal": len(digests["this"] | digests["rev"]) == 1}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
