"""The promote stage: apply the gates to the eval summary and register a passing draft.

The candidate is the ``trained`` draft of the eval (the base draft when nothing was trained). The
champion is the registry's current production draft *measured in the same eval* (the pipeline adds
it to the eval's drafts); a production draft with no measurement on this eval set cannot be beaten
and the candidate is rejected with that reason. Registering a draft that already is the production
version is not a new version: the decision says so and promotes nothing new.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from draftsmith.config import DraftsmithConfig
from draftsmith.registry import LocalRegistry, fingerprint
from eval.gates import decide
from eval.runner import load_metrics


def promote(cfg: DraftsmithConfig, out_dir: Path, registry: LocalRegistry, run=None) -> dict:
    """Decide and (when the gates pass) register; returns the promotion record (promotion.json)."""
    metrics = load_metrics(out_dir / "eval" / "metrics.json")
    summary = metrics["summary"]
    name = "trained" if "trained" in summary else "base"
    if name not in summary:
        raise ValueError(f"{out_dir / 'eval' / 'metrics.json'} has no 'trained' or 'base' draft in its summary; "
                         "re-run eval")
    draft_dir = Path(metrics["config"]["drafts"][name])
    if not (draft_dir / "config.json").exists():
        raise FileNotFoundError(f"the evaluated draft {draft_dir} is gone (no config.json); re-run train and eval")
    p = cfg.promote
    gates = p.gates()
    production = registry.find(p.name, p.alias)
    candidate_fp = fingerprint(draft_dir)
    base = {"name": p.name, "candidate_draft": str(draft_dir), "candidate_name": name,
            "eval_set": metrics.get("eval_set"), "registry": None}

    if production is not None and production["fingerprint"] == candidate_fp:
        record = decide(summary[name], gates, None)
        record.update(base, promote=True, reasons=[f"already {p.alias}: v{production['version']} of {p.name!r} is "
                                                   "this draft; no new version"])
        record["registry"] = _registry_info(registry, p.name, production["version"])
        return record

    champion = summary.get("production") if production is not None else None
    record = decide(summary[name], gates, champion)
    record.update(base)
    if production is not None and champion is None:
        failed = [] if record["promote"] else record["reasons"]  # a passing record's reason is "all gates passed"
        record["promote"] = False
        record["reasons"] = failed + [
            f"the {p.alias} draft v{production['version']} was not measured on this eval set, so the candidate cannot "
            "be compared with it: run eval with eval.compare_production=true"]
    if production is not None:
        record["champion_version"] = production["version"]
    if not record["promote"]:
        return record

    version = registry.register(p.name, draft_dir, metrics=metrics, promotion=record, k=summary[name]["best_k"],
                                aliases=[p.alias], source={"out_dir": str(out_dir), "config": asdict(cfg)})
    record["registry"] = _registry_info(registry, p.name, version["version"])
    record["registry"]["created"] = version["created"]
    if cfg.registry.kind == "wandb":
        from draftsmith.wandb_registry import link_model

        record["registry"]["wandb"] = link_model(
            run.run if run is not None else None, registry.path(p.name, version["version"]), p.name,
            cfg.registry.collection, [p.alias], summary[name], registry.root, project=cfg.tracking.project,
            mode=cfg.tracking.mode, wandb_dir=cfg.tracking.dir or str(out_dir))
    return record


def _registry_info(registry: LocalRegistry, name: str, number: int) -> dict:
    path = registry.path(name, number)
    return {"kind": "local", "root": str(registry.root), "name": name, "version": number, "path": str(path),
            "aliases": registry.aliases_of(name, number),
            "speculative_config": str(path / "speculative_config.json")}
