"""eval: measure drafts inside the real speculative loop on held-out prompts, next to plain decoding.

For each (draft, K, temperature), ``eval.repeats`` passes: a warm-up, then for every prompt one plain
run and every cell's speculative run (of that temperature) back to back, the order rotated by prompt
and pass, same max_new_tokens; each speculative run is paired with the prompt's plain run of its
pass, so one plain run serves every draft and K; cost ratios measured once per cell. The speedup's 95%
interval is a paired bootstrap over prompts and passes (eval/intervals.py). When a verdict is
undecided — eval/policy.py: the interval of a K that could be chosen straddles a promote gate's bar, or the
candidate's difference with production or with the best training-free method straddles its margin — passes are
added to those cells, up to ``eval.max_repeats`` or ``eval.time_budget_s`` (:func:`more_repeats`), unless the
promotion decides on the serving A/B (the contract's ``decided_here``): the verdicts are then reported as they
stand. Greedy cells also check speculative == plain output on every run (greedy_match) and time HF assisted
generation as a second engine (speed only, outputs compared).

A draft directory holding an EAGLE head (decode/eagle.py ``is_eagle_dir``: what ``method.finetune=eagle`` trains)
runs in :func:`~draftsmith.decode.loop.eagle_generate`, an EAGLE-3 folder (decode/eagle3.py ``is_eagle3_dir``:
``method.finetune=eagle3``) in :func:`~draftsmith.decode.loop.eagle3_generate` over its own draft vocabulary, in
the same cells and passes as draft models, their costs timed as those loops run them; HF assisted generation has
no EAGLE mode, so their cells have no HF A/B. A training-free proposer (``eval.baselines``: n-gram prompt lookup,
decode/ngram.py, the spec string ``ngram:MIN-MAX`` in place of a folder; vLLM's suffix decoding, decode/suffix.py,
``suffix``) runs in :func:`~draftsmith.decode.loop.ngram_generate` / ``suffix_generate`` in the same passes: the
figure a trained draft must beat.

Writes ``metrics.json`` (schema in :func:`run`'s docstring), ``report.md`` and PNG plots to
``cfg.out_dir`` atomically.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Optional
from pathlib import Path

import torch

from draftsmith.decode import (autoregressive_generate, eagle3_generate, eagle_generate, ngram_generate,
                               speculative_generate, suffix_generate)
from draftsmith.decode.eagle import EagleHead, is_eagle_dir, load_eagle
from draftsmith.decode.eagle3 import Eagle3Head, is_eagle3_dir, load_eagle3
from draftsmith.decode.ngram import NGram, is_ngram_spec, parse_ngram
from draftsmith.decode.free import is_suffix_spec
from draftsmith.decode.suffix import Suffix
from draftsmith.artifacts import atomic_dir, provenance
from draftsmith.artifacts.formats import read_datagen, write_metrics
from draftsmith.artifacts.errors import UserError, check
from draftsmith.decode.lean import measured_forms
from draftsmith.decode.runners import logit_width
from draftsmith.decode.eos import eos_token_id
from draftsmith.decode.pair import check_embedding_width, check_tokenizers, load_model, load_tokenizer
from draftsmith.artifacts.progress import progress
from draftsmith.decode.timing import cost_ratios, mid_decode_context
from draftsmith.eval.order import interleaved
from draftsmith.decode.vocab import VOCAB_FILE, datagen_vocab, save_vocab
from draftsmith.eval.settings import DecodeSettings, EvalSettings, with_training_free
from draftsmith.eval.intervals import Units, choose_k, difference_ci, narrowing, units_from_passes
from draftsmith.eval.policy import DECIDED_ON_SERVING, Contract, Roles, beyond_reach, to_measure, unsettled
from draftsmith.eval.metrics import CellRecord, cell_record, slowdown_warning

HEAD_KINDS = (EagleHead, Eagle3Head)  # drafts that read the target's features: run on its lean forward
NOT_MODELS = (*HEAD_KINDS, NGram, Suffix)  # proposers that are not a draft model: no HF assisted generation, no logit width

SCHEMA_VERSION = 1


@dataclass(kw_only=True)
class EvalConfig(EvalSettings, DecodeSettings):
    """An eval run: the eval and decode settings plus what the pipeline wires in.

    The prompts come from a datagen output's held-out split (`data_dir`) or from a JSONL file of
    token ids (`prompts_file`, one ``{"prompt_ids": [...]}`` per line: the pipeline writes one when
    eval runs without datagen).
    """

    target: str
    drafts: dict[str, str]  # name -> draft dir / hub id, e.g. {"trained": ..., "base": ...}
    out_dir: str
    data_dir: Optional[str] = None  # a datagen output: its held-out prompts are used
    prompts_file: Optional[str] = None  # or: a JSONL file of {"prompt_ids": [...]} records
    dtype: str = "float32"
    device: str = "cpu"
    decide: Optional[Contract] = None  # the verdicts to settle with added passes (eval/policy.py; the pipeline's
    # from promote.*); None, or its decided_here False (the promotion decides on the serving A/B): eval.repeats passes

    def __post_init__(self):
        EvalSettings.__post_init__(self)
        DecodeSettings.__post_init__(self)
        check(bool(self.drafts), "eval.drafts is empty: give at least one draft (name: path)")
        check((self.data_dir is None) != (self.prompts_file is None),
              "give the eval prompts as exactly one of data_dir (a datagen output) or prompts_file")


class EvalError(UserError, ValueError):
    """The eval's inputs cannot be used as given; the message names the file and what to do."""


