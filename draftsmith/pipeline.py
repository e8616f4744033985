"""The pipeline: datagen -> train -> eval -> serve -> promote, each stage skipped when its output matches.

Every stage writes under ``out_dir`` (``datagen/``, ``train/`` with ``train/draft/``, ``eval/``
with ``metrics.json`` and ``report.md``, ``serve/serving.json`` when the serving A/B runs,
``promote/promotion.json``) and a ``stage.json`` beside its output holding the stage's config hash.
The hash covers what the stage declares in draftsmith/stage_keys.py — its config keys' values (every setting but
those marked as saying only where or how the work runs, ``metadata=WHERE``), the facts derived for it here (resolved
model paths, the drafts measured, the production version) — and the hashes of the stages it reads, so changing
``method.loss`` re-runs train, eval, serve and promote but not datagen, and changing ``serve.concurrency`` re-runs
serve and promote, never the batch-1 eval. A stage whose ``stage.json`` is missing (a crash) runs again; train
resumes from its last checkpoint when the hash matches and starts afresh (removing the stale output) when it does
not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from draftsmith.artifacts import atomic_dir, write_json, write_text
from draftsmith.artifacts.formats import read_metrics
from draftsmith.artifacts.hashing import stage_digest
from draftsmith.decode.pair import PairError, load_tokenizer
from draftsmith.config import DEMO, ConfigError, DraftsmithConfig
from draftsmith.stage_keys import STAGE_KEYS, stage_section
from draftsmith.summary import summarize
from draftsmith.tracking import StageRun, Tracker, is_tracking_error, log_draft_artifact, log_eval
from draftsmith.eval.settings import DecodeSettings, EvalSettings, candidate_name
from draftsmith.eval.policy import Contract
from draftsmith.train.prompts import PromptError, PromptFormat, PromptSource
from draftsmith.train.settings import DatagenSettings, TrainSettings


def served_drafts(serving, drafts: dict[str, str]) -> dict[str, str]:
    """The eval's drafts the serving A/B serves: those named in serve.drafts ([] = all; "candidate" = the draft
    promotion decides on, eval/settings.py candidate_name: the trained draft, else the base draft — and the
    production draft beside it when the eval measured one, since the champion gate then compares the two on
    the serving A/B, side by side)."""
    if not serving.drafts:
        return drafts
    wanted = set()
    for name in serving.drafts:
        wanted |= {candidate_name(drafts), "production"} if name == "candidate" else {name}
    chosen = {name: path for name, path in drafts.items() if name in wanted}
    if not chosen:
        raise ConfigError(f"serve.drafts={list(serving.drafts)} names none of this eval's drafts "
                          f"({', '.join(drafts)}); fix the list, or leave it [] to serve them all")
    return chosen


class Pipeline:
    """Runs the configured stages in order; `run()` returns the summary it prints."""

    def __init__(self, cfg: DraftsmithConfig, out_dir: Path, log=print, config_dict: dict | None = None,
                 datagen_cache: str | None = None):
        self.cfg = cfg
        self.out = Path(out_dir)
        self.datagen_cache = cfg.data.cache_dir or datagen_cache
        self.log = log
        self.tracker = Tracker(cfg.tracking, config_dict or asdict(cfg), self.out, group=cfg.name)
        self._pair: tuple[str, str] | None = None
        self.hashes: dict[str, str] = {}
        self.serving_note: str | None = None  # why serve.engine=auto found no vLLM
        self.ran: dict[str, str] = {}  # stage -> "ran" | "skipped"

    # -- inputs -----------------------------------------------------------------------------
    def pair(self) -> tuple[str, str | None]:
        """(target, base draft) ids or paths; the demo pair is built (or found in the cache) here. The base draft is
        None when there is none: an EAGLE head (method.finetune=eagle|eagle3) is trained from the target alone."""
        if self._pair is None:
            from draftsmith.demo import cache_root
            from draftsmith.pairs import layer_draft, resolve_model

            pair = self.cfg.pair
            target, draft = pair.target, pair.draft
            if DEMO in (target, draft):
                from draftsmith.demo import PRESETS, build_demo_pair

                demo_target, demo_draft = build_demo_pair(PRESETS[self.cfg.demo.preset], log=self.log)
                target = str(demo_target) if target == DEMO else target
                draft = str(demo_draft) if draft == DEMO else draft
            target = resolve_model(target, "pair.target", cache_root(), log=self.log)
            if pair.draft_layers:
                draft = layer_draft(target, pair.draft_layers, cache_root(), log=self.log)
            elif not draft:
                draft = None
            else:
                draft = resolve_model(draft, "pair.draft", cache_root(), log=self.log)
            self._pair = (target, draft)
        return self._pair

    def prompts_path(self, target: str) -> str:
        """``data.prompts``, with ``demo`` (the demo domain prompts) and ``stdlib-chat`` (chat prompts about the
        standard library, :mod:`draftsmith.chat_prompts`) replaced by the file written into out_dir."""
        from draftsmith.chat_prompts import STDLIB_CHAT, write_stdlib_chat_prompts

        prompts = self.cfg.data.prompts
        if prompts == STDLIB_CHAT:
            self.out.mkdir(parents=True, exist_ok=True)
            return str(write_stdlib_chat_prompts(self.out / "stdlib_chat_prompts.jsonl", n=self.cfg.data.demo_prompts,
                                                 seed=self.cfg.data.seed, scored=self.cfg.data.demo_scored))
        if prompts != DEMO:
            return prompts
        from draftsmith.demo import write_domain_prompts

        self.out.mkdir(parents=True, exist_ok=True)
        return str(write_domain_prompts(self.out / "demo_prompts.jsonl", load_tokenizer(target, "target"),
                                        n=self.cfg.data.demo_prompts))

    def registry(self):
        from draftsmith.registry import LocalRegistry

        return LocalRegistry(self.cfg.registry.root, self.cfg.registry.lock_timeout_s)

    def check_registry_target(self, target: str) -> None:
        """Before any work: the registry entry ``promote.name`` holds drafts for this target (or none), and
        the production draft that eval will measure shares the target's tokenizer."""
        from draftsmith.registry import check_registry_target

        registry, p = self.registry(), self.cfg.promote
        check_registry_target(registry, p.name, p.alias, target)
        prod = self.production()
        if prod is not None and self.cfg.eval.compare_production and not prod.get("training_free"):
            from draftsmith.decode.pair import check_tokenizers

            path = Path(prod["path"]) / "draft"
            try:
                check_tokenizers(load_tokenizer(target, "target"), load_tokenizer(path, "production draft"),
                                 target, str(path))
            except PairError as exc:
                raise ConfigError(f"the {p.alias} draft of promote.name={p.name!r} in registry.root="
                                  f"{self.cfg.registry.root} is not for this target ({exc}); use another "
                                  "promote.name (or registry.root), or eval.compare_production=false") from exc

    def resolve_serving_engine(self) -> None:
        """serve.engine: `vllm` must be importable by serve.python (a one-line error with the install recipe
        otherwise, before any work); `auto` becomes vllm when it is, else none (the table then says how to turn
        the serving A/B on). serve.baselines=[suffix] on servers launched here: Arctic Inference must import too."""
        from draftsmith.decode.free import SUFFIX
        from draftsmith.serve.server import probe_vllm, require_suffix_decoding, require_vllm, vllm_python_choice

        serving = self.cfg.serve
        if serving.engine == "vllm" and serving.url is None:
            require_vllm(serving.python, key="serve.python", engine_key="serve.engine")
        elif serving.engine == "auto":
            found = probe_vllm(serving.python)
            python, why = vllm_python_choice(serving.python)
            self.serving_note = None if found["ok"] else f"{found['reason']}, looked at {python} ({why})"
            serving.engine = "vllm" if found["ok"] else "none"
        if serving.engine == "vllm" and serving.url is None and SUFFIX in serving.baselines:
            require_suffix_decoding(serving.python)

    def production(self) -> dict | None:
        """The registry's current production version record (None when there is none)."""
        return self.registry().find(self.cfg.promote.name, self.cfg.promote.alias)

    # -- stage bookkeeping ------------------------------------------------------------------
    def _done(self, out: Path, digest: str) -> bool:
        marker = out / "stage.json"
        if self.cfg.force or not marker.exists():
            return False
        try:
            return json.loads(marker.read_text()).get("hash") == digest
        except json.JSONDecodeError:
            return False

    def _digest(self, stage: str, facts: dict, inputs: dict) -> tuple[dict, str]:
        """(section, hash) of `stage`: draftsmith/stage_keys.py stage_section of this config and `facts`, with
        `inputs` (upstream stage -> hash), which must be stages the declaration says it reads."""
        unknown = set(inputs) - set(STAGE_KEYS[stage].after)
        if unknown:
            raise AssertionError(f"{stage} hashes {sorted(unknown)}, which draftsmith/stage_keys.py does not declare")
        section = stage_section(self.cfg, stage, facts)
        return section, stage_digest(stage, section, inputs)

    def _stage(self, stage: str, out: Path, facts: dict, body, inputs: dict | None = None,
               own_run: bool = True) -> None:
        """Run `body` unless `out` holds this stage's output for its declared keys, `facts` and `inputs` (upstream
        stage -> hash); ``stage.json`` records them, so that a later run can tell a stale output (see `stale`)."""
        inputs = inputs or {}
        section, digest = self._digest(stage, facts, inputs)
        self.hashes[stage] = digest
        if self._done(out, digest):
            self.log(f"draftsmith: {stage}: up to date in {out} (config hash {digest}); skipped")
            self.ran[stage] = "skipped"
            return
        self.log(f"draftsmith: {stage}: running -> {out}")
        started = time.time()
        with (self.tracker.stage(stage) if own_run else contextlib.nullcontext(StageRun())) as run:
            body(run)
            write_json(out / "stage.json", {"stage": stage, "hash": digest, "config": section, "inputs": inputs,
                                            "finished_at": time.time(), "seconds": time.time() - started})
            run.summary({f"{stage}/seconds": time.time() - started})
        self.ran[stage] = "ran"

    def _upstream(self, stage: str, out: Path) -> str:
        """The hash of an upstream stage that is not in `stages` this time, read from its output."""
        if stage in self.hashes:
            return self.hashes[stage]
        marker = out / "stage.json"
        if not marker.exists():
            raise ConfigError(f"{out} has no finished {stage} output (no stage.json); add {stage} to stages or "
                                    f"point out_dir at a run that has it")
        return json.loads(marker.read_text())["hash"]

    # -- stages -----------------------------------------------------------------------------
    def datagen(self) -> None:
        from draftsmith.train import datagen

        cfg, link = self.cfg, self.out / "datagen"
        target, _ = self.pair()
        facts = {"target": target}
        _, digest = self._digest("datagen", facts, {})
        shared = Path(self.datagen_cache) if self.datagen_cache else None
        out = shared / f"datagen-{digest}" if shared else link

        def body(run):
            settings = {**settings_of(cfg.data, DatagenSettings), "prompts": self.prompts_path(target)}
            manifest = datagen.run(datagen.DatagenConfig(**settings, target=target, out_dir=str(out),
                                                         dtype=cfg.pair.dtype, device=cfg.pair.device))
            run.log({"datagen/tokens_per_s": manifest["timing"]["tokens_per_s"],
                     "datagen/completion_tokens": manifest["counts"]["completion_tokens"],
                     "datagen/train_prompts": manifest["counts"]["completions"]["train"],
                     "datagen/heldout_prompts": manifest["counts"]["completions"]["heldout"]})

        if shared is None:
            self._stage("datagen", out, facts, body)
            return
        from filelock import FileLock

        shared.mkdir(parents=True, exist_ok=True)
        with FileLock(str(shared / f"datagen-{digest}.lock")):  # concurrent sweep jobs: one generates
            self._stage("datagen", out, facts, body)
        _link_dir(link, out)
        self.log(f"draftsmith: datagen: {link} -> {out} (shared by the runs that use data.cache_dir={shared})")

    def train(self) -> None:
        from draftsmith.train import trainer

        cfg, out = self.cfg, self.out / "train"
        target, draft = self.pair()
        m = cfg.method
        draft_vocab = cfg.eval.draft_vocab if cfg.method.reduced_head else m.draft_vocab  # reduced: the eval's ids
        best_by = m.best_by
        if best_by == "auto":  # the figure the eval's decoding gains from: greedy accepts the target's argmax
            best_by = "top1_agreement" if all(t == 0 for t in cfg.eval.temperature) else "expected_acceptance"
        facts = {"target": target, "draft": draft, "draft_vocab": draft_vocab,
                 "best_by": best_by if m.keep_best else None}  # the figure matters only where the best step is kept
        inputs = {"datagen": self._upstream("datagen", self.out / "datagen")}
        _, digest = self._digest("train", facts, inputs)  # a crashed run resumes only under the same digest

        def body(run):
            marker = out / "stage.json"
            if out.exists() and (marker.exists() or not self._resumable(out, digest)):
                self.log(f"draftsmith: train: {out} holds the output of another config; starting afresh")
                shutil.rmtree(out)
            out.mkdir(parents=True, exist_ok=True)
            write_json(out / "pending.json", {"hash": digest})  # lets a crashed run resume under the same config
            train_cfg = trainer.TrainConfig(**{**settings_of(m, TrainSettings), "best_by": best_by,
                                               "draft_vocab": draft_vocab},
                                            data_dir=str(self.out / "datagen"), draft=draft or target, target=target,
                                            out_dir=str(out), **self.tracker.train_kwargs())
            try:
                trainer.run(train_cfg)
            except Exception as exc:
                if not (train_cfg.log_with and is_tracking_error(exc)):
                    raise
                self.log(f"draftsmith: train: W&B failed ({type(exc).__name__}: {exc}); continuing without tracking "
                         "from the last checkpoint; local outputs are unaffected")
                trainer.run(dataclasses.replace(train_cfg, log_with=None))
            (out / "pending.json").unlink(missing_ok=True)

        # accelerate opens and finishes the train stage's W&B run itself
        self._stage("train", out, facts, body, inputs=inputs, own_run=False)

    @staticmethod
    def _resumable(out: Path, digest: str) -> bool:
        pending = out / "pending.json"
        return pending.exists() and json.loads(pending.read_text()).get("hash") == digest

    def eval_drafts(self, prod: dict | None) -> dict[str, str]:
        """name -> path of the drafts to evaluate: trained, base, and the production version `prod` (its draft, or
        the spec string of the training-free method it records)."""
        _, base = self.pair()
        drafts = {}
        trained = self.out / "train" / "draft"
        if (trained / "config.json").exists():
            drafts["trained"] = str(trained)
        if (self.cfg.eval.compare_base or not drafts) and base is not None:
            drafts["base"] = base
        if not drafts:
            raise ConfigError(f"eval: nothing to evaluate: no trained draft in {trained.parent} and no pair.draft; run "
                              "the train stage first (stages=[train,eval,...]), or give pair.draft")
        if prod is not None and self.cfg.eval.compare_production:
            from draftsmith.registry import fingerprint, served_draft

            candidate = Path(drafts.get("trained") or drafts["base"])  # what promote would register
            if not candidate.is_dir() or fingerprint(candidate) != prod["fingerprint"]:
                drafts["production"] = served_draft(prod)
        return drafts

    def eval_prompts(self, target: str) -> tuple[dict, dict]:
        """(EvalConfig prompt argument, {upstream stage: hash}): the datagen output's held-out split when there is
        one (this run's datagen, or a finished one in out_dir), else every prompt of ``data.prompts``,
        tokenized once into ``DIR/eval_prompts/prompts.jsonl`` (evaluating a draft without training it)."""
        datagen_dir = self.out / "datagen"
        if "datagen" in self.cfg.stages or (datagen_dir / "stage.json").exists():
            return {"data_dir": str(datagen_dir)}, {"datagen": self._upstream("datagen", datagen_dir)}
        if self.cfg.eval.draft_vocab:
            raise ConfigError(f"eval.draft_vocab={self.cfg.eval.draft_vocab} ranks tokens by what the target says in a "
                              f"datagen output, and {self.out} has none: add datagen to stages, or set "
                              f"eval.draft_vocab=0 (the draft's full vocabulary)")
        if not self.cfg.data.prompts:
            raise ConfigError(f"stages={list(self.cfg.stages)} without a datagen output in {self.out} needs "
                              "data.prompts=FILE.jsonl (or .parquet, a folder, a HF dataset id) to evaluate on")
        from draftsmith.train.prompts import prepare_prompts, read_prompts

        d = self.cfg.data
        section, digest = self._digest("eval_prompts", {"target": target}, {})
        out = self.out / "eval_prompts"
        if not self._done(out, digest):
            tokenizer = load_tokenizer(target, "target")
            texts = read_prompts(PromptSource(self.prompts_path(target), **settings_of(d, PromptFormat)), tokenizer)
            prepared = prepare_prompts(texts, tokenizer, max_prompt_tokens=d.max_prompt_tokens, heldout_fraction=0.0,
                                       max_prompts=d.max_prompts)
            if not prepared.train:
                raise PromptError(f"data.prompts={d.prompts!r}: no usable prompt (counts: {prepared.counts})")
            with atomic_dir(out) as tmp:
                write_text(tmp / "prompts.jsonl", "".join(json.dumps({"prompt_ids": ids}) + "\n"
                                                         for ids in prepared.train))
                write_json(tmp / "stage.json", {"stage": "eval_prompts", "hash": digest, "config": section,
                                                "counts": prepared.counts, "finished_at": time.time()})
            self.log(f"draftsmith: eval: {len(prepared.train)} prompts of {d.prompts} -> {out} (no datagen output)")
        return {"prompts_file": str(out / "prompts.jsonl")}, {"eval_prompts": digest}

    def eval(self) -> None:
        from draftsmith.eval import runner

        cfg, out = self.cfg, self.out / "eval"
        target, _ = self.pair()
        prod = self.production()
        drafts = self.eval_drafts(prod)
        # (a serve.drafts list that names none of the drafts fails here, before any work)
        decided_here = not self.serving_decides(drafts)
        prod = prod if "production" in drafts else None  # a new champion means a new comparison
        # the verdicts the eval adds passes to settle (eval/policy.py): the promote gates, at batch 1 — unless the
        # promotion will decide on the serving A/B's cells
        decide = Contract.of(cfg.promote, production="production" in drafts,
                             free=bool(cfg.eval.baselines)).at_batch1(decided_here=decided_here)
        facts = {"target": target, "drafts": drafts, "production": prod and prod["fingerprint"],
                 "decide": decide.facts()}
        prompts, inputs = self.eval_prompts(target)
        if "trained" in drafts:
            inputs["train"] = self._upstream("train", self.out / "train")

        def body(run):
            runner.run(runner.EvalConfig(
                **settings_of(cfg.eval, EvalSettings), **settings_of(cfg.decode, DecodeSettings), **prompts,
                target=target, drafts=drafts, out_dir=str(out), dtype=cfg.pair.dtype, device=cfg.pair.device,
                decide=decide))
            log_eval(run, read_metrics(out))  # what was written, through the one reader

        self._stage("eval", out, facts, body, inputs=inputs)

    def serving_decides(self, drafts: dict[str, str]) -> bool:
        """Whether the promotion will decide on the serving A/B this run makes: it runs on vLLM and serves the
        candidate under its name (promote.py reads the candidate's cells; against the user's servers, serve.url, one
        draft only: more are labelled "served"). A serve.drafts list that names none of `drafts` raises ConfigError
        (:func:`served_drafts`)."""
        serving = self.cfg.serve
        if "serve" not in self.cfg.stages or serving.engine != "vllm":
            return False
        served = served_drafts(serving, drafts)
        return candidate_name(drafts) in served and (serving.url is None or len(served) == 1)

    def serve(self) -> None:
        """The serving A/B on vLLM (eval/serving.py) into ``DIR/serve/`` (serving.json, report.md, plots, the
        servers' logs), on the eval's prompts and drafts; off (nothing written) with serve.engine=none."""
        from draftsmith.eval.runner import file_prompts, heldout_prompts
        from draftsmith.eval.serving import report_section, run_serving_ab

        cfg, out, serving = self.cfg, self.out / "serve", self.cfg.serve
        if serving.engine != "vllm":
            self.log("draftsmith: serve: off (serve.engine=" + serving.engine
                     + (f"; {self.serving_note}" if self.serving_note else "") + ")")
            return
        target, _ = self.pair()
        prod = self.production()
        drafts = served_drafts(serving, self.eval_drafts(prod))
        prompts, inputs = self.eval_prompts(target)
        if "trained" in drafts:
            inputs["train"] = self._upstream("train", self.out / "train")
        k = list(serving.k or cfg.eval.k)
        # the verdicts the A/B adds passes to settle at the serving concurrency (as the eval does at batch 1)
        decide = Contract.of(cfg.promote, production="production" in drafts, free=bool(serving.baselines))
        facts = {"target": target, "drafts": drafts, "k": k,
                 "production": prod and "production" in drafts and prod["fingerprint"], "decide": decide.facts()}

        def body(run):
            ids = (heldout_prompts(prompts["data_dir"], serving.max_prompts) if "data_dir" in prompts
                   else file_prompts(prompts["prompts_file"], serving.max_prompts))
            with atomic_dir(out) as tmp:
                result = run_serving_ab(serving, target=target, drafts=drafts, k=k,
                                        prompts=[p[0].tolist() for p in ids], out_dir=str(tmp),
                                        dtype=cfg.pair.dtype, decide=decide, log=self.log)
                write_text(tmp / "report.md", "# draftsmith serving A/B\n" + report_section(result))

        self._stage("serve", out, facts, body, inputs=inputs)

    def serving_path(self) -> Path | None:
        """DIR/serve/serving.json when the serving A/B is not off (serve.engine=none, or auto without vLLM) and the
        serve stage has a finished output (this run's, or an earlier one's with stages=[promote]), else None."""
        path = self.out / "serve" / "serving.json"
        if self.cfg.serve.engine == "none" or not (self.out / "serve" / "stage.json").exists() or not path.exists():
            return None
        return path

    def promote(self) -> None:
        from draftsmith.promote import promote

        cfg, out = self.cfg, self.out / "promote"
        inputs = {"eval": self._upstream("eval", self.out / "eval")}
        serving = self.serving_path()
        if serving is not None:
            inputs["serve"] = self._upstream("serve", self.out / "serve")

        def body(run):
            record = promote(cfg, self.out, self.registry(), run, serving_path=serving)
            if (record.get("registry") or {}).get("created") and run.run is not None and cfg.registry.kind != "wandb":
                # the version this promotion wrote: the draft's, or the training-free method's ("no draft needed")
                figures = (record.get("no_draft_needed") or record)["candidate"]
                log_draft_artifact(run, Path(record["registry"]["path"]), cfg.promote.name, figures)
            with atomic_dir(out) as tmp:
                write_json(tmp / "promotion.json", record)
            self.log(f"draftsmith: promote: {record['decision'].upper()} - "
                     + "; ".join(record["reasons"]))

        self._stage("promote", out, {}, body, inputs=inputs)

    # -- the whole run ----------------------------------------------------------------------
    def run(self) -> dict:
        self.out.mkdir(parents=True, exist_ok=True)
        for stage in ("datagen", "train", "eval", "serve", "promote"):
            if stage in self.cfg.stages:
                getattr(self, stage)()
        summary = self.summary()
        write_json(self.out / "summary.json", summary)
        return summary

    def summary(self) -> dict:
        """What the terminal table shows (see :func:`draftsmith.summary.summarize`)."""
        summary = summarize(self.out, self.ran)
        if self.serving_note is not None:
            summary["serving_off"] = self.serving_note
        return summary


def settings_of(section, settings_cls) -> dict:
    """The fields of `settings_cls` (a stage's settings dataclass) taken from a config section that extends it."""
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(settings_cls)}


def _link_dir(link: Path, target: Path) -> None:
    """Make `link` a symlink to `target`, replacing what is there (a stale directory or link) atomically."""
    if link.is_symlink() and link.resolve() == target.resolve():
        return
    if link.exists() and not link.is_symlink():
        shutil.rmtree(link)
    tmp = link.with_name(f".{link.name}.link-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target.resolve(), tmp, target_is_directory=True)
    os.replace(tmp, link)
