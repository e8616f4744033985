"""The ``draftsmith`` command: a Hydra app running the pipeline's stages (see conf/config.yaml).

    draftsmith                                   # the whole pipeline on the embedded demo pair
    draftsmith stages=[eval] eval.k=[2,4,6]      # one stage with another K grid
    draftsmith -m method.loss=fkl,tvd            # a sweep (Hydra multirun)
    draftsmith --cfg job                         # print the composed config and exit
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import hydra
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from draftsmith.artifacts.errors import UserError
from draftsmith.config import (DraftsmithConfig, register_schema, renamed_key, renamed_key_message, required_message,
                               validate)

register_schema()


def _fail(message: str) -> None:
    print(f"draftsmith: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _bug(exc: BaseException) -> None:
    traceback.print_exception(exc)
    print(f"draftsmith: internal error: {type(exc).__name__}: {exc}\nThis is a bug in draftsmith (or in a library it "
          "calls), not a problem with your settings: please report it with the traceback above.", file=sys.stderr)
    raise SystemExit(1)


def run(cfg: DictConfig) -> dict:
    """Build and check `cfg`, run the pipeline, print the summary table; returns the summary.

    A :class:`draftsmith.artifacts.errors.UserError` (bad settings or inputs: the message names the key or file)
    prints as one line and exits 2; anything else is a bug: its traceback is printed (exit 1).
    ``DRAFTSMITH_DEBUG=1`` re-raises user errors too, for their traceback.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from draftsmith.artifacts.progress import quiet_library_bars

    quiet_library_bars()  # non-interactive logs (CI, SLURM, > log): no library progress bars
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        _fail(required_message(missing, "to the command line"))
    try:
        obj: DraftsmithConfig = OmegaConf.to_object(cfg)  # each section checks its values here
        validate(obj)
        hydra_cfg = HydraConfig.get()
        out_dir = Path(obj.out_dir or hydra_cfg.runtime.output_dir)
        # the jobs of a sweep share one datagen output per datagen config (most sweeps vary method/eval)
        shared = str(Path(hydra_cfg.sweep.dir) / ".datagen") if hydra_cfg.mode == RunMode.MULTIRUN else None
        resolved = OmegaConf.to_container(cfg, resolve=True)
        from draftsmith.pipeline import Pipeline
        from draftsmith.summary import format_summary
        from draftsmith.preflight import preflight

        pipeline = Pipeline(obj, out_dir, config_dict=resolved, datagen_cache=shared)
        preflight(pipeline)
        summary = pipeline.run()
    except UserError as exc:
        if os.environ.get("DRAFTSMITH_DEBUG"):
            raise
        _fail(f"{exc} (set DRAFTSMITH_DEBUG=1 for the traceback)")
    except KeyboardInterrupt:
        print("draftsmith: interrupted: finished stages keep their outputs, the interrupted one left its previous "
              "output in place (training resumes from its last checkpoint); run the same command to go on",
              file=sys.stderr)
        raise SystemExit(130)
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 - everything else is a bug: say so, with the traceback
        _bug(exc)
    print(format_summary(summary))
    return summary


@hydra.main(version_base="1.3", config_path="pkg://draftsmith.conf", config_name="config")
def _app(cfg: DictConfig) -> None:
    run(cfg)


def main() -> None:
    """The console script (and ``python -m draftsmith``): a renamed key fails in one line naming its new name,
    before Hydra's "Key not in" error about the old one: on the command line, and in a config file (a preset of
    the user's that still writes ``method: lora`` in its method section)."""
    message = renamed_key_message(sys.argv[1:])
    if message:
        _fail(message)
    if os.environ.get("HYDRA_FULL_ERROR"):  # the user asked for Hydra's own reports
        _app()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises its composition errors to us instead of printing them
    try:
        _app()
    except CompactHydraException as exc:
        _composition_failed(exc)
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)


def _composition_failed(exc: Exception) -> None:
    """A config file names a renamed key: one line; any other composition error: Hydra's own short report."""
    import re

    from omegaconf.errors import ConfigKeyError

    cause = exc.__cause__ or exc.__context__
    renamed = renamed_key(cause.full_key) if isinstance(cause, ConfigKeyError) and cause.full_key else None
    if renamed:
        where = re.match(r"In '([^']+)'", str(exc))
        new, what = renamed
        _fail(f"{'in the config ' + where.group(1) + '.yaml: ' if where else ''}{cause.full_key} is now {new}: "
              f"change that file ({what})")
    from omegaconf.errors import OmegaConfBaseException

    print(str(exc), file=sys.stderr)  # what Hydra prints for it (hydra/_internal/utils.py run_and_report)
    if isinstance(exc.__cause__, OmegaConfBaseException):
        print(str(exc.__cause__), file=sys.stderr)
    print("\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", file=sys.stderr)
    raise SystemExit(1)


if __name__ == "__main__":
    main()
