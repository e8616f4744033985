"""What re-runs a stage: for each pipeline stage, the one declaration of the settings and the outputs its hash covers.

A stage's output is known by one hash (``stage.json``): :func:`stage_section` — the values of the config keys the
stage declares (:data:`STAGE_KEYS`; a section counts every field but those marked ``metadata=WHERE``:
artifacts/hashing.py ``figures_of``), plus the facts the pipeline derives for it (the resolved model paths, the
drafts measured, the production version's fingerprint, the decision contract) — and the hashes of the stages whose
outputs it reads (``after``). A setting a stage reads only through such a fact is declared under ``derived``, with
how. Every other setting is in :data:`UNHASHED`, with why; tests/test_stage_keys.py fails on a config key that is in
none of them. docs/configuration.md's "What a change runs again" is :func:`runs_again_table`, checked by that test.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from draftsmith.artifacts.hashing import figures_of, is_where

ORDER = ("datagen", "train", "eval", "serve", "promote")  # as the pipeline runs them

_BARS = "the bars the added passes settle (eval/policy.py Contract)"
_PRODUCTION = "which registry version is measured beside the candidate (its fingerprint)"
_STATES = "with data.hidden_states=auto: whether vLLM keeps the target's states (draftsmith/preflight.py)"
_SERVING_DECIDES = "whether the serving A/B runs on vLLM: the promotion decides on it, and the eval adds no passes"


@dataclass(frozen=True)
class StageKeys:
    """What one stage's hash covers: `keys` by value, `derived` through a fact (key -> how), `after`'s hashes."""

    keys: tuple[str, ...]
    derived: dict[str, str] = field(default_factory=dict)
    after: tuple[str, ...] = ()


_MODELS = {"demo.preset": "which demo pair pair.target=demo builds (the resolved model paths)"}

STAGE_KEYS: dict[str, StageKeys] = {
    "datagen": StageKeys(keys=("pair.target", "pair.dtype", "data"), derived={**_MODELS, **{
        key: _STATES for key in ("method.finetune", "method.device", "method.mixed_precision", "method.eagle_layers",
                                 "pair.draft")}}),
    # prompts tokenized for an eval without a datagen output
    "eval_prompts": StageKeys(keys=("pair.target", "data"), derived=_MODELS),
    "train": StageKeys(
        keys=("pair.target", "pair.draft", "pair.draft_layers", "method"),
        derived={**_MODELS, "eval.draft_vocab": "with method.reduced_head: the ids the head is trained on",
                 "eval.temperature": "the held-out figure method.best_by=auto keeps the best step by"},
        after=("datagen",)),
    "eval": StageKeys(
        keys=("pair.target", "pair.draft", "pair.draft_layers", "pair.dtype", "eval", "decode"),
        derived={**_MODELS, "promote.min_speedup": _BARS, "promote.champion_margin": _BARS,
                 "promote.free_margin": _BARS, "promote.name": _PRODUCTION, "promote.alias": _PRODUCTION,
                 "registry.root": _PRODUCTION, "stages": _SERVING_DECIDES, "serve.engine": _SERVING_DECIDES},
        after=("datagen", "eval_prompts", "train")),
    "serve": StageKeys(
        keys=("pair.target", "pair.draft", "pair.draft_layers", "pair.dtype", "serve"),
        derived={**_MODELS, "eval.k": "the K served when serve.k is unset",
                 "eval.compare_base": "the drafts served", "eval.compare_production": "the drafts served",
                 "promote.min_speedup": _BARS, "promote.champion_margin": _BARS, "promote.free_margin": _BARS,
                 "promote.serving_concurrency": _BARS, "promote.k_schedule": "the K schedule's column the A/B measures",
                 "promote.name": _PRODUCTION, "promote.alias": _PRODUCTION,
                 "registry.root": _PRODUCTION},
        after=("datagen", "eval_prompts", "train")),
    "promote": StageKeys(keys=("promote", "registry"), after=("eval", "serve")),
}

UNHASHED = {
    "out_dir": "where the outputs go",
    "name": "the run's name (its part in the registry is promote.name)",
    "force": "runs the stages again whatever their hash",
    "pair.device": "where the models run",
    "tracking": "where the figures are logged",
}


def value(cfg, key: str):
    """The value of dotted config `key` in `cfg`, a section as its :func:`figures_of` (WHERE fields left out)."""
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return figures_of(node) if dataclasses.is_dataclass(node) else node


def stage_section(cfg, stage: str, facts: dict | None = None) -> dict:
    """What `stage`'s hash covers besides its inputs: its declared keys' values and the pipeline's `facts`."""
    return {"keys": {key: value(cfg, key) for key in STAGE_KEYS[stage].keys}, "facts": facts or {}}


