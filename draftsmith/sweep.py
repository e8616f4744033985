"""``draftsmith-report SWEEP_DIR``: one table and plot over every eval of a sweep.

Finds every ``*/eval/metrics.json`` under the sweep directory, labels each job by its Hydra
overrides (``.hydra/overrides.yaml``), and ranks the jobs' trained drafts by measured speedup at
their best K. Writes ``sweep_report.md``, ``sweep_report.json`` and ``sweep_speedup.png`` into the
sweep directory and prints the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftsmith.artifacts.formats import read_metrics
from draftsmith.eval.intervals import format_ci

from draftsmith.artifacts import write_json


def _overrides(job_dir: Path) -> str:
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.exists():
        return job_dir.name
    from omegaconf import OmegaConf

    return " ".join(OmegaConf.load(path)) or "(defaults)"


def collect(sweep_dir: str | Path) -> list[dict]:
    """One row per (job, draft): overrides, best K, speedup, acceptance, tau; best speedup first."""
    sweep_dir = Path(sweep_dir)
    paths = sorted(sweep_dir.glob("**/eval/metrics.json"))
    if not paths:
        raise FileNotFoundError(f"no */eval/metrics.json under {sweep_dir}: point draftsmith-report at a sweep "
                                "directory (sweeps/<name>) whose jobs ran the eval stage")
    rows = []
    for path in paths:
        job = path.parent.parent
        metrics = read_metrics(path)  # ArtifactError (one line) on a damaged file
        for draft, s in metrics.summary.items():
            rows.append({"job": str(job.relative_to(sweep_dir)), "overrides": _overrides(job), "draft": draft,
                         "best_k": s["best_k"], "speedup": s["speedup"], "speedup_ci95": s.get("speedup_ci95"),
                         "acceptance_rate": s["acceptance_rate"],
                         "mean_accepted_tokens": s["mean_accepted_tokens"], "greedy_match": s.get("greedy_match"),
                         "eval_set": metrics.eval_set})
    return sorted(rows, key=lambda r: -r["speedup"])


def table(rows: list[dict]) -> str:
    lines = ["| rank | job | overrides | draft | best K | speedup [95% interval] | acceptance rate | tau |",
             "|---:|---|---|---|---:|---:|---:|---:|"]
    for i, r in enumerate(rows, 1):
        speedup = format_ci(r["speedup"], r.get("speedup_ci95"), unit="", digits=3)
        lines.append(f"| {i} | {r['job']} | `{r['overrides']}` | {r['draft']} | {r['best_k']} | {speedup} | "
                     f"{r['acceptance_rate']:.3f} | {r['mean_accepted_tokens']:.2f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trained = [r for r in rows if r["draft"] == "trained"] or rows
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.4 * len(trained)))
    labels = [f"{r['job']}: {r['overrides']}"[:60] for r in trained]
    ax.barh(range(len(trained)), [r["speedup"] for r in trained])
    ax.set_yticks(range(len(trained)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set(xlabel="measured speedup at best K", title="Sweep: trained drafts by speedup")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="draftsmith-report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    args = parser.parse_args(argv)
    sweep_dir = Path(args.sweep_dir)
    try:
        rows = collect(sweep_dir)
    except (FileNotFoundError, ValueError) as exc:
        print(f"draftsmith-report: error: {exc}", file=sys.stderr)
        return 2
    md = table(rows)
    if len({r["eval_set"] for r in rows}) > 1:
        md += ("\n\nNote: the jobs used different eval sets (prompts, K grid or target differ), so speedups are "
               "not strictly comparable across them.")
    (sweep_dir / "sweep_report.md").write_text(f"# Sweep report: {sweep_dir}\n\n{md}\n\n![](sweep_speedup.png)\n")
    write_json(sweep_dir / "sweep_report.json", {"rows": rows})
    plot(rows, sweep_dir / "sweep_speedup.png")
    print(md)
    print(f"\nwritten: {sweep_dir / 'sweep_report.md'}, sweep_report.json, sweep_speedup.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
