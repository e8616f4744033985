"""The pipeline's structured config: dataclasses are the schema, ``conf/`` YAML is the surface.

Registered in Hydra's ConfigStore as ``draftsmith_schema`` and used as the primary config's
first default, so a typo (``eval.kk=4``) or a wrong type (``eval.k=[a]``) fails at start-up with
Hydra's one-line error naming the key; :func:`validate` adds the value checks (ranges, choices,
required inputs) with the same one-line style. omegaconf 2.3 rejects ``typing.Literal``, so
choices are ``str`` plus a check here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

STAGES = ("datagen", "train", "eval", "promote")
DEMO = "demo"  # pair.target / pair.draft / data.prompts value meaning "the embedded demo"


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and says what to do."""


def required_message(keys: list[str], hint: str) -> str:
    """'a, b are required but not set: add a=... b=... <hint>' (config validation and the CLI)."""
    return (f"{', '.join(keys)} {'is' if len(keys) == 1 else 'are'} required but not set: add "
            + " ".join(f"{key}=..." for key in keys) + f" {hint}")


@dataclass
class PairConfig:
    target: str = DEMO  # local dir or hub id; "demo" = the embedded demo target
    draft: str = DEMO  # the base draft to distill (and compare against); "demo" = the demo base draft
    dtype: str = "float32"  # float32 | bfloat16 | float16 (eval and datagen; training has its own precision)
    device: str = "cpu"  # cpu | cuda | cuda:N


@dataclass
class DataConfig:
    prompts: str = DEMO  # .jsonl / .parquet / folder / HF dataset id; "demo" = demo domain prompts
    field: str = "prompt"
    messages_field: str = "messages"
    split: str = "train"
    max_prompts: Optional[int] = None
    max_prompt_tokens: int = 512
    heldout_fraction: float = 0.1
    max_new_tokens: int = 64  # target completion length in datagen
    temperature: float = 0.0  # 0 = greedy completions
    top_p: float = 1.0
    n_completions: int = 1
    top_k_logprobs: int = 32  # > 0 keeps the target's top-k log-probs (needed by method.teacher=cached)
    batch_size: int = 32
    demo_prompts: int = 480  # number of demo domain prompts (data.prompts=demo only)
    cache_dir: Optional[str] = None  # share datagen outputs between runs (sweeps: <sweep dir>/.datagen by default)
    seed: int = 0


@dataclass
class MethodConfig:
    name: str = "kd"  # a label for reports: kd | lora | seq-kd | on-policy | ...
    method: str = "full"  # full | lora
    loss: str = "fkl"  # ce | fkl | rkl | jsd | tvd
    beta: float = 0.5
    teacher: str = "cached"  # cached (datagen's top-k log-probs) | online (target forward per batch)
    cached_tail: str = "uniform"  # cached teacher's tail mass: uniform (spread) | bucket (one bucket)
    on_policy_fraction: float = 0.0
    on_policy_max_new_tokens: int = 32
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: Any = "all-linear"
    steps: int = 400
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 3e-3
    warmup_steps: int = 15
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_len: Optional[int] = None
    mixed_precision: str = "auto"
    eval_every: int = 100
    eval_rows: int = 64
    save_every: int = 100
    keep_checkpoints: int = 2
    seed: int = 0
    device: str = "auto"


@dataclass
class DecodeConfig:
    """How eval decodes: the sampling knobs of the temperature > 0 cells (target and draft alike) and
    the cached-forward backend of both loops (decode/lean.py)."""

    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    backend: str = "auto"  # cached forward of the decode loops: auto (lean where it covers the model), lean, hf


@dataclass
class EvalSection:
    k: list[int] = field(default_factory=lambda: [2, 4])
    temperature: list[float] = field(default_factory=lambda: [0.0])
    max_new_tokens: int = 64
    max_prompts: int = 8
    warmup: int = 1
    hf_ab: bool = False  # also time HF assisted generation (greedy cells)
    cost_repeats: int = 5
    compare_base: bool = True  # evaluate pair.draft beside the trained draft
    compare_production: bool = True  # evaluate the registry's production draft too (champion gate)


@dataclass
class PromoteConfig:
    name: str = "draft"  # registry entry name
    alias: str = "production"  # alias moved to a promoted version
    min_acceptance_rate: float = 0.5
    min_speedup: float = 1.1
    require_greedy_match: bool = True
    champion_margin: float = 0.02

    def gates(self):
        """The eval.gates.Gates of these thresholds (raises ValueError naming the promote.* key)."""
        from eval.gates import Gates

        return Gates(min_acceptance_rate=self.min_acceptance_rate, min_speedup=self.min_speedup,
                     require_greedy_match=self.require_greedy_match, champion_margin=self.champion_margin)


@dataclass
class RegistryConfig:
    kind: str = "local"  # local | wandb (wandb mirrors the local registry to W&B Registry)
    root: str = "registry"
    lock_timeout_s: float = 600.0
    collection: str = "draftsmith-drafts"  # W&B: wandb-registry-model/<collection>