def leaf_keys(section, prefix: str = "") -> list[tuple[str, bool]]:
    """(dotted key, marked WHERE) of every leaf field of a config dataclass, nested sections walked."""
    out = []
    for f in dataclasses.fields(section):
        key = f"{prefix}{f.name}"
        child = getattr(section, f.name)
        if dataclasses.is_dataclass(child) and not is_where(f):
            out += leaf_keys(child, key + ".")
        else:
            out.append((key, is_where(f)))
    return out


def _under(key: str, names) -> bool:
    return any(key == n or key.startswith(n + ".") for n in names)


def direct_stages(key: str, where: bool = False) -> list[str]:
    """The stages whose own hash a change of leaf `key` changes (none for a WHERE field or an unhashed key)."""
    if where:
        return []
    return [s for s, d in STAGE_KEYS.items() if _under(key, d.keys) or key in d.derived]


def runs_again(key: str, where: bool = False) -> list[str]:
    """The stages a change of leaf `key` runs again: those that hash it, and every stage after them."""
    hit = set(direct_stages(key, where))
    grew = True
    while grew:
        more = {s for s, d in STAGE_KEYS.items() if hit & set(d.after)} - hit
        hit |= more
        grew = bool(more)
    return [s for s in ORDER if s in hit]


def undeclared(cfg) -> list[str]:
    """The leaf keys of `cfg` that no stage hashes, that are not WHERE fields and not in :data:`UNHASHED`."""
    return [key for key, where in leaf_keys(cfg)
            if not where and not direct_stages(key) and not _under(key, UNHASHED)]


def _stages_text(stages: list[str]) -> str:
    if not stages:
        return "nothing"
    return "every stage" if list(stages) == list(ORDER) else ", ".join(stages)


def runs_again_table(cfg) -> str:
    """docs/configuration.md's "What a change runs again" table, from the declarations: per section the stages a
    change of most of its keys runs again (``section.*``), then the keys of it that run others."""
    rows: list[tuple[str, str]] = []
    sections: dict[str, list[tuple[str, list[str]]]] = {}
    for key, where in leaf_keys(cfg):
        sections.setdefault(key.split(".")[0], []).append((key, runs_again(key, where)))
    top: dict[str, list[str]] = {}
    for section, keys in sections.items():
        if len(keys) == 1 and keys[0][0] == section:  # a top-level key: one row per outcome, at the end
            top.setdefault(_stages_text(keys[0][1]), []).append(f"`{section}`")
            continue
        texts = [_stages_text(stages) for _, stages in keys]
        common = max(texts, key=texts.count)  # ties: the first key's
        rows.append((f"`{section}.*`", common))
        by_text: dict[str, list[str]] = {}
        for (key, _), text in zip(keys, texts):
            if text != common:
                by_text.setdefault(text, []).append(f"`{key}`")
        rows += [(", ".join(names), text) for text, names in by_text.items()]
    rows += [(", ".join(names), text) for text, names in top.items()]
    lines = ["| you change | runs again |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)
