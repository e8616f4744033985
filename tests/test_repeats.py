"""The eval's added passes (eval/runner.py more_repeats / undecided): straddle -> more passes -> decided or
inconclusive at eval.max_repeats / eval.time_budget_s. Cells with synthetic timings, no models."""

import random

from draftsmith.decode.stats import DecodeStats, SpeculativeStats
from draftsmith.eval.policy import Contract
from draftsmith.eval.runner import Cell, EvalConfig, more_repeats, undecided

PROMPTS = 6


def config(**kw) -> EvalConfig:
    base = dict(target="t", drafts={"trained": "d"}, out_dir="o", prompts_file="p.jsonl", k=[2], repeats=1,
                max_repeats=5, decide=Contract(at=(1.0, 1.1)), baselines=[])
    return EvalConfig(**{**base, **kw})


SPREAD = [0.8, 1.5] * (PROMPTS // 2)  # per-prompt speedups whose pooled ratio (1.04) no repeat can pin down


class Timer:
    """measure(cell): one pass of PROMPTS prompts; prompt i's speedup is `speedup[(draft, k)]` (a number, or a
    list per prompt: prompts that differ) times run-to-run noise (uniform, +-`noise` on each time)."""

    def __init__(self, speedup: dict, noise: float, seed: int = 0):
        self.speedup, self.noise, self.rng, self.calls = speedup, noise, random.Random(seed), []

    def __call__(self, cells: list[Cell]) -> None:
        for cell in cells:
            self.one(cell)

    def one(self, cell: Cell) -> None:
        self.calls.append((cell.draft, cell.k))
        plain, spec = [], []
        given = self.speedup[(cell.draft, cell.k)]
        for i in range(PROMPTS):
            speedup = given[i] if isinstance(given, list) else given
            p = 1.0 + self.rng.uniform(-self.noise, self.noise)
            s = 1.0 / speedup * (1.0 + self.rng.uniform(-self.noise, self.noise))
            plain.append(p)
            spec.append(s)
            cell.base.append(DecodeStats(new_tokens=8, target_forwards=8, ttft_s=0.1, total_s=p))
            st = SpeculativeStats(k=cell.k, drafted_per_position=[0] * cell.k, accepted_per_position=[0] * cell.k)
            st.record_round(cell.k, cell.k)
            st.new_tokens, st.total_s, st.ttft_s = 8, s, 0.1
            cell.spec.append(st)
        cell.plain_s.append(plain)
        cell.spec_s.append(spec)
        cell.costs = {"c": {cell.k: 0.1}, "c_v": {cell.k: 1.0}}


def cells_after_first_pass(cfg, timer):
    cells = [Cell(name, k, 0.0) for name in cfg.drafts for k in cfg.k]
    timer(cells)
    return cells


def test_a_clear_verdict_takes_no_more_passes():
    cfg = config()
    timer = Timer({("trained", 2): 1.6}, noise=0.02)
    cells = cells_after_first_pass(cfg, timer)
    stop = more_repeats(cfg, cells, timer, started=0.0, clock=lambda: 1.0)
    assert stop["rounds"] == 0 and stop["stopped"] == "decided" and stop["undecided"] == []
    assert cells[0].repeats == 1


def test_a_straddling_cell_the_budget_cannot_settle_takes_no_pass_and_stays_undecided():
    """Prompts that straddle the bar: the interval after one pass, [0.80, 1.52], narrowed by the most three more
    passes could do (sqrt(1/4)), still holds 1.0 and 1.1: no pass is spent on it."""
    cfg = config(max_repeats=4)
    timer = Timer({("trained", 2): SPREAD}, noise=0.02)  # prompts straddle the bar: no number of passes settles it
    cells = cells_after_first_pass(cfg, timer)
    assert undecided(cfg, cells) == cells and undecided(cfg, cells, worth=True) == []
    stop = more_repeats(cfg, cells, timer, started=0.0, clock=lambda: 1.0)
    assert cells[0].repeats == 1 and stop["rounds"] == 0 and stop["undecided"] == ["trained K=2"]
    assert stop["stopped"].startswith("the passes left up to eval.max_repeats=4 could not settle it")
    # a larger budget is tried (its optimistic reach could settle it) until what is left could not
    cfg = config(max_repeats=20)
    cells = cells_after_first_pass(cfg, timer)
    stop = more_repeats(cfg, cells, timer, started=0.0, clock=lambda: 1.0)
    assert 1 < cells[0].repeats < 20 and stop["stopped"].startswith("the passes left up to eval.max_repeats=20")


def test_a_cell_the_budget_could_settle_is_measured_until_max_repeats():
    """[0.93, 1.60] about 1.27 after one pass: narrowed by sqrt(1/2) it would clear 1.0 (not 1.1), so the one pass
    left is taken; the interval, [1.08, 1.55], then still straddles 1.1, and the budget is spent."""
    cfg = config(max_repeats=2)
    timer = Timer({("trained", 2): 1.25}, noise=0.3, seed=1)
    cells = cells_after_first_pass(cfg, timer)
    stop = more_repeats(cfg, cells, timer, started=0.0, clock=lambda: 1.0)
    assert cells[0].repeats == 2 and stop["rounds"] == 1
    assert stop["stopped"] == "eval.max_repeats=2 reached" and stop["undecided"] == ["trained K=2"]


def test_more_passes_settle_a_noisy_but_clear_gain():
    cfg = config(max_repeats=12)
    timer = Timer({("trained", 2): 1.35}, noise=0.5, seed=3)
    cells = cells_after_first_pass(cfg, timer)
    assert undecided(cfg, cells)  # one noisy pass straddles 1.1
    stop = more_repeats(cfg, cells, timer, started=0.0, clock=lambda: 1.0)
    assert stop["stopped"] == "decided" and 1 < cells[0].repeats <= 12
    assert cells[0].record().speedup_ci95[0] >= 1.1


def test_no_pass_is_added_where_the_promotion_decides_on_the_serving_ab():
    """The contract's decided_here False (the pipeline with the serving A/B on vLLM): the noisy but clear gain above,
    which passes would settle, takes none; it is reported undecided, with why no pass was added."""
    cfg = config(max_repeats=12, decide=Contract(at=(1.0, 1.1), decided_here=False))
    timer = Timer({("trained", 2): 1.35}, noise=0.5, seed=3)
    cells = cells_after_first_pass(cfg, timer)
    assert undecided(cfg, cells, worth=True)  # passes could settle it
    stop = more_repeats(cfg, cells, timer, started=0.0, clock=lambda: 1.0)
    assert cells[0].repeats == 1 and stop["rounds"] == 0 and timer.calls == [("trained", 2)]
    assert stop["stopped"] == "no passes added: the promotion decides on the serving A/B"
    assert stop["undecided"] == ["trained K=2"]


def test_the_time_budget_stops_the_passes():
    cfg = config(max_repeats=50, time_budget_s=10.0)
    timer = Timer({("trained", 2): SPREAD}, noise=0.02)
    cells = cells_after_first_pass(cfg, timer)
    ticks = iter(range(0, 1000, 4))  # 4 s per look at the clock
    stop = more_repeats(cfg, cells, timer, started=0.0, clock=lambda: next(ticks))
    assert stop["stopped"] == "eval.time_budget_s=10 spent" and cells[0].repeats < 50


def test_only_the_candidate_and_production_and_choosable_k_get_passes():
    cfg = config(drafts={"trained": "d", "base": "b", "production": "p"}, k=[2, 4], decide=Contract(at=(1.0, 1.1), margin=0.02))
    speed = {("trained", 2): 1.5, ("trained", 4): 2.4, ("base", 2): SPREAD, ("base", 4): SPREAD,
             ("production", 2): 1.5, ("production", 4): 2.4}
    timer = Timer(speed, noise=0.2)
    cells = cells_after_first_pass(cfg, timer)
    todo = {(c.draft, c.k) for c in undecided(cfg, cells)}
    # base straddles 1.1 but decides nothing; trained K=2 is clearly slower than K=4 (not choosable); the
    # candidate-vs-production difference (~0) straddles the margin: both chosen cells get passes
    assert todo == {("trained", 4), ("production", 4)}
    assert undecided(config(drafts=cfg.drafts, k=[2, 4], decide=Contract()), cells) == []
    assert undecided(config(drafts=cfg.drafts, k=[2, 4], decide=None), cells) == []
