"""Closing the loop on the demo: the monitor sees acceptance drop on shifted traffic, a retrain on recent
prompts brings it back, and the champion gate decides. Prints one JSON document.

    python scripts/drift_demo.py --registry-root registry      # needs a promoted demo draft: run `draftsmith` first

The demo target is served by vLLM with the registry's production draft (serve/server.py; the draft and K from
the version's speculative_config.json) and driven by closed-loop greedy load (eval/load.py), phase by phase.
Each phase is watched by draftsmith-monitor's poll loop (monitor/poll.py ``Monitor.run``: one window spanning
the phase, polled every --interval s) against the promoted version's measured acceptance (monitor/reference.py),
and read from vLLM's spec-decode counters (serve/metrics.py) before and after it:

1. ``before/in_domain``: --prompts prompts cut from the demo domain packages (the traffic the draft was
   distilled for);
2. ``before/shifted``: --recent prompts from standard-library text outside the domain that neither demo model
   was trained on (:data:`SHIFTED_PACKAGES`: pydoc's help topics, prose instead of code): the monitor should
   raise the drift alert. These prompts are then written as ``recent.jsonl``: the recent traffic (with
   ``--mix N``, N more domain prompts beside them: the README's advice when the old traffic still matters);
3. ``before/shifted_unseen``: --prompts more shifted prompts that the retrain does not see (no run of
   :data:`UNSEEN_NGRAM` tokens in common with a recent prompt), the yardstick of before and after;
4. ``retrain``: the command the monitor recommends (its ``retrain_command``: ``draftsmith
   data.prompts=recent.jsonl pair.draft=<production draft> ...``) plus ``out_dir=`` and the --retrain-arg
   overrides, run in the directory that holds recent.jsonl; the champion gate's decision is
   ``promote/promotion.json``;
5. ``after/shifted_unseen`` and ``after/in_domain`` on the registry's production draft after the retrain
   (as served: its own K; when the gate refused the retrained draft, that draft at the K it was measured best
   at): did acceptance on shifted traffic recover, and did the draft forget the domain?
   When the new version's K differs, the same phases again at the old K (``after_k<K>/...``): acceptance falls
   with K, so the before/after answers (``deltas``) compare phases served at one K.

vLLM runs from --python (default: $DRAFTSMITH_VLLM_PYTHON, else ./.venv-vllm/bin/python), as the serving A/B;
the retrain gets the same interpreter (DRAFTSMITH_VLLM_PYTHON), so the demo's ``serve.engine=auto``
finds vLLM as it would in the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftsmith.artifacts.errors import UserError  # noqa: E402
from draftsmith.decode.acceptance import ACCEPTANCE_FLOOR  # noqa: E402
from draftsmith.demo import DOMAIN_PACKAGES, demo_prompts  # noqa: E402
from draftsmith.monitor.window import DEFAULT_MARGIN  # noqa: E402

# The shifted traffic: the pydoc help topics (pydoc_data/topics.py: English prose about Python) instead of code.
# Neither demo model was trained on them (draftsmith.demo.stdlib_files leaves pydoc_data out), and the draft was
# distilled on the domain packages' code only. The code of the other standard-library packages is no shift for
# this pair: the base draft was pretrained on it (its acceptance there is close to its acceptance in the domain).
SHIFTED_PACKAGES = ("pydoc_data",)
UNSEEN_NGRAM = 16  # a shifted_unseen prompt shares no run of this many tokens with a recent (retrained-on) prompt
SEEDS = {"in_domain": 101, "shifted": 102, "shifted_unseen": 103, "mix": 104}  # the demo's datagen prompts: 1000
PHASE_WINDOW_S = 1e9  # a monitor window spanning its whole phase
FIGURES = ("acceptance_rate", "per_position_acceptance", "mean_accepted_tokens", "drafts", "draft_tokens",
           "accepted_tokens", "drafts_per_s", "span_s")


class DriftDemoError(UserError, RuntimeError):
    """The demo cannot run as asked (no production draft, no shifted packages, a failed retrain); says what to do."""


# -- prompt sets (pure but for reading the standard library) --------------------------------------------
def shifted_files(packages: tuple[str, ...] = SHIFTED_PACKAGES,
                  domain: tuple[str, ...] = DOMAIN_PACKAGES) -> list[Path]:
    """The .py files of the standard library's top-level `packages` (folders or modules), which must lie outside
    the demo `domain`; test folders and the like included (draftsmith.demo.stdlib_files leaves them out)."""
    overlap = sorted(set(packages) & set(domain))
    if overlap:
        raise DriftDemoError(f"--shifted-packages {overlap} belong to the demo domain {list(domain)}: shifted traffic "
                             "must come from outside it")
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for name in packages:
        found = sorted((root / name).rglob("*.py")) if (root / name).is_dir() else \
            [root / f"{name}.py"] if (root / f"{name}.py").is_file() else []
        if not found:
            raise DriftDemoError(f"--shifted-packages {name!r} has no source files in {root}: name a top-level package "
                                 "or module of this interpreter's standard library outside the demo domain")
        files += found
    return files


def ngrams(ids: list[int], n: int = UNSEEN_NGRAM) -> set[tuple[int, ...]]:
    """The runs of `n` consecutive tokens of `ids`."""
    return {tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)}


def prompt_sets(tokenizer, *, prompts: int, recent: int, prompt_tokens: int, shifted: list[Path], mix: int = 0,
                domain: tuple[str, ...] = DOMAIN_PACKAGES) -> dict[str, list[list[int]]]:
    """{"in_domain", "shifted" (the recent traffic, retrained on), "shifted_unseen", "mix"} as token-id lists, cut
    by draftsmith.demo.demo_prompts from the `domain` packages and from the `shifted` files with the seeds of
    :data:`SEEDS`. "mix": `mix` more domain prompts that go into recent.jsonl beside the shifted ones. The
    yardsticks share no run of UNSEEN_NGRAM tokens with what is retrained on: shifted_unseen with shifted,
    in_domain with mix."""
    def cut(n, name, **where):
        return [p[0].tolist() for p in demo_prompts(tokenizer, n, prompt_tokens, seed=SEEDS[name], **where)]

    sets = {"in_domain": cut(prompts, "in_domain", domain=domain), "shifted": cut(recent, "shifted", files=shifted)}
    sets["shifted_unseen"] = disjoint(cut(3 * prompts, "shifted_unseen", files=shifted), sets["shifted"], prompts)
    sets["mix"] = disjoint(cut(2 * mix, "mix", domain=domain), sets["in_domain"], mix) if mix else []
    return sets


def disjoint(candidates: list[list[int]], taken: list[list[int]], n: int) -> list[list[int]]:
    """The first `n` of `candidates` that share no run of UNSEEN_NGRAM tokens with any of `taken`."""
    seen = set().union(*map(ngrams, taken))
    kept = [p for p in candidates if not ngrams(p) & seen][:n]
    if len(kept) < n:
        raise DriftDemoError(f"only {len(kept)} of {len(candidates)} prompts do not overlap the others: give "
                             "--shifted-packages with more text, or fewer --recent / --mix prompts")
    return kept


def recent_jsonl(tokenizer, prompts: list[list[int]]) -> str:
    """The recent traffic as the JSONL draftsmith reads (``{"prompt": text}`` per line)."""
    return "".join(json.dumps({"prompt": tokenizer.decode(p)}) + "\n" for p in prompts)


# -- the retrain command ------------------------------------------------------------------------------
def retrain_argv(command: str, out_dir: str | Path, extra: list[str]) -> list[str]:
    """The monitor's `retrain_command` as argv, with ``out_dir=`` and the `extra` overrides appended (later
    overrides win in Hydra)."""
    args = shlex.split(command)
    if not args or args[0] != "draftsmith" or "data.prompts=recent.jsonl" not in args:
        raise DriftDemoError(f"unexpected retrain command from draftsmith-monitor: {command!r}")
    return args + [f"out_dir={out_dir}", *extra]


def draftsmith_executable() -> list[str]:
    """How to run the ``draftsmith`` console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "draftsmith"
    return [str(script)] if script.exists() else [sys.executable, "-m", "draftsmith.cli"]


