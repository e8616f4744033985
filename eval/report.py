"""report.md and PNG plots of an eval's metrics (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

from draftsmith.eval.intervals import format_ci


def _plots(metrics: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records, summary = metrics["records"], metrics["summary"]
    drafts = list(summary)
    files = []

    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / max(1, len(drafts))
    for j, name in enumerate(drafts):
        s = summary[name]
        rec = next(r for r in records if r["draft"] == name and r["k"] == s["best_k"] and r["temperature"] == s["temperature"])
        xs = [i + 1 + (j - (len(drafts) - 1) / 2) * width for i in range(len(rec["per_position_acceptance"]))]
        ys = rec["per_position_acceptance"]
        cis = rec.get("per_position_acceptance_ci95") or [None] * len(ys)
        yerr = [[y - ci[0] if ci else 0.0 for y, ci in zip(ys, cis)], [ci[1] - y if ci else 0.0 for y, ci in zip(ys, cis)]]
        ax.bar(xs, ys, width=width, yerr=yerr, capsize=3, label=f"{name} (K={s['best_k']})")
    ax.set(xlabel="draft position", ylabel="P(accepted)", ylim=(0, 1),
           title="Per-position acceptance at best K (95% intervals)")
    ax.legend()
    files.append(_save(fig, out / "per_position_acceptance.png"))

    for key, ylabel, fname in (("speedup", "speedup over plain decoding", "speedup_vs_k.png"),
                               ("acceptance_rate", "acceptance rate", "acceptance_vs_k.png")):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name in drafts:
            temp = summary[name]["temperature"]
            mine = sorted((r for r in records if r["draft"] == name and r["temperature"] == temp), key=lambda r: r["k"])
            (line,) = ax.plot([r["k"] for r in mine], [r[key] for r in mine], marker="o", label=f"{name} measured")
            if key == "speedup":
                ax.plot([r["k"] for r in mine], [r["predicted_speedup"] for r in mine], marker="x", linestyle="--",
                        color=line.get_color(), label=f"{name} predicted")
        if key == "speedup":
            ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(xlabel="K (draft tokens per round)", ylabel=ylabel, title=f"{ylabel} vs K")
        ax.legend()
        files.append(_save(fig, out / fname))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(drafts, [summary[n]["speedup"] for n in drafts], color="tab:blue", label="speedup at best K")
    ax.bar(drafts, [summary[n]["acceptance_rate"] for n in drafts], color="tab:orange", alpha=0.6,
           label="acceptance rate at best K")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(title="Drafts compared (before vs after)")
    ax.legend()
    files.append(_save(fig, out / "drafts_compared.png"))
    return files


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name


def _backend_lines(metrics: dict) -> list[str]:
    """Which cached forward ran the models: plain and speculative decoding used the same one."""
    used = sorted({f"target {r['backend']['target']}, draft {r['backend']['draft']}"
                   for r in metrics["records"] if "backend" in r})
    if not used:
        return []
    return [f"Forward backend (`decode.backend={metrics['config'].get('backend', 'auto')}`, the same for plain and "
            f"speculative decoding): {'; '.join(used)}.", ""]


def _vocab_lines(metrics: dict) -> list[str]:
    """eval.draft_vocab: the reduced draft vocabulary every draft ran with, and its held-out coverage."""
    info = metrics.get("draft_vocab")
    if not info:
        return []
    cover = info.get("heldout_coverage")
    cover = "" if cover is None else f"; they are {cover:.1%} of the target's held-out completion tokens"
    return [f"Draft vocabulary (`eval.draft_vocab={info['size']}`): every draft proposed only the {info['size']} "
            f"tokens the target says most in `{info['source']}` (`draft_vocab.json`){cover}. Greedy output and "
            f"sampling are exact either way; vLLM's serving A/B runs the draft's full head.", ""]


LEGEND = ("Acceptance rate: accepted / drafted draft tokens. Token acceptance α: accepted / tested draft tokens "
          "(the drafted tokens after a rejection are never tested), the α of the predicted speedup "
          "(1 − α^(K+1)) / ((1 − α)(K·c + c_v)). τ: tokens per verification forward of the target. Speedup: plain / speculative wall "
          "time on the same prompts. The intervals (95%) of the speedup and of α resample the prompts, each with its passes.")


def _interval_lines(metrics: dict) -> list[str]:
    """How sure the speedups are: the interval's method, the passes taken and why they stopped, the best-K rule."""
    rep = metrics.get("repeats")
    if not rep:
        return []
    lines = [f"Speedups carry their 95% interval [lo, hi]: a paired bootstrap over prompts and passes (plain and "
             f"speculative run side by side). Passes: {rep['initial']} per cell"
             + (f", {rep['rounds']} more round(s) for undecided verdicts" if rep["rounds"] else "")
             + f" (stopped: {rep['stopped']}"
             + (f"; still undecided: {', '.join(rep['undecided'])}" if rep.get("undecided") else "") + ")."]
    for name, s in metrics["summary"].items():
        choice = s.get("k_choice")
        if choice and len(choice["indistinguishable"]) > 1:
            lines.append(f"- {name}: K {choice['indistinguishable']} are indistinguishable (fastest: K={choice['leader']}); "
                         f"best K {s['best_k']} by the rule: {choice['rule']}.")
    return lines + [""]