def heldout_prompts(data_dir: str, n: int) -> list[torch.Tensor]:
    """The first `n` distinct held-out prompts of a datagen output, as [1, P] tensors.

    Reads the artifact through its format's reader (draftsmith.artifacts.formats), not train's code.
    """
    data, _ = read_datagen(data_dir, splits=("heldout",))
    rows = (row["prompt_ids"] for row in data["heldout"])
    prompts = _distinct(rows, n)
    if not prompts:
        raise EvalError(f"{data_dir}: the held-out split is empty; run datagen with data.heldout_fraction > 0")
    return prompts


def file_prompts(path: str, n: int) -> list[torch.Tensor]:
    """The first `n` distinct prompts of a JSONL file of ``{"prompt_ids": [...]}`` records, as [1, P] tensors."""
    import json

    if not Path(path).is_file():
        raise EvalError(f"eval prompts file {path} does not exist")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            record = json.loads(line) if line.strip() else None
            ids = record.get("prompt_ids") if isinstance(record, dict) else None
            if record is not None and not (isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)):
                raise EvalError(f"{path}:{line_no}: expected {{\"prompt_ids\": [token ids...]}}")
            if ids:
                rows.append(ids)
    prompts = _distinct(rows, n)
    if not prompts:
        raise EvalError(f"{path}: no prompts")
    return prompts


def _distinct(rows, n: int) -> list[torch.Tensor]:
    seen, prompts = set(), []
    for ids in rows:
        if tuple(ids) not in seen:
            seen.add(tuple(ids))
            prompts.append(torch.tensor([ids]))
        if len(prompts) == n:
            break
    return prompts


