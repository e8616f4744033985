"""What a promoted draft was measured at: the monitor's reference acceptance, and the retrain command.

The monitor room does not know the registry (the spine does): the caller resolves a registry version to
its directory ``.../v<N>`` and its version.json record (``LocalRegistry.path`` / ``resolve``), and
:func:`version_reference` reads the rest from the directory itself (serving.json, the serving A/B stored
with the version). ``draftsmith-monitor --registry`` watches against it, ``draftsmith-registry
export-alerts`` writes it into Prometheus rules (monitor/alert_rules.py), scripts/drift_demo.py runs its
retrain command.

Which figure is watched (monitor/window.py explains why): a version served with one K (a static
speculative_config.json, or a batch-size K schedule whose K is one value where it speculates) is watched on
its acceptance rate; a version whose schedule drafts different K's at different loads is watched on its
first-position acceptance, whose promotion-time value is the serving cell's per_position_acceptance[0].
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

from draftsmith.artifacts.errors import UserError
from draftsmith.artifacts.formats import read_serving
from draftsmith.monitor.window import ACCEPTANCE_RATE, FIRST_POSITION, Rules
from draftsmith.serve.schedule import schedule_k, speculated_ks


class MissingReferenceError(UserError, LookupError):
    """A registry version records no acceptance rate to watch against; the message says what to do."""


def version_reference(version_dir: str | Path, record: dict, *, ref: str, root: str | Path) -> dict:
    """What version `record` (its version.json, stored in `version_dir`) of registry `root` was promoted on,
    as reached through `ref` (its alias or number): {"name", "ref", "version", "root", "acceptance_rate",
    "source", "k", "draft", "retrain_command", "figure", "schedule", "k_max", "full_positions"}.

    ``figure`` is the window figure to watch (:func:`watched_figure`) and ``acceptance_rate`` its measured
    value (the key keeps its name for the callers; with the first-position figure it holds that figure);
    ``schedule`` the version's batch-size K schedule (version.json "k_schedule", None for a static K),
    ``k_max`` the largest K the server drafts, ``full_positions`` the positions every draft reaches (the
    schedule's smallest K above 0; 1 for a training-free method, whose drafts may be shorter than K; None for a
    draft at a static K).

    The acceptance rate, best first: vLLM's in the serving A/B stored with the version (serving.json) at the
    served K and the serving concurrency — the same counters the monitor reads; else the figure the promotion
    decided on (version.json "summary": vLLM's or the batch-1 eval's at the best K, as its source says).
    The first-position acceptance: the serving cell's per_position_acceptance[0] at the served K and the
    serving concurrency, else at another K there (the figure does not depend on K).
    """
    path, root = Path(version_dir), Path(root)
    summary = record.get("summary") or {}
    k = record.get("best_k")
    schedule = record.get("k_schedule") or None
    figure = watched_figure(schedule)
    concurrency = record.get("serving_concurrency")
    if figure == FIRST_POSITION:
        rate, source = serving_first_position(path / "serving.json", summary, k, concurrency)
        if rate is None:
            raise MissingReferenceError(
                f"registry {root}: {record['name']} v{record['version']} is served with a batch-size K schedule, "
                f"so its first-position acceptance is watched, but {path / 'serving.json'} has no "
                f"per_position_acceptance of its draft at concurrency {concurrency}: run draftsmith-monitor "
                "without --registry (floor only)")
        return _reference(path, record, ref, root, rate, source, figure, schedule)
    rate, source = serving_acceptance(path / "serving.json", summary, k, concurrency)
    if rate is None and summary.get("acceptance_rate") is not None:
        rate = summary["acceptance_rate"]
        source = summary.get("acceptance_source") or f"eval (batch 1) at K={k}"
    if rate is None:
        raise MissingReferenceError(
            f"registry {root}: {record['name']} v{record['version']} records no acceptance rate "
            f"({path / 'version.json'} has no summary): run draftsmith-monitor without --registry (floor only)")
    return _reference(path, record, ref, root, rate, source, figure, schedule)


def _reference(path: Path, record: dict, ref: str, root: Path, rate: float, source: str, figure: str,
               schedule: Optional[list[list[int]]]) -> dict:
    draft, k = record.get("training_free") or path / "draft", record.get("best_k")  # a training-free method: its spec
    return {"name": record["name"], "ref": ref, "version": record["version"], "root": str(root),
            "acceptance_rate": float(rate), "source": source, "k": k, "draft": str(draft),
            "retrain_command": retrain_command(record, draft, root), "figure": figure, "schedule": schedule,
            "k_max": schedule_k(schedule) if schedule else k,
            "full_positions": (1 if record.get("training_free")  # a lookup draft may be shorter than K
                               else min(speculated_ks(schedule)) if schedule else None)}


def watched_figure(schedule: Optional[list[list[int]]]) -> str:
    """The window figure a version served with `schedule` is watched on: "acceptance_rate" for a static K (None)
    or a schedule that speculates with one K only (its K 0 bands draft nothing, so every counted draft has
    that K); "first_position_acceptance" when the schedule drafts two or more K's (accepted / drafted then
    depends on the load's mix of K's; the first position does not)."""
    return FIRST_POSITION if schedule and len(speculated_ks(schedule)) > 1 else ACCEPTANCE_RATE


def serving_acceptance(path: Path, summary: dict, k, concurrency) -> tuple[Optional[float], Optional[str]]:
    """(vLLM's acceptance rate of the promoted draft at K=`k` and `concurrency` in the serving A/B stored at
    `path`, where it comes from), or (None, None) when the version was not promoted on a serving A/B."""
    draft = (summary.get("serving") or {}).get("draft")
    if not path.exists() or draft is None or concurrency is None:
        return None, None
    cell = read_serving(path).cell(draft, concurrency, k)
    if cell is None or cell.get("acceptance_rate") is None:
        return None, None
    return cell["acceptance_rate"], f"vLLM serving A/B at K={k}, concurrency {concurrency}"


def serving_first_position(path: Path, summary: dict, k, concurrency) -> tuple[Optional[float], Optional[str]]:
    """(vLLM's first-position acceptance of the promoted draft at `concurrency` in the serving A/B stored at
    `path`: its cell at K=`k`, else the cell of the lowest other K with per-position figures, where it comes
    from), or (None, None) when there is none."""
    draft = (summary.get("serving") or {}).get("draft")
    if not path.exists() or draft is None or concurrency is None:
        return None, None
    cells = [c for c in read_serving(path).cells_of(draft) if c["concurrency"] == concurrency
             and c["k"] > 0 and (c.get("per_position_acceptance") or [None])[0] is not None]
    if not cells:
        return None, None
    cell = min(cells, key=lambda c: (c["k"] != k, c["k"]))
    return (cell["per_position_acceptance"][0],
            f"vLLM serving A/B first-position acceptance at K={cell['k']}, concurrency {concurrency}")


def retrain_command(record: dict, draft: Path | str, root: Path) -> str:
    """``draftsmith data.prompts=recent.jsonl pair.draft=<this version's draft> ...``: distil the production
    draft further on recent prompts, then let the champion gate decide against this registry entry. An EAGLE head
    (serve.server.speculative_method: ``eagle``, ``eagle3``) is trained further as one: ``method=eagle|eagle3``.
    A training-free version (no draft: `draft` is its spec string) has nothing to train further: the command trains
    a draft from the recording run's pair.draft and ``method=`` preset (when its method.name is one) on the recent
    prompts; other overrides of that run are not repeated."""
    from draftsmith.decode.free import is_free_spec
    from draftsmith.serve.server import speculative_method

    config = (record.get("source") or {}).get("config") or {}
    pair = config.get("pair") or {}
    target = pair.get("target") or (record.get("target") or {}).get("path")
    args = ["draftsmith", "data.prompts=recent.jsonl"]
    if isinstance(draft, str) and is_free_spec(draft):  # a Path is a folder
        method = (config.get("method") or {}).get("name")
        args += [f"pair.draft={pair['draft']}"] if pair.get("draft") else []
        args += [f"method={method}"] if method in _method_presets() else []  # method.name is a label: a preset's
    else:
        args.append(f"pair.draft={draft}")
        method = speculative_method(draft)
        if method in ("eagle", "eagle3"):  # a head is trained further as its kind (it starts from pair.draft)
            args.append(f"method={method}")
    if target:
        args.append(f"pair.target={target}")
    if target == "demo":
        preset = (config.get("demo") or {}).get("preset")
        if preset and preset != "default":
            args.append(f"demo.preset={preset}")
    else:
        args += [f"pair.{key}={pair[key]}" for key in ("dtype", "device") if pair.get(key)]
    args += [f"promote.name={record['name']}", f"registry.root={root}"]
    return " ".join(shlex.quote(a) for a in args)


def _method_presets() -> set[str]:
    """The names of the ``method=`` presets (conf/method/*.yaml)."""
    from importlib.resources import files

    return {p.name.removesuffix(".yaml") for p in files("draftsmith.conf").joinpath("method").iterdir()
            if p.name.endswith(".yaml")}


def reference_rules(reference: Optional[dict], **settings) -> Rules:
    """:class:`Rules` against `reference` (a :func:`version_reference`; None: the floor only), its messages
    naming it ("production v3's"); `settings`: margin, min_acceptance, min_draft_tokens."""
    if reference is None:
        return Rules(reference_label="the reference", **settings)
    label = f"{reference['ref']} v{reference['version']}'s"
    return Rules(reference=reference["acceptance_rate"], reference_label=label,
                 figure=reference.get("figure", ACCEPTANCE_RATE), **settings)
