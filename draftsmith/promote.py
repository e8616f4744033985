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

The serving basis: when the eval ran the serving A/B on vLLM (``DIR/serve/serving.json``) and it has
cells of the candidate, the gates and the K are taken from it at ``promote.serving_concurrency`` (the
concurrency the team serves at; unset: the lowest measured level; not measured: the nearest measured
level above it, else the highest; the record's ``serving.concurrency_note`` says which): ``speedup`` is
the throughput ratio of the best K there, ``best_k`` that K (0 = no K pays: not promoted, "serve
without speculation"), ``acceptance_rate`` vLLM's at that cell, the batch-1 summary kept under
``batch1``; a cell whose greedy outputs differ with speculation on vs off fails the greedy gate. The
champion is then compared at the same concurrency: the draft the serving A/B measured as
``production``, else the serving.json recorded with the production version (same eval set, same
serving settings), else the candidate is refused. The version stores serving.json, the K per
concurrency band (``k_by_concurrency``) and the winning K in speculative_config.json.

No draft needed: when the trained draft is refused and the fastest training-free method measured beside it that the
registry records (eval.baselines / serve.baselines: n-gram prompt lookup; vLLM's suffix decoding may refuse the draft
but is not recorded: decode/free.py recordable) clears the same gates on the same basis — the speedup bar and the
production champion — that method is registered instead (``promote.record_free``; registry.py: a version
with no draft folder, speculative_config.json ``method: ngram`` with the K, or K schedule, measured for it).
promotion.json keeps the draft's verdict and says what was recorded under ``no_draft_needed``.

Registering a draft that already is the production version is not a new version. Besides the
gates' fields, promotion.json records ``basis`` ("serving" or "batch-1"), ``serving`` (the serving
figures of the decision, or None), ``compared_with`` ({version, speedup, source, eval_set} of
the production draft the decision was taken against, or None when there was none),
``decision_retaken`` (True when that production is not the draft the eval measured),
``eval_measured_production`` and ``target`` (the target's identity).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from draftsmith.config import DraftsmithConfig
from draftsmith.decode.free import recordable
from draftsmith.eval.settings import ServingSettings
from draftsmith.registry import LocalRegistry, RegistryTransaction, fingerprint, same_target, target_identity
from draftsmith.registry import RegistryError, is_free, target_mismatch
from draftsmith.eval.gates import PROMOTED, REFUSED, decide
from draftsmith.eval.policy import DECIDED_ON_SERVING, Roles
from draftsmith.eval.intervals import difference_ci, units_from_passes
from draftsmith.artifacts.formats import ArtifactError, EvalMetrics, ServingTable, read_metrics, read_serving
from draftsmith.artifacts.hashing import where_settings
from draftsmith.eval.serving_stats import (MIN_LIVES, lives_of, short_of_lives,  # noqa: F401
                                          best_k_per_concurrency, cell_difference_ci, decision_level,
                                          k_bands, schedule_shortfall)  # (k_bands)

MEASURED = "measured in this eval"


def promote(cfg: DraftsmithConfig, out_dir: Path, registry: LocalRegistry, run=None,
            serving_path: Path | None = None) -> dict:
    """Decide and (when the gates pass) register, atomically; returns the promotion record (promotion.json).

    `serving_path`: the serve stage's ``serving.json`` when the serving A/B ran (the decision is then taken on it),
    else None (the batch-1 eval's figures)."""
    metrics_path = Path(out_dir) / "eval" / "metrics.json"
    metrics = read_metrics(metrics_path)
    name, draft_dir = _candidate(metrics)
    p = cfg.promote
    gates = p.gates()
    # hashing and loading happen before the lock, so the locked section stays short
    candidate_fp = fingerprint(draft_dir)
    measured = _measured_production(metrics)
    target = target_identity(metrics.target) if metrics.target else None
    serving = read_serving(serving_path) if serving_path is not None else None
    view = _serving_candidate(serving, name, metrics, p.serving_concurrency)
    served = _served_production(serving, measured) if view else None
    candidate = view or metrics.draft(name)
    info = candidate.get("serving")  # the serving A/B figures the decision is taken on, or None (batch 1)
    base = {"name": p.name, "candidate_draft": str(draft_dir), "candidate_name": name,
            "eval_set": metrics.eval_set, "registry": None, "target": target,
            "basis": "serving" if info else "batch-1", "serving": info,
            "measurement": _measurement(metrics, serving if info else None)}

    with registry.transaction(p.name) as tx:
        production = tx.find(p.alias)
        if production is not None:
            measured, served = _with_version(measured, tx), _with_version(served, tx)
        seen = served if info else measured
        base.update(eval_measured_production=measured, decision_retaken=False, compared_with=None)
        mismatch = target_mismatch(registry, p.name, target)
        if mismatch is not None:
            return _refuse(_decide(candidate, gates), base, mismatch, production)
        if production is not None and production["fingerprint"] == candidate_fp:
            record = decide(candidate, gates, None)
            record.update(base, promote=True, decision=PROMOTED, reasons=[f"already {p.alias}: v{production['version']} of {p.name!r} "
                                                       "is this draft; no new version"])
            record["registry"] = _registry_info(registry, p.name, production["version"])
            return record

        champion, compared, refusal = (
            _serving_champion(tx, p.alias, production, served, metrics, serving, info["concurrency"]) if info
            else _champion(tx, p.alias, production, measured, metrics))
        label = None if compared is None else f"{p.alias} v{compared['version']}"
        difference = None
        if compared is not None and compared["source"].startswith("measured in this"):  # side by side: paired
            difference = (_serving_difference(serving, name, candidate, champion, info["concurrency"]) if info
                          else _eval_difference(metrics, name, candidate, champion))
        rivals = (_serving_rivals(serving, name, candidate, info["concurrency"]) if info
                  else _eval_rivals(metrics, name, candidate))
        free = _best_free(rivals)  # the gate weighs the fastest; the fastest the registry records is judged for
        to_record = _best_free([r for r in rivals if recordable(r["spec"])])  # "no draft needed" (prompt lookup)
        record = _decide(candidate, gates, champion, label, difference, free)
        record.update(base, compared_with=compared)
        if not info and (metrics.repeats or {}).get("stopped") == DECIDED_ON_SERVING:
            record["reasons"].append(
                f"note: decided on the batch-1 eval, which added no passes to settle it: it ran to be decided on a "
                f"serving A/B that has no cells of {name!r} here; run stages=[eval,promote] without serve for its "
                "own passes, or serve the candidate")
        if production is not None:
            record["champion_version"] = production["version"]
            record["decision_retaken"] = not _is_measured(production, seen)
            if record["decision_retaken"] and refusal is None:
                record["reasons"].append(_retaken_reason(p.alias, production, seen, compared))
            note = _unknown_target_note(p.alias, production, target)
            if note:
                record["reasons"].append(note)
        if refusal is not None:
            return _refuse(record, {}, refusal, production)
        if not record["promote"]:
            if record["decision"] == REFUSED and to_record is not None and to_record["pays"] and p.record_free:
                settled = (champion, label, compared)
                record["no_draft_needed"] = _no_draft_needed(cfg, tx, registry, run, out_dir, record, to_record,
                                                             metrics, serving if info else None, settled, production,
                                                             target)
            return record

        record["registry"] = _register(cfg, tx, registry, run, out_dir, draft_dir, record, candidate, metrics,
                                       serving if info else None, target, candidate_fp)
    return record


def _register(cfg: DraftsmithConfig, tx: RegistryTransaction, registry: LocalRegistry, run, out_dir, draft,
              record: dict, figures: dict, metrics: EvalMetrics, serving: ServingTable | None, target: dict | None,
              draft_fp: str) -> dict:
    """Register `draft` (a folder, or a training-free method's spec string) promoted by `record` on `figures` and
    move the alias, under the caller's lock; returns promotion.json's "registry" entry."""
    p, info = cfg.promote, figures.get("serving")
    stored = info and {"table": serving.doc, "concurrency": info["concurrency"],
                       "k_by_concurrency": info["k_by_concurrency"]}
    vocab = Path(out_dir) / "eval" / "draft_vocab.json"  # eval.draft_vocab: the ids the figures were measured with
    files = {vocab.name: vocab} if vocab.exists() and not is_free(draft) else None
    version = tx.register(draft, metrics=metrics.doc, promotion=record, k=figures["best_k"], aliases=[p.alias],
                          source={"out_dir": str(out_dir), "config": asdict(cfg)}, target=target,
                          draft_fingerprint=draft_fp, serving=stored, files=files, schedule=p.k_schedule)
    entry = _registry_info(registry, p.name, version["version"])
    entry["created"] = version["created"]
    if cfg.registry.kind == "wandb":
        entry["wandb"] = _link_wandb(cfg, run, registry, version["version"], figures, out_dir)
    return entry


def _no_draft_needed(cfg: DraftsmithConfig, tx: RegistryTransaction, registry: LocalRegistry, run, out_dir,
                     record: dict, free: dict, metrics: EvalMetrics, serving: ServingTable | None, settled: tuple,
                     production: dict | None, target: dict | None) -> dict:
    """The training-free method `free` (the refused draft's rival) judged as a candidate by the same gates, on the
    same basis and against the same champion, and registered when it passes: promotion.json's ``no_draft_needed``
    {"name", "spec", "decision", "reasons", "checks", "registry"}. `record` (the draft's verdict) gets the
    registry entry and a reason line when a version is recorded."""
    from draftsmith.eval.settings import training_free

    p, (champion, label, compared) = cfg.promote, settled
    name, spec = free["name"], free["spec"]
    out = {"name": name, "spec": spec, "decision": None, "reasons": [], "checks": [], "registry": None,
           "candidate": None}
    measured = {s: n for n, s in training_free(metrics.config.get("baselines") or [], "eval.baselines").items()}
    batch1 = measured.get(spec)  # its batch-1 record (named by the eval's list) holds what the gates read besides
    if batch1 is None or batch1 not in metrics.summary:  # the speedup
        out["reasons"] = [f"{spec} was served but not measured by the batch-1 eval (eval.baselines): add it there to "
                          "let promotion record it"]
        return out
    figures = (_serving_candidate(serving, name, metrics, p.serving_concurrency, batch1=batch1)
               if serving is not None else metrics.draft(batch1))
    if figures is None:
        out["reasons"] = [f"{name} has no cells in the serving A/B: nothing to record"]
        return out
    free_fp = fingerprint(spec)
    already = production is not None and production["fingerprint"] == free_fp
    difference = None
    if already:  # production is this method: the gates without a champion, as for a draft already production
        champion = label = None
    elif compared is not None and compared["source"].startswith("measured in this"):
        level = (figures.get("serving") or {}).get("concurrency")
        difference = (_serving_difference(serving, name, figures, champion, level) if serving is not None
                      else _eval_difference(metrics, batch1, figures, champion))
    verdict_ = _decide(figures, cfg.promote.gates(), champion, label, difference)
    out.update(decision=verdict_["decision"], reasons=verdict_["reasons"], checks=verdict_["checks"],
               candidate=figures)
    if not verdict_["promote"]:
        return out
    if already:
        out["reasons"] = [f"already {p.alias}: v{production['version']} of {p.name!r} is {spec}; no new version"]
        out["registry"] = _registry_info(registry, p.name, production["version"])
    else:
        version_record = {**verdict_, "name": p.name, "candidate_name": name, "candidate_draft": spec,
                          "eval_set": metrics.eval_set, "target": target, "basis": record["basis"],
                          "serving": figures.get("serving"), "no_draft_needed": True, "refused_draft": {
                              "name": record["candidate_name"], "decision": record["decision"],
                              "reasons": record["reasons"]}}
        out["registry"] = _register(cfg, tx, registry, run, out_dir, spec, version_record, figures, metrics,
                                    serving, target, free_fp)
    entry = out["registry"]
    record["registry"] = entry
    record["reasons"].append(f"no draft needed: {spec} with K={figures['best_k']} is {p.name} v{entry['version']} "
                             f"({p.alias}): serve it with --speculative-config \"$(cat {entry['speculative_config']})\"")
    return out


def _decide(candidate: dict, gates, champion: dict | None = None, label: str | None = None,
            difference: list[float] | None = None, free: dict | None = None) -> dict:
    """decide(), with a note when the serving concurrency decided at is not promote.serving_concurrency."""
    record = decide(candidate, gates, champion, champion_label=label, difference_ci95=difference, free=free)
    serving = candidate.get("serving") or {}
    for note in (serving.get("concurrency_note"), (serving.get("schedule_measured") or {}).get("shortfall")):
        if note:
            record["reasons"].append(f"note: {note}")
    return record


def _measurement(metrics: EvalMetrics, serving: ServingTable | None) -> dict:
    """How much was measured before the decision: the eval's passes and why they stopped (metrics.json "repeats"),
    and the serving A/B's passes per level when the decision is taken on it."""
    out = {"eval": metrics.repeats}
    if serving is not None:
        out["serving"] = {"repeats": serving.settings.get("repeats", 1), "added_passes": serving.added_passes,
                          "decision_servers": serving.decision_servers}
    return out


def _timed_units(entry: dict | None):
    """The paired [prompt][repeat] times of an eval record or serving cell, or None (written before intervals)."""
    timings = (entry or {}).get("timings")
    if not timings:
        return None
    return units_from_passes(timings["plain_s"], timings["spec_s"])


def _eval_difference(metrics: EvalMetrics, name: str, candidate: dict, champion: dict) -> list[float] | None:
    """The interval of candidate - production speedup from the eval's paired timings at their chosen K."""
    def units(draft: str, summary: dict):
        return _timed_units(metrics.record(draft, summary["best_k"], summary.get("temperature")))

    a, b = units(name, candidate), units("production", champion)
    return difference_ci(a, b) if a and b else None


def _best_free(rivals: list[dict]) -> dict | None:
    """The fastest of the training-free methods' figures (one that may pay before one that surely does not)."""
    return max(rivals, key=lambda f: (f["pays"], f["speedup"] or 0.0), default=None)


def _may_pay(ci) -> bool:
    """A method is a rival unless its speedup's interval is wholly at or below 1 (a point estimate <= 1 on one
    lucky pass does not excuse the draft from the comparison)."""
    from draftsmith.eval.intervals import BELOW, verdict

    return verdict(ci, 1.0) != BELOW


def _eval_rivals(metrics: EvalMetrics, name: str, candidate: dict) -> list[dict]:
    """The training-free methods of the batch-1 eval (eval.baselines) beside the candidate, each with the paired
    interval of candidate - it at their chosen K (the best of them is eval/gates.py decide's `free`)."""
    from draftsmith.eval.settings import training_free

    rivals = []
    for free, spec in training_free(metrics.config.get("baselines") or [], "eval.baselines").items():
        summary = metrics.summary.get(free)
        if summary is None:
            continue
        pays = _may_pay(summary.get("speedup_ci95"))
        a = _timed_units(metrics.record(name, candidate["best_k"], candidate.get("temperature")))
        b = _timed_units(metrics.record(free, summary["best_k"], summary.get("temperature")))
        rivals.append({"name": free, "spec": spec, "best_k": summary["best_k"], "pays": pays,
                       "speedup": summary["speedup"],
                       "speedup_ci95": summary.get("speedup_ci95"),
                       "difference_ci95": difference_ci(a, b) if a and b and pays else None})
    return rivals


def _serving_rivals(serving: ServingTable, name: str, candidate: dict, level: int) -> list[dict]:
    """The training-free methods served beside the candidate (serve.baselines) at the decision concurrency, each
    with the paired interval of candidate - it (eval/serving_stats.py cell_difference_ci: the lives' spread held)."""
    rivals = []
    for free in Roles.of(serving.doc.get("drafts") or {}).free:
        at = _at_level(serving.cells_of(free), level)
        if at is None:
            continue
        k = at["best_k"] or at["choice"]["best_speedup_k"]  # "off" at this level: its fastest K, if it may pay
        pays = bool(k) and _may_pay(at["choice"]["best_speedup_ci95"])
        mine = serving.cell(name, level, candidate["best_k"]) if candidate["best_k"] else None
        theirs = serving.cell(free, level, k) if k else None
        paired = mine and theirs and mine.get("timings") and theirs.get("timings")
        short = paired and short_of_lives(serving.doc, mine, theirs)
        rivals.append({"name": free, "spec": serving.drafts[free], "best_k": k, "pays": pays,
                       "speedup": at["choice"]["best_speedup"],
                       "speedup_ci95": at["choice"]["best_speedup_ci95"],
                       "difference_ci95": cell_difference_ci(mine, theirs) if paired and pays and not short else None,
                       "short_lives": (f"{name} K={candidate['best_k']} and {free} K={k} ran on {lives_of(mine)} and "
                                       f"{lives_of(theirs)} server lives, fewer than the {MIN_LIVES} a difference "
                                       "is declared on" if short else None)})
    return rivals


def _candidate(metrics: EvalMetrics) -> tuple[str, Path]:
    """(summary name, draft dir) of the candidate: the trained draft, else the base draft."""
    name = "trained" if "trained" in metrics.summary else "base"
    if name not in metrics.summary or name not in metrics.drafts:
        raise RegistryError(f"{metrics.path} has no 'trained' or 'base' draft in its summary; re-run eval")
    draft_dir = Path(metrics.drafts[name])
    if not (draft_dir / "config.json").exists():
        raise RegistryError(f"the evaluated draft {draft_dir} is gone (no config.json); re-run train and eval")
    return name, draft_dir


def _measured_production(metrics: EvalMetrics) -> dict | None:
    """{"path", "fingerprint", "version": None} of the production draft this eval measured, or None."""
    path = metrics.drafts.get("production")
    if path is None or "production" not in metrics.summary:
        return None
    present = is_free(path) or (Path(path) / "config.json").exists()
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
              metrics: EvalMetrics) -> tuple[dict | None, dict | None, str | None]:
    """(champion summary, compared_with, refusal reason) for the production draft read under the lock."""
    if production is None:
        return None, None, None
    number, eval_set = production["version"], metrics.eval_set
    if _is_measured(production, measured):
        champion = metrics.draft("production")
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
    try:
        eval_set = read_metrics(tx.path(number)).eval_set
    except ArtifactError:  # an unreadable record compares with nothing
        eval_set = None
    if summary and summary.get("batch1"):  # promoted on the serving A/B: its batch-1 figures, kept beside
        summary = summary["batch1"]
    return (summary if summary and "speedup" in summary else None), eval_set


def _compared(number: int, champion: dict, source: str, eval_set: str | None, concurrency: int | None = None) -> dict:
    compared = {"version": number, "speedup": champion["speedup"], "source": source, "eval_set": eval_set}
    if concurrency is not None:
        compared.update(concurrency=concurrency, best_k=champion["best_k"])
    return compared


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
    record["decision"] = REFUSED
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


# -- the serving A/B basis (DIR/serve/serving.json) -----------------------------------------------------
# settings that do not change a cell's figures: which levels were run, and those that say only where or how the
# servers run (the stage hashes' rule, draftsmith.artifacts.hashing)
# and those that change how precisely a cell is measured or what is summarised from it, not what it measures
_UNCOMPARED_SETTINGS = ("concurrency", "request_rate", "repeats", "max_repeats", "interleave", "fresh_servers",
                        "decision_servers", "slo_tpot_ms", "baselines", "engine",  # what is served beside a draft,
                        # and auto vs vllm, do not change the draft's own cells
                        "slo_ttft_ms", *where_settings(ServingSettings))


def _at_level(cells: list[dict], level: int) -> dict | None:
    """One draft's serving figures at one concurrency: {"best_k" (0 = off), "speedup" (1.0 when off),
    "speedup_ci95", "choice" (best_k_per_concurrency's entry), "top": the chosen K's cell (None when no speedup
    was measured)}; None when `level` was not measured."""
    here = [c for c in cells if c["concurrency"] == level]
    if not here:
        return None
    choice = best_k_per_concurrency(here)[0]
    top = next((c for c in here if c["k"] == choice["best_speedup_k"]), None)
    return {"best_k": choice["k"], "speedup": choice["speedup"], "speedup_ci95": choice["speedup_ci95"],
            "choice": choice, "top": top}


def _serving_difference(serving: ServingTable, name: str, candidate: dict, champion: dict,
                        level: int) -> list[float] | None:
    """The interval of candidate - production serving speedup at `level` from the cells' paired latencies (their
    chosen K; None when either is "off" or has no timings): eval/serving_stats.py cell_difference_ci, which also
    holds the spread between the cells' server lives."""
    if not candidate["best_k"] or not champion.get("best_k"):
        return None
    cells = [serving.cell(name, level, candidate["best_k"]), serving.cell("production", level, champion["best_k"])]
    if not all(c and c.get("timings") for c in cells):
        return None
    return cell_difference_ci(*cells)  # the throughput speedups' difference, the lives' spread held


def _serving_candidate(serving: ServingTable | None, name: str, metrics: EvalMetrics,
                       requested: int | None, batch1: str | None = None) -> dict | None:
    """The candidate's gate summary taken from the serving A/B at the serving concurrency (the batch-1 summary, of
    `batch1` in metrics.json when the eval named it otherwise, kept under "batch1"), or None when there is no
    serving A/B or it has no cells of `name`."""
    cells = serving.cells_of(name) if serving is not None else []
    if not cells:
        return None
    levels = sorted({c["concurrency"] for c in cells})
    level, note = decision_level(levels, requested)
    at = _at_level(cells, level)
    top, b1_name = at["top"], batch1 or name
    batch1 = metrics.draft(b1_name)
    accepted, source = _acceptance(top, b1_name, at["best_k"], metrics)
    choice = at["choice"]
    info = {"draft": name, "concurrency": level, "requested_concurrency": requested, "measured_concurrency": levels,
            "concurrency_note": note, "best_speedup": choice["best_speedup"], "best_speedup_k": choice["best_speedup_k"],
            "best_speedup_ci95": choice["best_speedup_ci95"], "indistinguishable_k": choice["indistinguishable"],
            "repeats": top and top.get("repeats"),
            "tpot_ratio": top.get("tpot_ratio") if top and at["best_k"] else None,
            "outputs_unequal": [_cell_name(c) for c in cells + serving.scheduled_cells
                                if c.get("outputs_equal") is False and c.get("draft") == name],
            "k_by_concurrency": k_bands(best_k_per_concurrency(cells)),
            "schedule_measured": _schedule_measured(serving, name)}
    return {"best_k": at["best_k"], "speedup": at["speedup"], "speedup_ci95": at["speedup_ci95"],
            "repeats": top and top.get("repeats"), "acceptance_rate": accepted, "acceptance_source": source,
            "greedy_match": batch1["greedy_match"], "temperature": batch1.get("temperature"), "batch1": batch1,
            "serving": info}


def _schedule_measured(serving: ServingTable, name: str) -> dict | None:
    """The exported K schedule's own column of the serving A/B, when it was measured for `name` (the candidate's,
    or the training-free rival's "scheduled_free"): the schedule,
    whether it tracked the best static choice at every level, the levels where it did not, and what that means
    (eval/serving_stats.py schedule_shortfall) — so the registry version says how its own configuration served."""
    sched = next((s for s in (serving.doc.get("scheduled"), serving.doc.get("scheduled_free"))
                  if s and s.get("draft") == name), None) or {}
    if not sched.get("tracking"):
        return None
    return {"schedule": sched["schedule"], "tracks": sched.get("tracks"),
            "not_tracked_at": [r["concurrency"] for r in sched["tracking"] if r.get("agrees") is False],
            "shortfall": schedule_shortfall(sched)}


def _acceptance(cell: dict | None, name: str, k: int, metrics: EvalMetrics) -> tuple[float, str]:
    """(acceptance rate, where it comes from): vLLM's at the cell, else the eval's at that K, else at its best K."""
    if cell is not None and cell.get("acceptance_rate") is not None:
        return cell["acceptance_rate"], f"vLLM at K={cell['k']}, concurrency {cell['concurrency']}"
    s = metrics.draft(name)
    record = metrics.record(name, k)
    if record is not None and "acceptance_rate" in record:
        return record["acceptance_rate"], f"eval (batch 1) at K={k}"
    return s["acceptance_rate"], f"eval (batch 1) at its best K={s['best_k']}"


def _cell_name(cell: dict) -> str:
    first = cell.get("first_mismatch") or {}
    where = f"; first at prompt {first['prompt_index']}, token {first['position']}" if first else ""
    k = "scheduled" if cell.get("column") == "scheduled" else f"K={cell['k']}"
    return (f"draft {cell['draft']!r} {k} concurrency {cell['concurrency']} "
            f"({cell.get('mismatches')} of {cell.get('compared')} requests{where})")


def _served_production(serving: ServingTable, measured: dict | None) -> dict | None:
    """{"path", "fingerprint", "version": None} of the draft the serving A/B measured as "production", or None."""
    path = serving.drafts.get("production")
    if path is None or not serving.cells_of("production"):
        return None
    if measured is not None and str(path) == str(measured["path"]):
        return measured
    present = is_free(path) or (Path(path) / "config.json").exists()
    return {"path": str(path), "fingerprint": fingerprint(path) if present else None, "version": None}


def _serving_champion(tx: RegistryTransaction, alias: str, production: dict | None, served: dict | None,
                      metrics: EvalMetrics, serving: ServingTable,
                      level: int) -> tuple[dict | None, dict | None, str | None]:
    """(champion figures, compared_with, refusal reason) at concurrency `level` for the production draft read under
    the lock: measured in this serving A/B, else recorded with its version (same eval set and serving settings)."""
    if production is None:
        return None, None, None
    number, eval_set = production["version"], metrics.eval_set
    if _is_measured(production, served):
        figures = _at_level(serving.cells_of("production"), level)
        if figures is not None:
            source = f"measured in this serving A/B at concurrency {level}"
            return figures, _compared(number, figures, source, eval_set, level), None
    figures, why = _recorded_serving(tx, number, eval_set, serving, level)
    if figures is not None:
        source = f"recorded with v{number} at concurrency {level} on the same eval set and serving settings"
        return figures, _compared(number, figures, source, eval_set, level), None
    if served is not None and not _is_measured(production, served):
        why = (f"production moved to v{number} after this serving A/B measured "
               f"{'v' + str(served['version']) if served['version'] else served['path']}, and {why}")
    return None, None, (f"the {alias} draft v{number} was not measured in this serving A/B, so the candidate's serving "
                        f"speedup at concurrency {level} cannot be compared with it ({why}): run eval and serve again "
                        f"with eval.compare_production=true, serve.engine=vllm and serve.drafts naming production "
                        f"(or [candidate], which serves it beside the candidate), which measures the current "
                        f"{alias} draft beside the candidate")


def _recorded_serving(tx: RegistryTransaction, number: int, eval_set: str | None, serving: ServingTable,
                      level: int) -> tuple[dict | None, str]:
    """(version `number`'s serving figures at `level` from its stored serving.json, or None and why not)."""
    draft = (((tx.resolve(number).get("summary") or {}).get("serving")) or {}).get("draft")
    path = tx.path(number) / "serving.json"
    if draft is None or not path.exists():
        return None, f"v{number} has no recorded serving A/B"
    try:
        stored = read_serving(path)
    except ArtifactError as exc:
        return None, f"v{number}'s serving.json cannot be used ({exc})"
    recorded_set = _recorded(tx, number)[1]
    if eval_set is None or recorded_set != eval_set:
        return None, f"v{number} was promoted on another eval set ({recorded_set or 'unknown'}; this eval: {eval_set})"
    differ = _setting_differences(stored, serving)
    if differ:
        return None, f"v{number}'s serving A/B ran with other settings ({', '.join(differ)})"
    figures = _at_level(stored.cells_of(draft), level)
    if figures is None:
        return None, f"v{number}'s serving A/B did not measure concurrency {level}"
    return figures, ""


def _setting_differences(a: ServingTable, b: ServingTable) -> list[str]:
    """The keys on which two serving.json runs differ in a way that changes their figures."""
    def basis(s: ServingTable) -> dict:
        settings = {f"serve.{k}": v for k, v in s.settings.items() if k not in _UNCOMPARED_SETTINGS}
        return {**s.basis(), **settings}

    x, y = basis(a), basis(b)
    return sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