def eval_set_id(cfg: EvalConfig, prompts: list[torch.Tensor]) -> str:
    """A hash of what makes two evals' speedups comparable: target, prompts, lengths, K grid, and the decode
    settings that change speed or output (temperature, top-k/top-p, seed, forward backend, dtype, device,
    the draft vocabulary size).

    The promote stage compares a candidate with a production draft's recorded figures only when the ids match.
    """
    import hashlib
    import json

    fields = {"target": cfg.target, "prompts": [p[0].tolist() for p in prompts], "max_new": cfg.max_new_tokens,
              "k": list(cfg.k), "temperature": list(cfg.temperature), "top_k": cfg.top_k, "top_p": cfg.top_p,
              "seed": cfg.seed, "backend": cfg.backend, "dtype": cfg.dtype, "device": cfg.device}
    if cfg.draft_vocab:  # only when set, so that the ids of evals with the full vocabulary stay what they were
        fields["draft_vocab"] = cfg.draft_vocab
    blob = json.dumps(fields)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_draft(path: str, name: str, target, tokenizer, cfg: EvalConfig):
    """The draft `name` at `path`, checked against the target: a draft model (same tokenizer, embedding wide
    enough), or an EAGLE head (decode/eagle.py; an EAGLE-3 folder, decode/eagle3.py), which shares the target's
    embedding (EAGLE-1: and its head) and needs the target
    on the lean forward (Llama family; decode.backend not hf); the tokenizer saved beside it, when there is one
    (the train stage saves the target's), must be the target's."""
    if is_suffix_spec(path):  # vLLM's suffix decoding (eval.baselines): a tree per decode, nothing to load
        return Suffix()
    if is_ngram_spec(path):  # training-free: nothing to load (eval.baselines)
        try:
            return parse_ngram(path, key=f"eval draft {name!r}")
        except ValueError as exc:
            raise EvalError(str(exc)) from None
    eagle3 = is_eagle3_dir(path)
    if not is_eagle_dir(path) and not eagle3:
        check_tokenizers(tokenizer, load_tokenizer(path, f"draft {name!r}"), cfg.target, path)
        draft = load_model(path, f"draft {name!r}", cfg.dtype, cfg.device)
        check_embedding_width(draft, tokenizer, path)
        return draft
    from draftsmith.decode.lean import lean_unsupported

    if cfg.backend == "hf":  # its cells would run the target on the lean forward, their plain baseline on HF's
        raise EvalError(f"draft {name!r} ({path}) is an EAGLE head, which draftsmith's loop runs on the target's lean "
                        "forward, so its speedup would be measured against another forward's plain decoding: set "
                        "decode.backend=auto (or lean)")
    reason = lean_unsupported(target)
    if reason is not None:
        raise EvalError(f"draft {name!r} ({path}) is an EAGLE head, which draftsmith's loop runs on the target's lean "
                        f"forward, but {reason}; evaluate a draft model instead")
    if (Path(path) / "tokenizer_config.json").exists():  # the train stage saves the target's tokenizer beside it
        check_tokenizers(tokenizer, load_tokenizer(path, f"draft {name!r}"), cfg.target, path)
    try:
        return load_eagle3(path, target) if eagle3 else load_eagle(path, target)
    except (ValueError, RuntimeError, OSError) as exc:
        raise EvalError(f"draft {name!r}: the EAGLE head at {path} does not fit the target {cfg.target!r} ({exc}); "
                        f"train the head on this target (method.finetune={'eagle3' if eagle3 else 'eagle'})") from exc


def hf_assisted_generate(target, draft, prompt, k: int, max_new: int, eos, pad_id) -> tuple[torch.Tensor, float]:
    """Greedy HF assisted generation with a constant K and no confidence cut-off -> (sequence, seconds)."""
    gc = draft.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = k, "constant", 0.0
    start = time.perf_counter()
    out = target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=draft, do_sample=False,
                          max_new_tokens=max_new, eos_token_id=eos, pad_token_id=pad_id)
    return out, time.perf_counter() - start


@dataclass
class Cell:
    """The runs of one (draft, K, temperature) cell so far: every repeat's plain and speculative runs side by side."""

    draft: str
    k: int
    temperature: float
    base: list = field(default_factory=list)  # DecodeStats of the plain runs, repeat-major
    spec: list = field(default_factory=list)  # SpeculativeStats of the speculative runs, repeat-major
    plain_s: list = field(default_factory=list)  # [repeat][prompt] wall seconds of the plain run
    spec_s: list = field(default_factory=list)  # [repeat][prompt] wall seconds of the speculative run
    equal: list = field(default_factory=list)  # greedy: speculative output == plain output, per run
    costs: Optional[dict] = None  # cost_ratios() at this K, measured once
    hf: Optional[dict] = None  # the HF assisted-generation A/B (greedy cells, first repeat)

    @property
    def repeats(self) -> int:
        return len(self.plain_s)

    def units(self) -> Units:
        return units_from_passes(self.plain_s, self.spec_s)

    def record(self) -> CellRecord:
        return cell_record(self.k, self.temperature, self.base, self.spec, self.costs["c"][self.k],
                           self.costs["c_v"][self.k], self.equal if self.temperature == 0 else None,
                           units=self.units(), repeats=self.repeats)