@dataclass
class TrackingConfig:
    kind: str = "none"  # none | wandb
    project: str = "draftsmith"
    entity: Optional[str] = None
    mode: Optional[str] = None  # online | offline | disabled; None = $WANDB_MODE, else online
    group: Optional[str] = None  # default: the run's out_dir name (sweeps: the sweep dir name)
    dir: Optional[str] = None  # where wandb writes its run dirs; default out_dir


@dataclass
class DemoConfig:
    preset: str = "default"  # default | tiny (a seconds-long demo pair for tests)


@dataclass
class DraftsmithConfig:
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    out_dir: Optional[str] = None  # None: Hydra's run dir (runs/<name>), or the job's dir in a sweep
    name: str = "demo"  # names the run dir and the W&B group
    force: bool = False  # re-run stages even when their output matches the config
    pair: PairConfig = field(default_factory=PairConfig)
    data: DataConfig = field(default_factory=DataConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalSection = field(default_factory=EvalSection)
    promote: PromoteConfig = field(default_factory=PromoteConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)


def register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="draftsmith_schema", node=DraftsmithConfig)


def _choice(key: str, value, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not one of {list(choices)}")


def validate(cfg: DraftsmithConfig) -> None:
    """Value checks the types cannot express; raises ConfigError naming the key."""
    if not cfg.stages:
        raise ConfigError("stages is empty: give a subset of [datagen,train,eval,promote]")
    for stage in cfg.stages:
        _choice("stages", stage, STAGES)
    if len(set(cfg.stages)) != len(cfg.stages):
        raise ConfigError(f"stages={list(cfg.stages)} lists a stage twice")
    if cfg.out_dir == "":
        raise ConfigError("out_dir is empty: give a directory for the stage outputs (or leave it unset)")
    missing = [f"pair.{key}" for key in ("target", "draft") if not getattr(cfg.pair, key)]
    if not cfg.data.prompts and {"datagen"} & set(cfg.stages):
        missing.append("data.prompts")
    if missing:
        raise ConfigError(required_message(missing, "(a local path or a hub id)"))
    if cfg.pair.target != DEMO and cfg.pair.draft == DEMO:
        raise ConfigError("pair.draft=demo only works with pair.target=demo: give pair.draft=PATH_OR_ID for your target")
    if cfg.data.prompts == DEMO and cfg.pair.target != DEMO:
        raise ConfigError("data.prompts=demo only works with pair.target=demo: give data.prompts=FILE.jsonl "
                          "(or .parquet, a folder, a HF dataset id) for your target")
    _choice("pair.dtype", cfg.pair.dtype, ("float32", "bfloat16", "float16"))
    _choice("decode.backend", cfg.decode.backend, ("auto", "lean", "hf"))
    _choice("method.method", cfg.method.method, ("full", "lora"))
    _choice("method.loss", cfg.method.loss, ("ce", "fkl", "rkl", "jsd", "tvd"))
    _choice("method.teacher", cfg.method.teacher, ("cached", "online"))
    _choice("method.cached_tail", cfg.method.cached_tail, ("uniform", "bucket"))
    if cfg.method.teacher == "cached" and cfg.method.loss != "ce" and cfg.data.top_k_logprobs < 1:
        raise ConfigError(f"method.teacher=cached with method.loss={cfg.method.loss} needs the target's log-probs: "
                          "set data.top_k_logprobs > 0 (e.g. 32) or method.teacher=online")
    if not 0.0 <= cfg.method.on_policy_fraction <= 1.0:
        raise ConfigError(f"method.on_policy_fraction must be in [0, 1], got {cfg.method.on_policy_fraction}")
    if cfg.method.steps < 1:
        raise ConfigError(f"method.steps must be >= 1, got {cfg.method.steps}")
    if not cfg.eval.k or any(k < 1 for k in cfg.eval.k):
        raise ConfigError(f"eval.k must be a non-empty list of integers >= 1, got {list(cfg.eval.k)}")
    if not cfg.eval.temperature or any(t < 0 for t in cfg.eval.temperature):
        raise ConfigError(f"eval.temperature must be a non-empty list of values >= 0, got {list(cfg.eval.temperature)}")
    if not 0.0 < cfg.data.heldout_fraction < 1.0 and ("eval" in cfg.stages):
        raise ConfigError(f"data.heldout_fraction must be in (0, 1) for the eval stage, got {cfg.data.heldout_fraction}")
    cfg.promote.gates()  # raises naming the key
    _choice("demo.preset", cfg.demo.preset, ("default", "tiny"))
    _choice("registry.kind", cfg.registry.kind, ("local", "wandb"))
    _choice("tracking.kind", cfg.tracking.kind, ("none", "wandb"))
    if cfg.tracking.mode is not None:
        _choice("tracking.mode", cfg.tracking.mode, ("online", "offline", "disabled"))
