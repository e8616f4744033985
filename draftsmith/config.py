"""The pipeline's structured config: dataclasses are the schema, ``conf/`` YAML is the surface.

Registered in Hydra's ConfigStore as ``draftsmith_schema`` and used as the primary config's
first default, so a typo (``eval.kk=4``) or a wrong type (``eval.k=[a]``) fails at start-up with
Hydra's one-line error naming the key; :func:`validate` adds the value checks (ranges, choices,
required inputs) with the same one-line style. omegaconf 2.3 rejects ``typing.Literal``, so
choices are ``str`` plus a check here.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Optional

from draftsmith.decode.errors import ConfigError, check, check_choice
from draftsmith.eval.gates import Gates
from draftsmith.eval.settings import DecodeSettings, EvalSettings, ServingSettings
from draftsmith.train.settings import DatagenSettings, TrainSettings

__all__ = ["ConfigError", "DraftsmithConfig", "STAGES", "DEMO", "register_schema", "validate"]

STAGES = ("datagen", "train", "eval", "promote")
DEMO = "demo"  # pair.target / pair.draft / data.prompts value meaning "the embedded demo"


def required_message(keys: list[str], hint: str) -> str:
    """'a, b are required but not set: add a=... b=... <hint>' (config validation and the CLI)."""
    return (f"{', '.join(keys)} {'is' if len(keys) == 1 else 'are'} required but not set: add "
            + " ".join(f"{key}=..." for key in keys) + f" {hint}")


@dataclass
class PairConfig:
    target: str = DEMO  # local dir, hub id, .gguf file or package:MODULE/FILE; "demo" = the embedded demo target
    draft: str = DEMO  # the base draft to distill (and compare against); "demo" = the demo base draft
    draft_layers: Optional[int] = None  # instead of pair.draft: the target's first N layers (+ embedding, head)
    dtype: str = "float32"  # float32 | bfloat16 | float16 (eval and datagen; training has its own precision)
    device: str = "cpu"  # cpu | cuda | cuda:N | mps

    def __post_init__(self):
        check_choice("pair.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        if self.draft_layers is not None:
            check(self.draft_layers >= 1, f"pair.draft_layers must be >= 1 (decoder layers of the target to keep), "
                                          f"got {self.draft_layers}")
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
    cache_dir: Optional[str] = None  # share datagen outputs between runs (sweeps: <sweep dir>/.datagen by default)


@dataclass(kw_only=True)
class EvalSection(EvalSettings):
    """``eval.*``: the eval settings (eval/settings.py) plus which drafts the pipeline compares."""

    compare_base: bool = True  # evaluate pair.draft beside the trained draft
    compare_production: bool = True  # evaluate the registry's production draft too (champion gate)
    serving: ServingSettings = field(default_factory=ServingSettings)  # the serving A/B on vLLM (eval/serving.py)


@dataclass(kw_only=True)
class PromoteConfig(Gates):
    """``promote.*``: the registry entry and alias, and the gates (eval/gates.py) a candidate must clear."""

    name: str = "draft"  # registry entry name
    alias: str = "production"  # alias moved to a promoted version
    serving_concurrency: Optional[int] = None  # the concurrency served at: gates and K from the serving A/B there

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
    lock_timeout_s: float = 600.0
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
    name: str = "demo"  # names the run dir and the W&B group
    force: bool = False  # re-run stages even when their output matches the config
    pair: PairConfig = field(default_factory=PairConfig)
    data: DataSection = field(default_factory=DataSection)
    method: TrainSettings = field(default_factory=TrainSettings)
    decode: DecodeSettings = field(default_factory=DecodeSettings)
    eval: EvalSection = field(default_factory=EvalSection)
    promote: PromoteConfig = field(default_factory=PromoteConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)


def register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="draftsmith_schema", node=DraftsmithConfig)


def validate(cfg: DraftsmithConfig) -> None:
    """Checks across sections that no one section can make; raises ConfigError naming the key.

    Each section checks its own values in ``__post_init__`` when the config is built
    (``OmegaConf.to_object``); the start-up checks that need files, devices or the registry are in
    :mod:`draftsmith.preflight`.
    """
    if not cfg.stages:
        raise ConfigError("stages is empty: give a subset of [datagen,train,eval,promote]")
    for stage in cfg.stages:
        check_choice("stages", stage, STAGES)
    if len(set(cfg.stages)) != len(cfg.stages):
        raise ConfigError(f"stages={list(cfg.stages)} lists a stage twice")
    if cfg.out_dir == "":
        raise ConfigError("out_dir is empty: give a directory for the stage outputs (or leave it unset)")
    missing = [f"pair.{key}" for key in ("target", "draft") if not getattr(cfg.pair, key)
               and not (key == "draft" and cfg.pair.draft_layers)]
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
            and cfg.data.top_k_logprobs < 1:
        raise ConfigError(f"method.teacher=cached with method.loss={cfg.method.loss} needs the target's log-probs: "
                          "set data.top_k_logprobs > 0 (e.g. 32) or method.teacher=online")
    from draftsmith.demo import PRESETS

    check_choice("demo.preset", cfg.demo.preset, tuple(PRESETS))
    if "eval" in cfg.stages and not 0.0 < cfg.data.heldout_fraction < 1.0:
        raise ConfigError(f"data.heldout_fraction must be in (0, 1) for the eval stage, got {cfg.data.heldout_fraction}")