def measure_repeat(cfg: EvalConfig, target, drafts: dict, prompts, cells: list[Cell], eos, pad_id,
                   draft_vocab: torch.Tensor | None = None, desc: Optional[str] = None) -> None:
    """One more pass of `cells` over every prompt: a warm-up, then per prompt one plain run and every cell's
    speculative run back to back, in the order of eval/order.py interleaved (rotated by prompt and pass, reversed
    on every other prompt: no run always goes first or last, or before the plain one); each speculative run is
    paired with that prompt's plain run, so one plain run serves every cell (their
    speedups share the baseline they are measured against, as they would on one machine at one moment).

    `cells`: one temperature and as many passes each (:func:`same_pass`); `drafts`: name -> model. The first pass
    also measures each cell's cost ratios and (greedy cells, eval.hf_ab) times HF assisted generation.
    `draft_vocab`: the ids the draft may propose (eval.draft_vocab), None for its full vocabulary; HF assisted
    generation always runs the full one. Sampling runs draw from one generator seeded with seed + pass.
    `desc`: a progress bar over the prompts."""
    r, temperature = cells[0].repeats, cells[0].temperature
    if any(c.repeats != r or c.temperature != temperature for c in cells):
        raise ValueError("measure_repeat: the cells of one pass need one temperature and as many passes each")
    gen = torch.Generator(device=prompts[0].device).manual_seed(cfg.seed + r)
    common = dict(max_new_tokens=cfg.max_new_tokens, temperature=temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                  eos_token_id=eos, generator=gen, backend=cfg.backend)

    def spec(cell: Cell, prompt, **kw):
        draft = drafts[cell.draft]
        if isinstance(draft, NGram):  # prompt lookup: no model proposes
            return ngram_generate(target, draft, prompt, k=cell.k, **{**common, **kw})
        if isinstance(draft, Suffix):  # suffix decoding: nor here
            return suffix_generate(target, prompt, k=cell.k, **{**common, **kw})
        if isinstance(draft, HEAD_KINDS):  # the target's own lean forward hands the head its features
            eagle_kw = {key: value for key, value in {**common, **kw}.items() if key != "backend"}
            if isinstance(draft, Eagle3Head):  # its own draft vocabulary (d2t), not eval.draft_vocab
                return eagle3_generate(target, draft, prompt, k=cell.k, **eagle_kw)
            return eagle_generate(target, draft, prompt, k=cell.k, draft_vocab=draft_vocab, **eagle_kw)
        return speculative_generate(target, draft, prompt, k=cell.k, draft_vocab=draft_vocab, **{**common, **kw})

    for _ in range(cfg.warmup):
        autoregressive_generate(target, prompts[0], **{**common, "max_new_tokens": 8})
        for cell in cells:
            spec(cell, prompts[0], max_new_tokens=8)
    plain_s, spec_s = [], {id(c): [] for c in cells}
    hf_s, hf_equal = {id(c): 0.0 for c in cells}, {id(c): True for c in cells}
    for i, prompt in enumerate(progress(prompts, desc=desc, unit="prompt") if desc else prompts):
        runs = [None, *cells]  # None: the plain run
        order = interleaved(len(runs), rotate=i + r, reverse=(i + r) % 2 == 1)
        outs = {("plain" if cell is None else id(cell)):
                (autoregressive_generate(target, prompt, **common) if cell is None else spec(cell, prompt))
                for cell in (runs[j] for j in order)}
        plain = outs["plain"]
        plain_s.append(plain.stats.total_s)
        for cell in cells:
            out = outs[id(cell)]
            cell.base.append(plain.stats)
            cell.spec.append(out.stats)
            spec_s[id(cell)].append(out.stats.total_s)
            if temperature == 0:
                cell.equal.append(torch.equal(plain.sequences, out.sequences))
                if cfg.hf_ab and r == 0 and not isinstance(drafts[cell.draft], NOT_MODELS):
                    seq, sec = hf_assisted_generate(target, drafts[cell.draft], prompt, cell.k, cfg.max_new_tokens,
                                                    eos, pad_id)
                    hf_s[id(cell)] += sec
                    hf_equal[id(cell)] &= torch.equal(seq.cpu(), plain.sequences.cpu())
    for cell in cells:
        cell.plain_s.append(list(plain_s))
        cell.spec_s.append(spec_s[id(cell)])
        if cell.costs is None:
            cell.costs = cost_ratios(target, drafts[cell.draft], mid_decode_context(prompts[0], cfg.max_new_tokens),
                                     [cell.k], repeats=cfg.cost_repeats, backend=cfg.backend, draft_vocab=draft_vocab)
        if r == 0 and temperature == 0 and cfg.hf_ab and not isinstance(drafts[cell.draft], NOT_MODELS):
            tokens = sum(s.new_tokens for s in cell.base)
            cell.hf = {"tokens_per_s": tokens / hf_s[id(cell)] if hf_s[id(cell)] else 0.0,
                       "outputs_equal": hf_equal[id(cell)], "plain_tokens": tokens, "plain_s": sum(plain_s)}


