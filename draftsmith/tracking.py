"""W&B tracking for the pipeline: one run per stage, grouped by pipeline run or sweep.

Stage packages never import wandb; this module logs what they return. Every W&B call is guarded:
a W&B failure prints one warning and the stage carries on, so local outputs are never lost to a
tracking problem. Each stage's run is opened and finished in a ``with`` block, so that Hydra's
basic launcher (all sweep jobs in one process) never leaks a run into the next job.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from draftsmith.artifacts.formats import EvalMetrics
from draftsmith.config import TrackingConfig


def wandb_mode(mode: str | None) -> str:
    """The W&B mode to run in: `mode` (tracking.mode), else $WANDB_MODE, else online."""
    return mode or os.environ.get("WANDB_MODE") or "online"


def _warn(what: str, exc: BaseException) -> None:
    print(f"draftsmith: W&B {what} failed ({type(exc).__name__}: {exc}); local outputs are unaffected",
          file=sys.stderr)


class StageRun:
    """The W&B run of one stage, or a no-op when tracking is off or W&B failed to start."""

    def __init__(self, run=None):
        self.run = run

    def log(self, data: dict, step: int | None = None) -> None:
        if self.run is None:
            return
        try:
            self.run.log(data, step=step)
        except Exception as exc:  # noqa: BLE001 - tracking must never break a stage
            _warn("log", exc)

    def summary(self, data: dict) -> None:
        if self.run is None:
            return
        try:
            self.run.summary.update(data)
        except Exception as exc:  # noqa: BLE001
            _warn("summary", exc)


class Tracker:
    """Opens one W&B run per stage (``job_type`` = stage) in the pipeline's group."""

    def __init__(self, cfg: TrackingConfig, config: dict, out_dir: Path, group: str):
        self.cfg = cfg
        self.config = config
        self.group = cfg.group or group
        self.dir = Path(cfg.dir or out_dir)
        self.enabled = cfg.kind == "wandb"

    def resolved(self, key: str, value) -> None:
        """Record setting `key` ("data.engine") as start-up resolved it (auto -> vllm), as the stages hash it: the
        runs' config then says what ran."""
        *path, last = key.split(".")
        node = self.config
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value

    def init_kwargs(self, stage: str) -> dict:
        return {"project": self.cfg.project, "entity": self.cfg.entity, "group": self.group, "job_type": stage,
                "name": f"{self.group}-{stage}", "config": self.config, "dir": str(self.dir), "mode": wandb_mode(self.cfg.mode),
                "reinit": "create_new"}

    @contextlib.contextmanager
    def stage(self, stage: str):
        """``with tracker.stage("eval") as run:`` - a StageRun, finished when the block ends."""
        if not self.enabled:
            yield StageRun()
            return
        run = None
        try:
            import wandb

            self.dir.mkdir(parents=True, exist_ok=True)
            run = wandb.init(**self.init_kwargs(stage))
        except Exception as exc:  # noqa: BLE001
            _warn(f"init of the {stage} run", exc)
        try:
            yield StageRun(run)
        finally:
            if run is not None:
                try:
                    run.finish()
                except Exception as exc:  # noqa: BLE001
                    _warn(f"finish of the {stage} run", exc)

    def train_kwargs(self) -> dict:
        """TrainConfig fields that make the trainer log through accelerate's W&B tracker as this
        group's ``train`` run (accelerate opens and finishes that run itself)."""
        if not self.enabled:
            return {}
        kwargs = self.init_kwargs("train")
        project = kwargs.pop("project")
        kwargs["config"] = {"pipeline": self.config}  # accelerate adds the TrainConfig
        kwargs.pop("reinit")  # accelerate's tracker updates the global wandb.config: it needs the global run
        return {"log_with": "wandb", "tracker_project": project, "tracker_init": {"wandb": kwargs}}


def is_tracking_error(exc: BaseException) -> bool:
    """Whether an exception was raised inside W&B or accelerate's tracker code."""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if "/wandb/" in name or name.endswith("accelerate/tracking.py"):
            return True
        tb = tb.tb_next
    return False


def log_eval(run: StageRun, metrics: EvalMetrics) -> None:
    """Eval metrics: summary per draft, the K table as a wandb.Table, per-position acceptance bars."""
    if run.run is None:
        return
    try:
        import wandb

        flat = {f"eval/{draft}/{key}": value for draft, summary in metrics.summary.items()
                for key, value in summary.items() if isinstance(value, (int, float))}
        for draft, summary in metrics.summary.items():  # the intervals as two numbers each, which W&B can chart
            for key in ("speedup_ci95", "token_acceptance_ci95"):
                if summary.get(key):
                    flat[f"eval/{draft}/{key}_lo"], flat[f"eval/{draft}/{key}_hi"] = summary[key]
        columns = ["draft", "k", "temperature", "acceptance_rate", "token_acceptance", "token_acceptance_ci95_lo",
                   "token_acceptance_ci95_hi", "mean_accepted_tokens", "speedup", "speedup_ci95_lo", "speedup_ci95_hi",
                   "repeats", "predicted_speedup", "greedy_match"]

        def value(record: dict, column: str):
            if column.endswith(("_ci95_lo", "_ci95_hi")):
                ci = record.get(column[:-3])
                return None if ci is None else ci[0 if column.endswith("lo") else 1]
            return record.get(column)

        table = wandb.Table(columns=columns, data=[[value(r, c) for c in columns] for r in metrics.records])
        charts = {"eval/k_table": table}
        for draft in metrics.summary:
            best = metrics.chosen_record(draft)
            bars = wandb.Table(columns=["position", "acceptance"],
                               data=[[i + 1, a] for i, a in enumerate(best["per_position_acceptance"])])
            charts[f"eval/{draft}/per_position_acceptance"] = wandb.plot.bar(
                bars, "position", "acceptance", title=f"{draft}: acceptance per draft position (K={best['k']})")
        run.log({**flat, **charts})
        run.summary(flat)
    except Exception as exc:  # noqa: BLE001
        _warn("eval logging", exc)


def model_artifact(version_dir: Path, name: str, metadata: dict):
    """A W&B ``model`` artifact of a registry version: its merged ``draft/`` (none for a training-free method) and
    ``speculative_config.json``."""
    import wandb

    artifact = wandb.Artifact(name=name, type="model", metadata=metadata)
    if (version_dir / "draft").is_dir():
        artifact.add_dir(str(version_dir / "draft"), name="draft")
    artifact.add_file(str(version_dir / "speculative_config.json"))
    return artifact


def log_draft_artifact(run: StageRun, version_dir: Path, name: str, summary: dict) -> None:
    """The promoted registry version as a W&B ``model`` artifact of the promote run (no registry link;
    ``registry=wandb`` links it)."""
    if run.run is None:
        return
    try:
        run.run.log_artifact(model_artifact(version_dir, name, summary))
    except Exception as exc:  # noqa: BLE001
        _warn("artifact logging", exc)
