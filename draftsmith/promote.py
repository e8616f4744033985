"""The promote stage: apply the gates to the eval summary and register a passing draft.

The candidate is the ``trained`` draft of the eval (the base draft when nothing was trained). The
decision and the alias move are one step under the registry's lock (compare-and-set,
:meth:`LocalRegistry.transaction`), so the jobs of a sweep that promote at once into one registry
cannot each "beat" an empty or stale production. Inside the lock:

1. The current production draft is read. When it is the draft the eval measured (the pipeline adds
   it to the eval's drafts as ``production``; same fingerprint), the eval's measurement is the
   champion: "measured in this eval".
2. When production is another draft (another job promoted after this eval chose its drafts, or the
   eval did not measure production), the decision is taken again against the figures recorded with
   that version (version.json's summary, the one it was promoted on) if its metrics.json comes from
   the same eval set (equal ``eval_set`` ids: same target, prompts, K grid and decode settings):
   "recorded with vN on the same eval set". Otherwise the candidate is refused, saying why.
3. A name's versions belong to one target: when they are drafts for another target than the
   eval's, the candidate is refused (and ``LocalRegistry.register`` would refuse it too).
4. A passing candidate is registered and the alias moved before the lock is released (the W&B
   mirror is linked inside the lock as well, so its alias moves in the same order).

Registering a draft that already is the production version is not a new version. Besides the
gates' fields, promotion.json records ``compared_with`` ({version, speedup, source, eval_set} of
the production draft the decision was taken against, or None when there was none),
``decision_retaken`` (True when that production is not the draft the eval measured),
``eval_measured_production`` and ``target`` (the target's identity).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from draftsmith.config import DraftsmithConfig
from draftsmith.registry import LocalRegistry, RegistryTransaction, fingerprint, same_target, target_identity
from draftsmith.registry import RegistryError, target_mismatch
from eval.gates import decide
from eval.runner import load_metrics

MEASURED = "measured in this eval"


def promote(cfg: DraftsmithConfig, out_dir: Path, registry: LocalRegistry, run=None) -> dict:
    """Decide and (when the gates pass) register, atomically; returns the promotion record (promotion.json)."""
    metrics_path = Path(out_dir) / "eval" / "metrics.json"
    metrics = load_metrics(metrics_path)
    name, draft_dir = _candidate(metrics, metrics_path)
    p = cfg.promote
    gates = p.gates()
    # hashing and loading happen before the lock, so the locked section stays short
    candidate_fp = fingerprint(draft_dir)
    measured = _measured_production(metrics)
    target = target_identity(metrics["config"]["target"]) if metrics["config"].get("target") else None
    base = {"name": p.name, "candidate_draft": str(draft_dir), "candidate_name": name,
            "eval_set": metrics.get("eval_set"), "registry": None, "target": target}
    summary = metrics["summary"]

    with registry.transaction(p.name) as tx:
        production = tx.find(p.alias)
        if production is not None:
            measured = _with_version(measured, tx)
        base.update(eval_measured_production=measured, decision_retaken=False, compared_with=None)
        mismatch = target_mismatch(registry, p.name, target)
        if mismatch is not None:
            return _refuse(decide(summary[name], gates, None), base, mismatch, production)
        if production is not None and production["fingerprint"] == candidate_fp:
            record = decide(summary[name], gates, None)
            record.update(base, promote=True, reasons=[f"already {p.alias}: v{production['version']} of {p.name!r} "
                                                       "is this draft; no new version"])
            record["registry"] = _registry_info(registry, p.name, production["version"])
            return record

        champion, compared, refusal = _champion(tx, p.alias, production, measured, metrics)
        label = None if compared is None else f"{p.alias} v{compared['version']}"
        record = decide(summary[name], gates, champion, champion_label=label)
        record.update(base, compared_with=compared)
        if production is not None:
            record["champion_version"] = production["version"]
            record["decision_retaken"] = not _is_measured(production, measured)
            if record["decision_retaken"] and refusal is None:
                record["reasons"].append(_retaken_reason(p.alias, production, measured, compared))
            note = _unknown_target_note(p.alias, production, target)
            if note:
                record["reasons"].append(note)
        if refusal is not None:
            return _refuse(record, {}, refusal, production)
        if not record["promote"]:
            return record

        version = tx.register(draft_dir, metrics=metrics, promotion=record, k=summary[name]["best_k"],
                              aliases=[p.alias], source={"out_dir": str(out_dir), "config": asdict(cfg)},
                              target=target, draft_fingerprint=candidate_fp)
        record["registry"] = _registry_info(registry, p.name, version["version"])
        record["registry"]["created"] = version["created"]
        if cfg.registry.kind == "wandb":
            record["registry"]["wandb"] = _link_wandb(cfg, run, registry, version["version"], summary[name], out_dir)
    return record


def _candidate(metrics: dict, metrics_path: Path) -> tuple[str, Path]:
    """(summary name, draft dir) of the candidate: the trained draft, else the base draft."""
    summary = metrics["summary"]
    name = "trained" if "trained" in summary else "base"
    if name not in summary:
        raise RegistryError(f"{metrics_path} has no 'trained' or 'base' draft in its summary; re-run eval")
    draft_dir = Path(metrics["config"]["drafts"][name])
    if not (draft_dir / "config.json").exists():
        raise RegistryError(f"the evaluated draft {draft_dir} is gone (no config.json); re-run train and eval")
    return name, draft_dir


def _measured_production(metrics: dict) -> dict | None:
    """{"path", "fingerprint", "version": None} of the production draft this eval measured, or None."""
    path = metrics["config"].get("drafts", {}).get("production")
    if path is None or "production" not in metrics["summary"]:
        return None
    present = (Path(path) / "config.json").exists()
    return {"path": path, "fingerprint": fingerprint(path) if present else None, "version": None}


def _with_version(measured: dict | None, tx: RegistryTransaction) -> dict | None:
    """`measured` with the number of the registry version whose draft it is (None when none is)."""
    if measured is None or measured["fingerprint"] is None:
        return measured
    number = next((v["version"] for v in tx.versions() if v["fingerprint"] == measured["fingerprint"]), None)
    return {**measured, "version": number}


def _is_measured(production: dict, measured: dict | None) -> bool:
    return measured is not None and measured["fingerprint"] == production["fingerprint"]


def _champion(tx: RegistryTransaction, alias: str, production: dict | None, measured: dict | None,
              metrics: dict) -> tuple[dict | None, dict | None, str | None]:
    """(champion summary, compared_with, refusal reason) for the production draft read under the lock."""
    if production is None:
        return None, None, None
    number, eval_set = production["version"], metrics.get("eval_set")
    if _is_measured(production, measured):
        champion = metrics["summary"]["production"]
        return champion, _compared(number, champion, MEASURED, eval_set), None
    recorded, recorded_set = _recorded(tx, number)
    if recorded is not None and eval_set is not None and recorded_set == eval_set:
        return recorded, _compared(number, recorded, f"recorded with v{number} on the same eval set", eval_set), None
    if measured is not None:
        why = (f"production moved to v{number} after this eval measured "
               f"{'v' + str(measured['version']) if measured['version'] else measured['path']}, and ")
    else:
        why = ""
    if recorded is None:
        why += f"v{number} has no recorded speedup"
    else:
        why += f"v{number} was promoted on another eval set ({recorded_set or 'unknown'}; this eval: {eval_set})"
    return None, None, (f"the {alias} draft v{number} was not measured on this eval set, so the candidate cannot be "
                        f"compared with it ({why}): run eval again with eval.compare_production=true, which measures "
                        f"the current {alias} draft beside the candidate")


def _recorded(tx: RegistryTransaction, number: int) -> tuple[dict | None, str | None]:
    """(summary it was promoted on, eval_set id of its metrics.json) of version `number`."""
    summary = tx.resolve(number).get("summary")
    path = tx.path(number) / "metrics.json"
    try:
        eval_set = json.loads(path.read_text()).get("eval_set")
    except (OSError, json.JSONDecodeError):
        eval_set = None
    return (summary if summary and "speedup" in summary else None), eval_set


def _compared(number: int, champion: dict, source: str, eval_set: str | None) -> dict:
    return {"version": number, "speedup": champion["speedup"], "source": source, "eval_set": eval_set}


def _retaken_reason(alias: str, production: dict, measured: dict | None, compared: dict) -> str:
    seen = "none" if measured is None else (f"v{measured['version']}" if measured["version"] else measured["path"])
    return (f"decision re-taken: {alias} is v{production['version']}, not the draft this eval measured ({seen}); "
            f"compared with v{compared['version']}'s speedup {compared['speedup']:.3f}, {compared['source']}")


def _unknown_target_note(alias: str, production: dict, target: dict | None) -> str | None:
    if target is not None and same_target(production.get("target"), target) is None:
        return (f"note: {alias} v{production['version']} was registered without a target identity (before draftsmith "
                "recorded one), so whether it is a draft for the same target was not checked")
    return None


def _refuse(record: dict, base: dict, reason: str, production: dict | None) -> dict:
    """`record` (a decide() result) refused for `reason`, after any failed gates."""
    failed = [] if record["promote"] else [r for r in record["reasons"] if not r.startswith("note: ")]
    notes = [r for r in record["reasons"] if r.startswith("note: ")]
    record.update(base)
    record["promote"] = False
    record["reasons"] = failed + notes + [reason]
    if production is not None:
        record["champion_version"] = production["version"]
    return record


def _link_wandb(cfg: DraftsmithConfig, run, registry: LocalRegistry, number: int, candidate: dict, out_dir) -> dict:
    from draftsmith.wandb_registry import link_model

    p = cfg.promote
    return link_model(run.run if run is not None else None, registry.path(p.name, number), p.name,
                      cfg.registry.collection, [p.alias], candidate, registry.root, project=cfg.tracking.project,
                      mode=cfg.tracking.mode, wandb_dir=cfg.tracking.dir or str(out_dir))


def _registry_info(registry: LocalRegistry, name: str, number: int) -> dict:
    path = registry.path(name, number)
    return {"kind": "local", "root": str(registry.root), "name": name, "version": number, "path": str(path),
            "aliases": registry.aliases_of(name, number),
            "speculative_config": str(path / "speculative_config.json")}