def same_pass(cells: list[Cell]) -> list[list[Cell]]:
    """`cells` grouped so that each group can run as one pass (:func:`measure_repeat`): one temperature and as many
    passes taken, in the order first seen."""
    groups: dict = {}
    for cell in cells:
        groups.setdefault((cell.temperature, cell.repeats), []).append(cell)
    return list(groups.values())


def cell_entry(cell: Cell, record: CellRecord) -> dict:
    """A cell's metrics.json entry: the record's fields, the costs, the backends, the per-run timings, the HF A/B."""
    out = asdict(record)
    out.update(c=cell.costs["c"][cell.k], c_v=cell.costs["c_v"][cell.k],
               backend={"target": cell.spec[0].backend, "draft": cell.spec[0].draft_backend},
               timings={"plain_s": cell.plain_s, "spec_s": cell.spec_s})
    if cell.hf is not None:
        hf_tps = cell.hf["tokens_per_s"]
        first_spec_tps = cell.hf["plain_tokens"] / sum(cell.spec_s[0]) if sum(cell.spec_s[0]) else 0.0
        out["hf_assisted"] = {"tokens_per_s": hf_tps, "outputs_equal": cell.hf["outputs_equal"],
                              "draftsmith_vs_hf": first_spec_tps / hf_tps if hf_tps else None}
    return out


class _Pass:
    """The eval's cells at the lowest temperature as eval/policy.py reads them: the K rule is choose_k over the
    prompts' paired times (its bars the contract's), a cell's interval its record's, the difference of two cells
    the paired bootstrap over the prompts both ran (eval/intervals.py difference_ci), the reach of passes up to
    `max_repeats` sqrt(repeats / max_repeats) (optimistic: a pass repeats the same prompts)."""

    def __init__(self, cells: list[Cell], temperature: float, bars, max_repeats: int = 0):
        self.cells = {(c.draft, c.k): c for c in cells if c.temperature == temperature}
        self.bars = tuple(bars) or (1.0,)
        self.max_repeats = max_repeats

    def choice(self, name: str):
        mine = {k: c for (n, k), c in self.cells.items() if n == name}
        if not mine:
            return None
        choice = choose_k({k: c.units() for k, c in mine.items()}, bars=self.bars)
        return choice["k"], list(choice["indistinguishable"])

    def speedup(self, cell):
        return self.cells[cell].record().speedup

    def interval(self, cell):
        return self.cells[cell].record().speedup_ci95

    def difference(self, a, b):
        return difference_ci(self.cells[a].units(), self.cells[b].units())

    def reach(self, cells):
        return min(narrowing(self.cells[c].repeats, self.max_repeats) for c in cells)


