"""The run summary: what ``summary.json`` holds and the end-of-run table prints, read from out_dir.

Also tells stale outputs apart: each ``stage.json`` records the hashes of the outputs a stage was
made from, so a stage whose input has been replaced since (``stages=[eval]`` after a promote) is
flagged, never presented as current.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from draftsmith.artifacts.formats import read_metrics, read_serving
from draftsmith.eval.intervals import format_ci


def stale_stages(out: Path) -> dict[str, str]:
    """stage -> why its output in out_dir no longer follows from its inputs' current outputs.

    Each stage.json records the hashes of the outputs it was made from; when an upstream stage
    has run again since (e.g. ``stages=[eval]`` after promote), the downstream output is stale.
    """
    upstream = {"train": ("datagen",), "eval": ("train", "datagen", "eval_prompts"),
                "serve": ("train", "datagen", "eval_prompts"), "promote": ("eval", "serve")}
    found = {}
    for stage, sources in upstream.items():
        record = _read_marker(out / stage)
        if record is None:
            continue
        for source in sources:
            made_from = record.get("inputs", {}).get(source)
            current = _read_marker(out / source)
            if made_from and current and current.get("hash") != made_from:
                found[stage] = (f"made from an earlier {source} output; run stages=[{stage}] "
                                f"to bring it up to date")
                break
        else:
            if any(source in found for source in sources):
                found[stage] = f"made from a stale {next(s for s in sources if s in found)} output"
    return found


def vocab_line(info: dict) -> str:
    """One line on eval.draft_vocab: its size and held-out coverage."""
    cover = info.get("heldout_coverage")
    cover = "" if cover is None else f", {cover:.1%} of the target's held-out tokens"
    return (f"draft vocabulary: every draft proposed only the {info['size']} tokens the target says most "
            f"(eval.draft_vocab{cover}); vLLM serves the full head")


def summarize(out: Path, ran: dict[str, str]) -> dict:
    """The run summary (summary.json, the end-of-run table): per draft acceptance, tau, best K, speedup; the
    decision; stale outputs; paths. `ran` maps each stage of this run to "ran" or "skipped"."""
    result: dict = {"out_dir": str(out), "stages": dict(ran), "drafts": {}, "promotion": None,
                    "stale": stale_stages(out), "process": {"pid": os.getpid(), "host": platform.node()}}
    metrics_path = out / "eval" / "metrics.json"
    if metrics_path.exists():
        metrics = read_metrics(metrics_path)
        result["drafts"] = metrics.summary
        result["report"] = str(out / "eval" / "report.md")
        result["warnings"] = metrics.warnings
        result["draft_vocab"] = metrics.draft_vocab
    serving_path = out / "serve" / "serving.json"
    if serving_path.exists():
        from draftsmith.eval.serving_stats import summary_lines

        serving = read_serving(serving_path)
        result["serving"] = {"lines": summary_lines(serving.doc), "path": str(serving_path)}
    promotion_path = out / "promote" / "promotion.json"
    if promotion_path.exists():
        promotion = json.loads(promotion_path.read_text())
        result["promotion"] = {"promote": promotion["promote"], "reasons": promotion["reasons"],
                               "decision": promotion.get("decision"), "registry": promotion.get("registry")}
    return result


def _read_marker(out: Path) -> dict | None:
    """The stage.json of a stage output, or None when there is none (or it is unreadable)."""
    try:
        return json.loads((out / "stage.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def format_summary(summary: dict) -> str:
    """The end-of-run table: per draft acceptance rate, token acceptance alpha, tau, best K, speedup; the
    serving A/B; the decision; stale outputs; paths."""
    lines = [f"draftsmith: {summary['out_dir']}  (stages: "
             + ", ".join(f"{k} {v}" for k, v in summary["stages"].items()) + ")"]
    if summary["drafts"]:
        lines.append(f"  {'draft':<12} {'acc.rate':>8} {'alpha':>6} {'tau':>6} {'best K':>6} {'speedup [95% interval]':>24} "
                     f"{'greedy==':>8}")
        for name, s in summary["drafts"].items():
            match = "-" if s.get("greedy_match") is None else f"{s['greedy_match']:.2f}"
            alpha = s.get("token_acceptance")
            alpha = "-" if alpha is None else f"{alpha:.3f}"
            lines.append(f"  {name:<12} {s['acceptance_rate']:>8.3f} {alpha:>6} {s['mean_accepted_tokens']:>6.2f} "
                         f"{s['best_k']:>6} {format_ci(s['speedup'], s.get('speedup_ci95')):>24} {match:>8}")
        lines.append("  acc.rate: acceptance rate (accepted / drafted); alpha: token acceptance (accepted / tested; "
                     "the alpha of the speedup formula)")
        lines.append("  tau: tokens per verification forward of the target; speedup: measured vs plain decoding at "
                     "best K, with its 95% interval (paired bootstrap over prompts and passes)")
        if any(name.startswith("ngram") for name in summary["drafts"]):
            lines.append("  ngram: prompt lookup, speculation with nothing to train (eval.baselines): a trained draft "
                         "must beat it to be worth serving")
        if "suffix" in summary["drafts"]:
            lines.append("  suffix: vLLM's suffix decoding (Arctic Inference's suffix tree), speculation with nothing "
                         "to train (eval.baselines): a trained draft must beat it to be worth serving")
        forwards = sorted({f"target {b['target']} / draft {b['draft']}"
                           for b in (s.get("backend") for s in summary["drafts"].values()) if b})
        if forwards:
            lines.append(f"  forward: {'; '.join(forwards)} (decode.backend; plain decoding ran on the same)")
        if summary.get("draft_vocab"):
            lines.append("  " + vocab_line(summary["draft_vocab"]))
        for warning in summary.get("warnings", []):
            lines.append(f"  WARNING: {warning}")
        lines.append(f"  report: {summary['report']}")
    if summary.get("serving"):
        lines += [f"  {line}" for line in summary["serving"]["lines"]]
        lines.append(f"  serving A/B on vLLM: {summary['serving']['path']}")
    elif summary.get("serving_off"):
        lines.append(f"  serving A/B on vLLM: off ({summary['serving_off']}); to measure speculation at the "
                     "concurrency you serve, install vLLM (docs/serving-ab.md) and set serve.python")
    stale = summary.get("stale", {})
    for stage, why in stale.items():
        lines.append(f"  STALE: {stage} output {why}")
    if summary["promotion"]:
        p = summary["promotion"]
        when = " (STALE: decided on an earlier eval)" if "promote" in stale else ""
        decision = p.get("decision") or ("promoted" if p["promote"] else "refused")
        lines.append(f"  promotion{when}: {decision.upper()} - " + "; ".join(p["reasons"]))
        if p.get("registry"):
            r = p["registry"]
            lines.append(f"  registry: {r['path']} (v{r['version']}, aliases {r['aliases']}); vLLM: "
                         f"--speculative-config \"$(cat {r['speculative_config']})\"")
    return "\n".join(lines)