def _cost_lines(metrics: dict) -> list[str]:
    """The cost ratios timed apart (decode/timing.py) beside those the decodes paid (eval/metrics.py in_loop_costs),
    and the speedup each predicts: where the measured speedup falls short of the first, this says whether the costs
    or the loop's own overhead ("other") account for it."""
    rows = [r for r in metrics["records"] if r.get("in_loop")]
    if not rows:
        return []
    lines = ["", "## Costs: timed apart vs paid in the loop", "",
             "| draft | K | T | c / c_v timed apart | predicted | c / c_v in the loop | predicted | other share of a round | speedup |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        loop = r["in_loop"]
        lines.append(f"| {r['draft']} | {r['k']} | {r['temperature']} | {r['c']:.3f} / {r['c_v']:.3f} | "
                     f"{r['predicted_speedup']:.2f} | {loop['c']:.3f} / {loop['c_v']:.3f} | {loop['predicted_speedup']:.2f} | "
                     f"{loop['other']:.1%} | {format_ci(r['speedup'], r.get('speedup_ci95'))} |")
    return lines + ["", "c: a draft step / a plain target step; c_v: a verification forward / a plain target step. "
                    "Timed apart: short bursts before the decodes; in the loop: the same decodes the speedup is "
                    "measured on (rounds after the first), against their plain runs' step. The measured speedup "
                    "includes the prefill (the same in both), so it sits a little under the in-loop prediction."]


def _alpha(entry: dict) -> str:
    """Token acceptance α with its 95% interval where metrics.json has one: '0.667 [0.628, 0.705]'."""
    return format_ci(entry["token_acceptance"], entry.get("token_acceptance_ci95"), unit="", digits=3)


def write_report(metrics: dict, out: Path) -> None:
    """Write report.md and its plots into `out`."""
    plots = _plots(metrics, out)
    lines = ["# draftsmith eval report", "",
             f"{metrics['prompts']} held-out prompts, {metrics['config']['max_new_tokens']} new tokens, "
             f"target `{metrics['config']['target']}`.", "", *_backend_lines(metrics), *_vocab_lines(metrics),
             "## Summary", "",
             "| draft | best K | speedup | acceptance rate | token acceptance α | tokens / target step τ | greedy match |",
             "|---|---|---|---|---|---|---|"]
    for name, s in metrics["summary"].items():
        gm = "—" if s["greedy_match"] is None else f"{s['greedy_match']:.2f}"
        lines.append(f"| {name} | {s['best_k']} | {format_ci(s['speedup'], s.get('speedup_ci95'))} | "
                     f"{s['acceptance_rate']:.3f} | {_alpha(s)} | {s['mean_accepted_tokens']:.2f} | {gm} |")
    lines += ["", LEGEND, "", *_interval_lines(metrics)]
    if metrics["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- ⚠ {w}" for w in metrics["warnings"]]
    lines += ["", "## All cells", "",
              "| draft | K | T | acceptance rate | token acceptance α | τ | speedup | predicted | plain tok/s | spec tok/s | TTFT ms plain / spec | TPOT ms plain / spec | HF assisted tok/s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in metrics["records"]:
        hf = r.get("hf_assisted", {}).get("tokens_per_s")
        lines.append(
            f"| {r['draft']} | {r['k']} | {r['temperature']} | {r['acceptance_rate']:.3f} | {_alpha(r)} | "
            f"{r['mean_accepted_tokens']:.2f} | {format_ci(r['speedup'], r.get('speedup_ci95'))} | "
            f"{r['predicted_speedup']:.2f} | "
            f"{r['baseline']['tokens_per_s']:.1f} | {r['speculative']['tokens_per_s']:.1f} | "
            f"{r['baseline']['ttft_ms']:.1f} / {r['speculative']['ttft_ms']:.1f} | "
            f"{r['baseline']['tpot_ms']:.1f} / {r['speculative']['tpot_ms']:.1f} | {'—' if hf is None else f'{hf:.1f}'} |")
    lines += _cost_lines(metrics)
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    (out / "report.md").write_text("\n".join(lines) + "\n")