def undecided(cfg: EvalConfig, cells: list[Cell], *, worth: bool = False) -> list[Cell]:
    """The cells whose verdict is still open (eval/policy.py unsettled, at the lowest temperature; empty without a
    bar in ``cfg.decide``); `worth`: only those the passes left up to eval.max_repeats could settle (to_measure)."""
    if cfg.decide is None:
        return []
    view = _Pass(cells, min(cfg.temperature), cfg.decide.at, cfg.max_repeats)
    roles = Roles.of(with_training_free(cfg.drafts, cfg.baselines, "eval.baselines"))
    return [view.cells[c] for c in (to_measure if worth else unsettled)(view, roles, cfg.decide)]


def more_repeats(cfg: EvalConfig, cells: list[Cell], measure, started: float, clock=time.monotonic) -> dict:
    """Add passes to the undecided cells (:func:`undecided`) until every verdict is decided, each has
    eval.max_repeats passes, the passes left could not settle what is open (eval/policy.py to_measure), or
    eval.time_budget_s (counted from `started`) is spent; `measure(cells)` runs one pass of each of them side by
    side (one group of :func:`same_pass`). None when the promotion decides on the serving A/B (the contract's
    ``decided_here`` False): the verdicts are reported as they stand.

    -> metrics.json's "repeats": {"initial", "max", "time_budget_s", "rounds" (added passes), "seconds",
    "stopped": why it stopped, "undecided": the cells still undecided ("draft K=k")}.
    """
    rounds = 0
    while True:
        todo = undecided(cfg, cells)
        if not todo:
            stopped = "decided" if cfg.decide and cfg.decide.at else "no verdict to settle (no decision contract)"
            break
        if not cfg.decide.decided_here:
            stopped = DECIDED_ON_SERVING
            break
        if all(c.repeats >= cfg.max_repeats for c in todo):
            stopped = f"eval.max_repeats={cfg.max_repeats} reached"
            break
        room = [c for c in undecided(cfg, cells, worth=True) if c.repeats < cfg.max_repeats]
        if not room:
            stopped = beyond_reach("eval.max_repeats", cfg.max_repeats)
            break
        if cfg.time_budget_s and clock() - started >= cfg.time_budget_s:
            stopped = f"eval.time_budget_s={cfg.time_budget_s:g} spent"
            break
        for group in same_pass(room):
            measure(group)
        rounds += 1
    return {"initial": cfg.repeats, "max": cfg.max_repeats, "time_budget_s": cfg.time_budget_s, "rounds": rounds,
            "seconds": clock() - started, "stopped": stopped,
            "undecided": [f"{c.draft} K={c.k}" for c in todo]}


