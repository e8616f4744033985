"""The ``draftsmith`` command: a Hydra app running the pipeline's stages (see conf/config.yaml).

    draftsmith                                   # the whole pipeline on the embedded demo pair
    draftsmith stages=[eval] eval.k=[2,4,6]      # one stage with another K grid
    draftsmith -m method.loss=fkl,tvd            # a sweep (Hydra multirun)
    draftsmith --cfg job                         # print the composed config and exit
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from draftsmith.config import ConfigError, DraftsmithConfig, register_schema, required_message, validate

register_schema()


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors whose message already says what is wrong and what to do: printed as one line."""
    from decode.pair import PairError
    from draftsmith.registry import RegistryError
    from train.prompts import PromptError
    from train.trainer import TrainingError

    return (ConfigError, PairError, PromptError, RegistryError, TrainingError, FileNotFoundError, ValueError)


def _fail(message: str) -> None:
    print(f"draftsmith: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def run(cfg: DictConfig) -> dict:
    """Validate `cfg`, run the pipeline, print the summary table; returns the summary."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from draftsmith.pipeline import Pipeline, format_summary

    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        _fail(required_message(missing, "to the command line"))
    obj: DraftsmithConfig = OmegaConf.to_object(cfg)
    try:
        validate(obj)
    except (ConfigError, ValueError) as exc:
        _fail(str(exc))
    hydra_cfg = HydraConfig.get()
    out_dir = Path(obj.out_dir or hydra_cfg.runtime.output_dir)
    # the jobs of a sweep share one datagen output per datagen config (most sweeps vary method/eval)
    shared = str(Path(hydra_cfg.sweep.dir) / ".datagen") if hydra_cfg.mode == RunMode.MULTIRUN else None
    resolved = OmegaConf.to_container(cfg, resolve=True)
    try:
        summary = Pipeline(obj, out_dir, config_dict=resolved, datagen_cache=shared).run()
    except _user_errors() as exc:
        if os.environ.get("DRAFTSMITH_DEBUG"):
            raise
        _fail(f"{exc} (set DRAFTSMITH_DEBUG=1 for the traceback)")
    print(format_summary(summary))
    return summary


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
