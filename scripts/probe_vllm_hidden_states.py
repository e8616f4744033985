"""Can datagen take an EAGLE-3 head's features from vLLM instead of an HF forward? (issue 40 item 7)

vLLM (0.32) extracts a target's hidden states with the ``extract_hidden_states`` speculative method and a KV
connector that writes them to safetensors files (``ExampleHiddenStatesConnector``), the path speculators' data
generation takes. This probe runs that on `--target` for a few prompts (their token ids, one generated token) in
the vLLM interpreter (`--python`), then compares what vLLM wrote with draftsmith's own teacher-forced features of
the same ids (decode/eagle3.py ``target_aux_features``: the residual stream entering each of `--layers`): per
layer, the largest absolute and relative difference. Prints JSON: what vLLM answered (the error, when it refused
or failed), the tensors' shapes, and the differences.

    python scripts/probe_vllm_hidden_states.py --target TARGET_DIR --python .venv-vllm/bin/python
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
          speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                              "draft_model_config": {
                                  "hf_config": {"eagle_aux_hidden_state_layer_ids": args["layers"]}}},
          kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                              "kv_connector_extra_config": {"shared_storage_path": args["out"]}})
outs = llm.generate([{"prompt_token_ids": ids} for ids in args["prompts"]], SamplingParams(max_tokens=1, temperature=0))
paths = [(o.kv_transfer_params or {}).get("hidden_states_path") for o in outs]
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
    report: dict = {"target": args.target, "layers": layers, "prompts": args.prompts, "length": args.length}
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}  # CPU: GiB
        try:
            run = subprocess.run([args.python, "-c", VLLM_SIDE, json.dumps({"target": args.target, "layers": layers,
                                                                              "prompts": prompts, "out": out})],
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
        report["vllm"] = {"ok": True, "paths": [p is not None for p in paths]}
        rows = []
        for ids, path in zip(prompts, paths):
            if path is None:
                rows.append({"error": "no hidden_states_path in kv_transfer_params"})
                continue
            saved = load_file(path)
            hs = saved["hidden_states"].float()
            x = torch.tensor([ids])
            with torch.no_grad():
                aux, _ = target_aux_features(target, x, torch.ones_like(x), layers)  # [1, T, 3H]
            ours = aux[0].reshape(len(ids), len(layers), -1)
            row = {"saved": {k: list(v.shape) for k, v in saved.items()}}
            theirs = hs.reshape(hs.shape[0], len(layers), -1) if hs.dim() == 2 else hs
            n = min(theirs.shape[0], ours.shape[0])
            saved_ids = saved.get("token_ids")
            if saved_ids is not None and saved_ids.flatten()[:len(ids)].tolist() != ids:
                row["error"] = "vLLM's saved token_ids are not the prompt's"
            elif theirs.shape[0] < len(ids):
                row["error"] = f"vLLM saved {theirs.shape[0]} positions for a prompt of {len(ids)}"
            elif theirs.shape[1:] != ours.shape[1:]:
                row["error"] = f"shapes differ: vLLM {list(theirs.shape)}, draftsmith {list(ours.shape)}"
            else:
                diff = (theirs[:n] - ours[:n]).abs()
                scale = ours[:n].abs().amax(dim=(0, 2)).clamp_min(1e-6)
                row["max_abs_diff_per_layer"] = [round(float(d), 6) for d in diff.amax(dim=(0, 2))]
                row["max_rel_diff_per_layer"] = [round(float(d), 6) for d in diff.amax(dim=(0, 2)) / scale]
                row["tokens_compared"] = n
            rows.append(row)
        report["rows"] = rows
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