def run(cfg: EvalConfig) -> dict:
    """Evaluate every draft on the K x temperature grid; returns the metrics written to metrics.json.

    metrics.json: {"schema_version", "config", "prompts" (count), "eval_set" (hash of target, prompts
    and grid: equal hashes mean comparable numbers), "records": [one per draft x K x temperature, with
    "draft", every CellRecord field, "c", "c_v", "backend" (the cached forward that ran target and
    draft: "lean" or "hf") and "hf_assisted" for greedy cells],
    "summary": {draft: {"best_k", "speedup", "acceptance_rate", "token_acceptance", "token_acceptance_ci95",
    "mean_accepted_tokens", "greedy_match", "backend"} at best K of the lowest temperature}, "warnings": [...],
    with every cell's "speedup_ci95" ([lo, hi] or None), "repeats" and "timings" ({"plain_s", "spec_s"}:
    [repeat][prompt] wall seconds, paired); the summary's best K by eval/intervals.py choose_k ("k_choice":
    leader, indistinguishable K, rule); "repeats": how many passes were added and why they stopped (more_repeats),
    "draft_vocab" (None, or with eval.draft_vocab: {"size", "source", "ranked_from_tokens", "heldout_coverage"};
    the ids in draft_vocab.json beside metrics.json), "provenance"}.
    """
    from draftsmith.eval.report import write_report

    tokenizer = load_tokenizer(cfg.target, "target")
    target = load_model(cfg.target, "target", cfg.dtype, cfg.device)
    prompts = (heldout_prompts(cfg.data_dir, cfg.max_prompts) if cfg.data_dir else
               file_prompts(cfg.prompts_file, cfg.max_prompts))
    prompts = [p.to(cfg.device) for p in prompts]
    eos = eos_token_id(target.generation_config, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    drafts = {}
    for name, path in with_training_free(cfg.drafts, cfg.baselines, "eval.baselines").items():  # every draft
        # checked before any timing starts
        drafts[name] = load_draft(path, name, target, tokenizer, cfg)
    vocab, vocab_info = None, None
    if cfg.draft_vocab:  # one vocabulary for every draft, ranked from what the target says
        width = min(logit_width(m) for m in [target, *drafts.values()] if not isinstance(m, NOT_MODELS))
        vocab, vocab_info = datagen_vocab(cfg.data_dir, cfg.draft_vocab, width, eos)
        vocab = vocab.to(cfg.device)

    cells = [Cell(n, k, t) for n in drafts for t in cfg.temperature for k in cfg.k]
    started = time.monotonic()
    for r in range(cfg.repeats):  # every cell's first passes: per temperature, every cell beside one plain run
        for group in same_pass(cells):
            measure_repeat(cfg, target, drafts, prompts, group, eos, pad_id, vocab,
                           desc=f"eval (pass {r + 1} of {cfg.repeats})")
    stopping = more_repeats(cfg, cells, lambda group: measure_repeat(cfg, target, drafts, prompts, group, eos, pad_id,
                                                                    vocab, desc="eval (an added pass)"), started)
    records, cell_records, warnings = [], [], []
    for cell in cells:
        record = cell.record()
        records.append({"draft": cell.draft, **cell_entry(cell, record)})
        cell_records.append((cell.draft, record))
        warning = slowdown_warning(record)
        if warning:
            warnings.append(f"draft {cell.draft!r}, {warning}")
    summary = {}
    for name in drafts:
        temp = min(cfg.temperature)
        mine = {c.k: c for c in cells if c.draft == name and c.temperature == temp}
        choice = choose_k({k: c.units() for k, c in mine.items()}, bars=(cfg.decide.at if cfg.decide else ()) or (1.0,))
        best = next(r for n, r in cell_records if n == name and r.temperature == temp and r.k == choice["k"])
        entry = next(e for (_, r), e in zip(cell_records, records) if r is best)  # its metrics.json entry
        summary[name] = {"best_k": choice["k"], "temperature": temp, "speedup": best.speedup,
                         "speedup_ci95": best.speedup_ci95, "repeats": best.repeats,
                         "k_choice": {key: choice[key] for key in ("leader", "indistinguishable", "rule")},
                         "acceptance_rate": best.acceptance_rate, "token_acceptance": best.token_acceptance,
                         "token_acceptance_ci95": best.token_acceptance_ci95,
                         "mean_accepted_tokens": best.mean_accepted_tokens, "greedy_match": best.greedy_match,
                         "backend": entry["backend"]}
    metrics = {"schema_version": SCHEMA_VERSION, "config": asdict(cfg), "prompts": len(prompts),
               "eval_set": eval_set_id(cfg, prompts), "draft_vocab": vocab_info,
               "records": records, "summary": summary, "repeats": stopping, "warnings": warnings,
               "block_forms": measured_forms(), "provenance": provenance()}
    with atomic_dir(cfg.out_dir) as tmp:
        write_metrics(tmp, metrics)
        if vocab is not None:
            save_vocab(tmp / VOCAB_FILE, vocab.cpu(), **vocab_info)
        write_report(metrics, tmp)
    return metrics