def run_retrain(argv: list[str], cwd: Path, vllm_python: str, log_path: Path) -> float:
    """Run the retrain in `cwd` (where recent.jsonl is), logging to `log_path`; returns its wall time."""
    env = {**os.environ, "DRAFTSMITH_VLLM_PYTHON": vllm_python, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    started = time.monotonic()
    with open(log_path, "w") as log:
        done = subprocess.run(draftsmith_executable() + argv[1:], cwd=cwd, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise DriftDemoError(f"the retrain exited with status {done.returncode}; its log is {log_path}:\n{tail}")
    return time.monotonic() - started


def promotion_summary(record: dict) -> dict:
    """The champion gate's decision from promotion.json: promoted or not, why, against what."""
    candidate = record.get("candidate") or {}
    return {"promoted": bool(record.get("promote")) and bool(record.get("registry")), "reasons": record.get("reasons"),
            "basis": record.get("basis"), "compared_with": record.get("compared_with"),
            "candidate": {k: candidate.get(k) for k in ("best_k", "speedup", "acceptance_rate", "greedy_match")},
            "champion": {k: (record.get("champion") or {}).get(k) for k in ("best_k", "speedup", "acceptance_rate")},
            "registry": record.get("registry")}


# -- phases ---------------------------------------------------------------------------------------------
def phase_summary(name: str, records: list[dict], counters, load, wall_s: float) -> dict:
    """One phase: the monitor's window over it (its last record), the alerts it raised on the way, vLLM's
    counters over the phase (`counters`: serve.metrics.SpecCounters) and the load's figures."""
    last = records[-1]
    fired = [r for r in records if r.get("alerts")]
    ok = [r for r in load.requests if not r.error]
    tokens = sum(r.output_tokens for r in ok)
    return {
        "phase": name, "wall_s": round(wall_s, 2), "requests": len(load.requests),
        "errors": len(load.requests) - len(ok), "output_tokens": tokens,
        "output_tokens_per_s": tokens / load.wall_s if load.wall_s else None,
        "monitor": {"status": last.get("status"), "polls": len(records), "reference": last.get("reference"),
                    "drift_below": last.get("drift_below"), "floor": last.get("floor"),
                    **{k: last.get(k) for k in FIGURES},
                    "alerts": sorted({a["rule"] for r in fired for a in r["alerts"]}),
                    "first_alert_after_s": round(fired[0]["time"] - records[0]["time"], 2) if fired else None,
                    "alert_messages": [a["message"] for a in (fired[-1]["alerts"] if fired else [])],
                    "recommendation": fired[-1].get("recommendation") if fired else None},
        "vllm_counters": {"acceptance_rate": counters.acceptance_rate(),
                          "per_position_acceptance": counters.per_position_acceptance(),
                          "mean_accepted_tokens": counters.mean_accepted_tokens(), "drafts": counters.drafts,
                          "draft_tokens": counters.draft_tokens, "accepted_tokens": counters.accepted_tokens},
    }


def change(phases: dict[str, dict], after: str, before: str) -> dict | None:
    """vLLM's figures of phase `after` minus those of `before` (None when either is missing). Compare phases
    served at the same K: the acceptance rate and even the per-position acceptance fall with K for one draft
    on the same prompts, since K moves where the rounds start."""
    if after not in phases or before not in phases:
        return None
    a, b = phases[after]["vllm_counters"], phases[before]["vllm_counters"]
    if a["acceptance_rate"] is None or b["acceptance_rate"] is None:
        return None
    common = zip(a["per_position_acceptance"], b["per_position_acceptance"])
    return {"k": [len(b["per_position_acceptance"]), len(a["per_position_acceptance"])],
            "acceptance_rate": round(a["acceptance_rate"] - b["acceptance_rate"], 4),
            "per_position_acceptance": [round(x - y, 4) for x, y in common],
            "mean_accepted_tokens": round(a["mean_accepted_tokens"] - b["mean_accepted_tokens"], 4)}


def deltas(phases: dict[str, dict], after: str = "after") -> dict:
    """The answers, from vLLM's counters: the drop on shifted traffic, the recovery, and what the domain kept;
    `after` labels the phases of the retrained draft served at the K the "before" phases were served at."""
    return {"shifted_vs_in_domain": change(phases, "before/shifted", "before/in_domain"),
            "recovery_on_shifted_unseen": change(phases, f"{after}/shifted_unseen", "before/shifted_unseen"),
            "change_on_in_domain": change(phases, f"{after}/in_domain", "before/in_domain")}


def watch_phase(url: str, rules, retrain: str | None, load_fn, interval: float, jsonl, phase: str) -> tuple:
    """Run `load_fn` while a :class:`Monitor` polls `url` every `interval` s (first poll before the load, last
    after it); each record goes to `jsonl` with its phase. Returns (records, load result, counters, wall_s)."""
    from draftsmith.monitor.poll import Monitor, append_record
    from draftsmith.serve.metrics import counters_delta, scrape_metrics

    def kept(record: dict) -> dict:
        record["phase"] = phase
        append_record(jsonl, record)
        return record

    finished, box = threading.Event(), {}
    polls = Monitor(url, rules, PHASE_WINDOW_S, retrain_command=retrain).run(interval, until=finished)
    before = scrape_metrics(url)
    records = [kept(next(polls))]  # the window's base, before the load
    started = time.monotonic()
    worker = threading.Thread(target=lambda: (box.update(_call(load_fn)), finished.set()))
    worker.start()
    records += [kept(record) for record in polls]  # every interval, and once more when the load is done
    worker.join()
    wall = time.monotonic() - started
    if "error" in box:
        raise box["error"]
    return records, box["result"], counters_delta(before, scrape_metrics(url)), wall


def _call(fn) -> dict:
    try:
        return {"result": fn()}
    except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
        return {"error": exc}


def static_config(spec_config: dict, k: int) -> dict:
    """`spec_config` at one static K (any batch-size K schedule dropped)."""
    out = {key: value for key, value in spec_config.items() if key != "num_speculative_tokens_per_batch_size"}
    return {**out, "num_speculative_tokens": k}


def serve_phases(args, work: Path, label: str, reference: dict, target: str, spec_config: dict,
                 plan: list[tuple[str, list[list[int]]]], jsonl) -> tuple[dict, dict]:
    """Serve `target` with the draft of `reference` (the registry's draft dir; K from its `spec_config`) and run
    each (phase, prompts) of `plan` under the monitor. Returns ({phase name: summary}, {"command", "startup_s"})."""
    from draftsmith.eval.load import run_load
    from draftsmith.monitor.reference import reference_rules
    from draftsmith.serve.client import served_model
    from draftsmith.serve.server import VllmServer
    from draftsmith.serve.settings import ServerSettings

    rules = reference_rules(reference, margin=args.margin, min_acceptance=args.min_acceptance)
    settings = ServerSettings(python=args.python, kvcache_gib=args.kvcache_gib)  # the serve.* server settings
    schedule = spec_config.get("num_speculative_tokens_per_batch_size")  # a version promoted with its K schedule
    spec = settings.spec(target, device="cpu", draft=reference["draft"], k=spec_config["num_speculative_tokens"],
                         schedule=schedule)
    started, phases = time.monotonic(), {}
    with VllmServer(spec, log_path=work / f"vllm-{label}.log", startup_timeout_s=600) as server:
        server_info = {"command": " ".join(shlex.quote(a) for a in spec.command(server.port)),
                       "startup_s": round(time.monotonic() - started, 1)}
        model = served_model(server.url)
        run_load(server.url, model, plan[0][1], num_requests=2, max_tokens=8, concurrency=1)  # warm-up, unwatched
        for name, prompts in plan:
            key = f"{label}/{name}"
            log(f"drift demo: {key}: {len(prompts)} prompts at concurrency {args.concurrency}")
            records, load, counters, wall = watch_phase(
                server.url, rules, reference["retrain_command"],
                lambda p=prompts: run_load(server.url, model, p, num_requests=len(p), max_tokens=args.max_tokens,
                                           concurrency=args.concurrency),
                args.interval, jsonl, key)
            phases[key] = phase_summary(key, records, counters, load, wall)
            mon = phases[key]["monitor"]
            log(f"drift demo: {key}: acceptance {counters.acceptance_rate():.3f} (monitor {mon['acceptance_rate']:.3f},"
                f" reference {reference['acceptance_rate']:.3f}), alerts {mon['alerts'] or 'none'}")
    return phases, server_info


def production(root: Path, name: str, ref: str) -> tuple[dict, str, dict]:
    """(the monitor's reference for `ref` of `name`, the target directory, speculative_config.json)."""
    from draftsmith.monitor_cli import promoted_reference
    from draftsmith.registry import LocalRegistry

    registry = LocalRegistry(root)
    if ref not in registry.aliases(name) and not ref.lstrip("v").isdigit():
        raise DriftDemoError(f"registry {root} has no {ref} draft of {name!r}: run `draftsmith registry.root={root} "
                             f"promote.name={name}` first (the demo distils a draft and promotes it there)")
    reference = promoted_reference(registry, name, ref)
    version = registry.path(name, ref)
    record = registry.resolve(name, ref)
    target = (record.get("target") or {}).get("path")
    if not target or not Path(target).is_dir():
        raise DriftDemoError(f"{version}/version.json names no target directory that exists ({target!r}): rebuild "
                             "the demo pair with `draftsmith` (it is cached under $DRAFTSMITH_CACHE)")
    return reference, target, json.loads((version / "speculative_config.json").read_text())


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--registry-root", default="registry", help="registry.root holding the promoted demo draft")
    ap.add_argument("--name", default="demo", help="registry name (promote.name)")
    ap.add_argument("--ref", default="production", help="version or alias served first")
    ap.add_argument("--out", help="working directory (recent.jsonl, the retrain's out_dir, logs; default: a temp dir)")
    ap.add_argument("--prompts", type=int, default=48, help="prompts of the in-domain and shifted_unseen phases")
    ap.add_argument("--recent", type=int, default=192, help="prompts of the shifted phase (= recent.jsonl)")
    ap.add_argument("--mix", type=int, default=0,
                    help="also put this many (other) domain prompts into recent.jsonl: keep the old traffic in view")
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens per request (ignore_eos)")
    ap.add_argument("--concurrency", type=int, default=4, help="closed-loop clients")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between the monitor's polls")
    ap.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help="draftsmith-monitor --margin")
    ap.add_argument("--min-acceptance", type=float, default=ACCEPTANCE_FLOOR,
                    help="draftsmith-monitor --min-acceptance")
    ap.add_argument("--shifted-packages", nargs="+", default=list(SHIFTED_PACKAGES))
    ap.add_argument("--retrain-arg", action="append", default=None, metavar="KEY=VALUE",
                    help="an override appended to the retrain command (repeatable; default: eval.compare_base=false, "
                         "the base draft is production here)")
    ap.add_argument("--python", help="the interpreter that imports vllm")
    ap.add_argument("--kvcache-gib", type=float, default=2.0)
    return ap.parse_args(argv)


def close_the_loop(args, work: Path, reference: dict, target: str, spec_config: dict, sets: dict, tokenizer,
                   jsonl) -> dict:
    """Phases 1-5 of the module docstring; returns what the report is made of."""
    started, timings = time.monotonic(), {}
    before, server_before = serve_phases(args, work, "before", reference, target, spec_config,
                                         [(n, sets[n]) for n in ("in_domain", "shifted", "shifted_unseen")], jsonl)
    timings["before_s"] = round(time.monotonic() - started, 1)
    (work / "recent.jsonl").write_text(recent_jsonl(tokenizer, sets["shifted"] + sets["mix"]))
    extra = ["eval.compare_base=false"] if args.retrain_arg is None else list(args.retrain_arg)
    argv = retrain_argv(reference["retrain_command"], work / "retrain", extra)
    log(f"drift demo: retraining: {shlex.join(argv)}")
    timings["retrain_s"] = round(run_retrain(argv, work, args.python, work / "retrain.log"), 1)
    promotion = json.loads((work / "retrain" / "promote" / "promotion.json").read_text())
    if promotion_summary(promotion)["promoted"]:
        after_ref, _, after_config = production(Path(args.registry_root).resolve(), args.name, "production")
        served = f"production v{after_ref['version']}, promoted by the retrain"
    else:  # production is unchanged: serve the refused candidate instead, watched against production's reference
        after_ref = {**reference, "draft": str(work / "retrain" / "train" / "draft")}
        k = (promotion.get("candidate") or {}).get("best_k") or spec_config["num_speculative_tokens"]
        after_config = static_config(spec_config, k)
        served = f"the retrained draft the gate refused ({after_ref['draft']}, K={k}); production is unchanged"
    log(f"drift demo: after: serving {served}")
    plan = [(n, sets[n]) for n in ("shifted_unseen", "in_domain")]
    after, server_after = serve_phases(args, work, "after", after_ref, target, after_config, plan, jsonl)
    servers = {"before": server_before, "after": server_after}
    k_before, same_k = spec_config["num_speculative_tokens"], "after"
    if after_config["num_speculative_tokens"] != k_before:  # the same draft at the old K: a like-for-like answer
        same_k = f"after_k{k_before}"
        more, servers[same_k] = serve_phases(args, work, same_k, after_ref, target,
                                             static_config(after_config, k_before), plan, jsonl)
        after.update(more)
    timings["total_s"] = round(time.monotonic() - started, 1)
    return {"phases": {**before, **after}, "same_k": same_k, "servers": servers, "promotion": promotion,
            "after_ref": after_ref, "after_served": served, "retrain": shlex.join(argv), "timings": timings}


def main(argv=None) -> dict:
    from draftsmith.decode.pair import load_tokenizer
    from draftsmith.serve.server import INSTALL_HINT, probe_vllm, vllm_python
    from draftsmith.registry import LocalRegistry

    args = parse_args(argv)
    args.python = vllm_python(args.python)
    root = Path(args.registry_root).resolve()
    work = Path(args.out or tempfile.mkdtemp(prefix="drift-demo-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    reference, target, spec_config = production(root, args.name, args.ref)
    found = probe_vllm(args.python)
    if not found["ok"]:
        raise DriftDemoError(f"vLLM is not importable by {args.python} (--python; {found['reason']}): "
                             + INSTALL_HINT.format(key="--python"))
    tokenizer = load_tokenizer(target, "target")
    shifted = shifted_files(tuple(args.shifted_packages))
    sets = prompt_sets(tokenizer, prompts=args.prompts, recent=args.recent, prompt_tokens=args.prompt_tokens,
                       shifted=shifted, mix=args.mix)
    with open(work / "monitor.jsonl", "w") as jsonl:
        loop = close_the_loop(args, work, reference, target, spec_config, sets, tokenizer, jsonl)
    phases, fields = loop["phases"], ("ref", "version", "acceptance_rate", "source", "k", "draft")
    report = {
        "registry": {"root": str(root), "name": args.name, "served_before": {k: reference[k] for k in fields},
                     "served_after": {k: loop["after_ref"][k] for k in fields}, "after_served": loop["after_served"],
                     "versions": [v["version"] for v in LocalRegistry(root).versions(args.name)]},
        "target": target, "settings": vars(args), "shifted_files": [str(f) for f in shifted],
        "domain_packages": list(DOMAIN_PACKAGES), "prompt_sets": {k: len(v) for k, v in sets.items()},
        "phases": phases, "deltas": deltas(phases, loop["same_k"]),
        "alerts": {key: p["monitor"]["alerts"] for key, p in phases.items()},
        "promotion": promotion_summary(loop["promotion"]),
        "commands": {**{f"vllm_{label}": server["command"] for label, server in loop["servers"].items()},
                     "monitor_recommended": reference["retrain_command"], "retrain": loop["retrain"],
                     "retrain_cwd": str(work)},
        "timings": {**loop["timings"], "phases_s": {k: p["wall_s"] for k, p in phases.items()},
                    "server_startup_s": {label: server["startup_s"] for label, server in loop["servers"].items()}},
        "out_dir": str(work),
    }
    print(json.dumps(report, indent=2, default=str))
    return report


if __name__ == "__main__":
    try:
        main()
    except UserError as exc:
        print(f"drift_demo: error: {exc}", file=sys.stderr)
        sys.exit(2)
