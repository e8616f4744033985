"""Can datagen take an EAGLE-3 head's features from vLLM instead of an HF forward? (issue 40 item 7)

vLLM (0.32) extracts a target's hidden states with the ``extract_hidden_states`` speculative method and a KV
connector that writes them to safetensors files (``ExampleHiddenStatesConnector``), the path speculators' data
generation takes. This probe runs that on `--target` for a few prompts (their token ids; `--max-tokens` generated
greedily, whose states vLLM keeps too: ``include_output_tokens``) in the vLLM interpreter (`--python`), then
compares what vLLM wrote with draftsmith's own teacher-forced features of the same ids (decode/eagle3.py
``target_aux_features``: the residual stream entering each of `--layers`, and the final post-norm features, which
are the stream vLLM keeps after the last layer through the target's final norm): per layer, the largest absolute
difference and the largest per-token relative L2 difference; whether the final features pick the same argmax; and
whether vLLM's greedy tokens are the HF target's. Prints JSON: what vLLM answered (the
error, when it refused or failed), the tensors' shapes, and the differences.

`--connector cpu` (the default) writes through serve/vllm_hidden_states.py ``CpuHiddenStatesConnector`` (vLLM's
connector without its CUDA copy); `--connector example` runs vLLM's own, which on the CPU build stops at its write
(pinned memory needs an accelerator).

    python scripts/probe_vllm_hidden_states.py --target TARGET_DIR --python .venv-vllm/bin/python --max-tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VLLM_SIDE = r"""
import json, sys
args = json.loads(sys.argv[1])
from vllm import LLM, SamplingParams
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import load_hidden_states
llm = LLM(model=args["target"], dtype="float32", enforce_eager=True, max_model_len=512,
          gpu_memory_utilization=0.3,
          speculative_config=args["speculative_config"], kv_transfer_config=args["kv_transfer_config"])
params = SamplingParams(max_tokens=args["max_tokens"], temperature=0, ignore_eos=True,
                        extra_args={"kv_transfer_params": {"include_output_tokens": args["max_tokens"] > 1}})
outs = llm.generate([{"prompt_token_ids": ids} for ids in args["prompts"]], params)
paths = [(o.kv_transfer_params or {}).get("hidden_states_path") for o in outs]
print("GENERATED " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
for path in paths:  # the connector writes asynchronously: wait on its lock, as vLLM's own reader does
    if path is not None:
        load_hidden_states(path)
print("PATHS " + json.dumps(paths))
"""


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="a local target model directory (Llama family)")
    ap.add_argument("--python", required=True, help="the interpreter that imports vllm")
    ap.add_argument("--layers", type=int, nargs=3, help="the three layers (default: vLLM's (2, L//2, L-3))")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--length", type=int, default=24, help="tokens per prompt")
    ap.add_argument("--max-tokens", type=int, default=1, help="tokens vLLM generates per prompt (greedy)")
    ap.add_argument("--connector", choices=["cpu", "example"], default="cpu",
                    help="cpu: draftsmith's CpuHiddenStatesConnector; example: vLLM's ExampleHiddenStatesConnector")
    args = ap.parse_args(argv)

    import torch
    from safetensors.torch import load_file

    from draftsmith.decode.eagle3 import default_layers, target_aux_features
    from draftsmith.decode.pair import load_model

    target = load_model(args.target, "target", "float32", "cpu")
    layers = args.layers or default_layers(int(target.config.num_hidden_layers))
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, int(target.config.vocab_size) - 10, (args.length,), generator=gen).tolist()
               for _ in range(args.prompts)]
    report: dict = {"target": args.target, "layers": layers, "prompts": args.prompts, "length": args.length,
                    "max_tokens": args.max_tokens, "connector": args.connector}
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as modules:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}  # CPU: GiB
        from draftsmith.train.target_states import extraction_configs

        module = None
        if args.connector == "cpu":
            from draftsmith.serve.vllm_hidden_states import install

            module = install(modules)
            env["PYTHONPATH"] = os.pathsep.join(x for x in (modules, env.get("PYTHONPATH")) if x)
        final = int(target.config.num_hidden_layers)  # the stream after the last layer: the final norm's input
        spec, transfer = extraction_configs(layers, final, out, module)
        job = {"target": args.target, "prompts": prompts, "max_tokens": args.max_tokens, "speculative_config": spec,
               "kv_transfer_config": transfer}
        try:
            run = subprocess.run([args.python, "-c", VLLM_SIDE, json.dumps(job)],
                                 capture_output=True, text=True, timeout=900, env=env)
        except subprocess.TimeoutExpired:
            report["vllm"] = {"ok": False, "answered": "no answer within 900 s"}
            print(json.dumps(report, indent=2))
            return report
        line = next((x for x in run.stdout.splitlines() if x.startswith("PATHS ")), None)
        if run.returncode != 0 or line is None:
            lines = (run.stdout + "\n" + run.stderr).splitlines()  # vLLM's workers log to either
            errors = list(dict.fromkeys(x.split("] ", 1)[-1] for x in lines if "Error: " in x))
            report["vllm"] = {"ok": False, "returncode": run.returncode, "errors": errors[:6],
                              "answered": "\n".join(run.stderr.strip().splitlines()[-6:])}
            print(json.dumps(report, indent=2))
            return report
        paths = json.loads(line[len("PATHS "):])
        generated = json.loads(next(x for x in run.stdout.splitlines() if x.startswith("GENERATED "))[10:])
        report["vllm"] = {"ok": True, "paths": [p is not None for p in paths]}
        rows = []
        for ids, path, gen_ids in zip(prompts, paths, generated):
            if path is None:
                rows.append({"error": "no hidden_states_path in kv_transfer_params"})
                continue
            saved = load_file(path)
            hs = saved["hidden_states"].float()
            # the states of every token that went through a forward: the prompt's, then the generated ones but the
            # last (never an input)
            fed = ids + gen_ids[:-1] if args.max_tokens > 1 else ids
            x = torch.tensor([fed])
            with torch.no_grad():
                aux, h = target_aux_features(target, x, torch.ones_like(x), layers)  # [1, T, 3H], [1, T, H]
                h_theirs = target.model.norm(hs[:, -1])  # vLLM's last stream through the target's final norm
                greedy = target.generate(torch.tensor([ids]), max_new_tokens=len(gen_ids), do_sample=False,
                                         attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):]
            ours = aux[0].reshape(len(fed), len(layers), -1)
            row = {"saved": {k: list(v.shape) for k, v in saved.items()},
                   "greedy_equal_hf": greedy.tolist() == gen_ids}
            theirs = hs[:, :len(layers)]
            n = min(theirs.shape[0], ours.shape[0])
            saved_ids = saved.get("token_ids")
            if saved_ids is not None and saved_ids.flatten().tolist() != fed:
                row["error"] = "vLLM's saved token_ids are not the prompt's and the generated ones"
            elif theirs.shape[0] < len(fed):
                row["error"] = f"vLLM saved {theirs.shape[0]} positions for {len(fed)} tokens fed"
            elif theirs.shape[1:] != ours.shape[1:]:
                row["error"] = f"shapes differ: vLLM {list(theirs.shape)}, draftsmith {list(ours.shape)}"
            else:
                diff = (theirs[:n] - ours[:n]).abs()
                row["max_abs_diff_per_layer"] = [round(float(d), 6) for d in diff.amax(dim=(0, 2))]
                # per token, |vLLM - HF| / |HF| (L2 over the hidden size); the largest over the tokens
                rel = (theirs[:n] - ours[:n]).norm(dim=-1) / ours[:n].norm(dim=-1).clamp_min(1e-6)  # [n, 3]
                row["max_rel_l2_per_layer"] = [float(f"{float(d):.3g}") for d in rel.amax(dim=0)]
                rel_h = (h_theirs[:n] - h[0, :n]).norm(dim=-1) / h[0, :n].norm(dim=-1).clamp_min(1e-6)
                row["final_features_max_rel_l2"] = float(f"{float(rel_h.max()):.3g}")
                row["final_features_argmax_equal"] = bool(torch.equal(target.lm_head(h_theirs[:n]).argmax(-1),
                                                                      target.lm_head(h[0, :n]).argmax(-1)))
                row["tokens_compared"] = n
            rows.append(row)
        report["rows"] = rows
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
