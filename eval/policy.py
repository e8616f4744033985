"""The decision contract and the one policy both measurement engines follow: is every verdict the promotion will
take settled, and if not, which cells to measure more.

The batch-1 eval (eval/runner.py) and the serving A/B (eval/serving.py) measure cells — a proposer (a draft, or a
training-free method) at a K, speculation on beside off — and each asks the same question after every pass: which
cells could still change the promotion's answer? Those are, among the cells of the promotion candidate
(eval/settings.py candidate_name), the production draft and the best training-free method:

- every K that could be chosen for the candidate or production (its K rule's indistinguishable set) whose speedup
  interval straddles, or has none against, a bar of ``at`` (the promote gate's ``min_speedup``);
- the candidate's and production's chosen cells when the interval of their paired difference straddles
  ``margin`` (the champion gate);
- the candidate's and the fastest training-free method's chosen cells when that method may pay (its speedup's
  interval not wholly at or below 1) and the interval of their difference straddles ``free_margin`` (the
  training-free gate).

An open verdict is worth more passes only where the budget left could settle it (:func:`to_measure`): its
interval, narrowed about its centre as far as the passes still allowed could narrow it (the view's
:meth:`View.reach`, an optimistic bound), would clear the bar. Where even that would leave the bar inside, the
verdict stays open ("inconclusive") without spending the rest of the budget on it.

The engines differ only in how they read their cells — the K rule, a cell's interval, the paired difference of
two cells, how far the passes left could narrow an interval — which each hands the policy as a :class:`View`; how
many passes a cell may take, and what one costs (a prompt pass, a server life), stays theirs. The policy is pure:
tests drive it with hand-made views.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Protocol

from draftsmith.eval.intervals import BELOW, STRADDLES, UNKNOWN, verdict

Cell = tuple[str, int]  # (proposer name, K)
# why the batch-1 eval added no passes where its contract's decided_here is False (metrics.json "repeats")
DECIDED_ON_SERVING = "no passes added: the promotion decides on the serving A/B"


@dataclass(frozen=True)
class Contract:
    """What the promotion will decide, so that the engines measure until it is settled: built once by the pipeline
    from ``promote.*`` (:meth:`of`) and handed to the eval and to the serving A/B alike."""

    at: tuple[float, ...] = ()  # the speedup bars (promote.min_speedup); () = no verdict to settle
    margin: Optional[float] = None  # candidate - production (promote.champion_margin), when production is measured
    free_margin: Optional[float] = None  # candidate - best training-free method (promote.free_margin), when any
    concurrency: Optional[int] = None  # serving: the level decided at (promote.serving_concurrency; None: lowest)
    schedule: bool = True  # serving: measure the K schedule a promotion exports (promote.k_schedule)
    # the batch-1 eval: whether the promotion decides on its cells; False when the serving A/B on vLLM runs (the
    # promotion decides on that), so the eval reports its verdicts and spends no passes settling them
    decided_here: bool = True

    @classmethod
    def of(cls, promote, *, production: bool, free: bool) -> "Contract":
        """The contract of the ``promote.*`` settings `promote`; `production` / `free`: whether a production draft /
        a training-free method is measured beside the candidate (else their gates have nothing to settle)."""
        return cls(at=(float(promote.min_speedup),), margin=promote.champion_margin if production else None,
                   free_margin=promote.free_margin if free else None, concurrency=promote.serving_concurrency,
                   schedule=promote.k_schedule)


    def facts(self) -> dict:
        """What a stage's hash covers of the contract: its fields, ``decided_here`` only when False (the batch-1
        eval's alone; the serve stage and an eval that settles its own verdicts hash as before the field)."""
        out = asdict(self)
        if self.decided_here:
            del out["decided_here"]
        return out

    def at_batch1(self, *, decided_here: bool = True) -> "Contract":
        """The contract without its serving-only parts (the level decided at, the schedule column): what the
        batch-1 eval settles, so that a change of them re-runs serve and promote, never the eval. `decided_here`:
        whether the promotion decides on the batch-1 cells (not when the serving A/B runs)."""
        return Contract(at=self.at, margin=self.margin, free_margin=self.free_margin, decided_here=decided_here)


class View(Protocol):
    """One engine's cells as the policy reads them (at the decision point: the lowest temperature at batch 1, the
    decision concurrency on vLLM)."""

    def choice(self, name: str) -> Optional[tuple[int, list[int]]]:
        """(the K the K rule picks, every K it could pick on other measurements), None when `name` has no cell."""

    def speedup(self, cell: Cell) -> Optional[float]:
        """The cell's pooled speedup."""

    def interval(self, cell: Cell) -> Optional[list[float]]:
        """The 95% interval of the cell's speedup, None when there is none yet."""

    def difference(self, a: Cell, b: Cell) -> Optional[list[float]]:
        """The 95% interval of a's speedup minus b's, paired (the same prompts / requests), None when there is none."""

    def reach(self, cells: tuple[Cell, ...]) -> float:
        """At best, the factor (0 to 1) by which the width of an interval over `cells` narrows when they take every
        pass the budget still allows (1.0: no pass left); optimistic, so that a verdict is given up only when even
        that could not settle it."""


@dataclass(frozen=True)
class Roles:
    """Which measured proposer plays which part in the promotion."""

    candidate: Optional[str]  # what the promotion decides on
    production: Optional[str] = None  # the registry's production draft, measured beside it
    free: tuple[str, ...] = ()  # the training-free methods measured beside it
    recordable: tuple[str, ...] = ()  # those of them promotion may record as "no draft needed" (decode/free.py)

    @classmethod
    def of(cls, proposers: dict) -> "Roles":
        """The roles among `proposers` (name -> a draft's folder, or a training-free method's spec string,
        decode/free.py): the candidate is eval/settings.py candidate_name's, production is "production" (a draft,
        or a training-free method the registry recorded: then the champion, not a rival), the other spec strings
        are the free rivals, and those of them promotion may record (prompt lookup, not suffix decoding) are
        `recordable`."""
        from draftsmith.decode.free import is_free_spec, recordable
        from draftsmith.eval.settings import candidate_name

        production = "production" if "production" in proposers else None
        free = tuple(n for n, spec in proposers.items() if is_free_spec(str(spec)) and n != production)
        return cls(candidate=candidate_name(proposers), production=production, free=free,
                   recordable=tuple(n for n in free if recordable(str(proposers[n]))))


def free_may_be_recorded(view: View, roles: Roles, contract: Contract) -> Optional[Cell]:
    """The fastest training-free method's chosen cell when the promotion may record it as "no draft needed" (it
    does so for a refused candidate whose rival clears the same gates): the method may pay, and the candidate's
    verdict is settled against it — its chosen cell's interval wholly below a bar, or the paired difference with
    the rival (``free_margin``) or with production (``margin``) wholly below its margin; else None. The promotion
    decides; this says only whether the rival's own configuration (its K schedule) is worth serving to measure.
    The rival is the fastest method promotion may record (``roles.recordable``); the candidate's verdict may be
    settled against any rival (suffix decoding, which is not recorded, included)."""
    if not contract.at or contract.free_margin is None or roles.candidate is None:
        return None
    choice, free = view.choice(roles.candidate), rival(view, roles, among=roles.recordable)
    if choice is None or free is None or not may_pay(view, free):
        return None
    mine = (roles.candidate, choice[0])
    refused = any(verdict(view.interval(mine), bar) == BELOW for bar in contract.at)
    fastest = rival(view, roles)
    refused = refused or any(verdict(view.difference(mine, other), contract.free_margin) == BELOW
                             for other in dict.fromkeys((free, fastest)) if other is not None)
    theirs = view.choice(roles.production) if contract.margin is not None and roles.production else None
    if theirs is not None:
        refused = refused or verdict(view.difference(mine, (roles.production, theirs[0])), contract.margin) == BELOW
    return free if refused else None


def _open(ci: Optional[list[float]], bar: float) -> bool:
    return verdict(ci, bar) in (STRADDLES, UNKNOWN)


def may_pay(view: View, cell: Cell) -> bool:
    """Whether a training-free method's cell is a rival: unless its speedup's interval is wholly at or below 1."""
    return verdict(view.interval(cell), 1.0) != BELOW


def rival(view: View, roles: Roles, among: Optional[tuple[str, ...]] = None) -> Optional[Cell]:
    """The fastest training-free method's chosen cell (of `among`'s methods when given, else of all), or None (none
    measured)."""
    best = None
    for name in roles.free if among is None else among:
        choice = view.choice(name)
        if choice is None:
            continue
        cell = (name, choice[0])
        speed = view.speedup(cell)
        if speed is not None and (best is None or speed > best[0]):
            best = (speed, cell)
    return best and best[1]


Check = tuple[tuple[Cell, ...], Optional[list[float]], float]  # (the cells measured for it, its interval, the bar)


def _checks(view: View, roles: Roles, contract: Contract) -> list[Check]:
    """Every verdict of `contract` as (its cells, its interval, the bar the interval must clear), in a stable order
    (module docstring); [] without a bar."""
    if not contract.at:
        return []
    checks: list[Check] = []
    chosen: dict[str, Cell] = {}
    for name in (roles.candidate, roles.production):
        choice = view.choice(name) if name else None
        if choice is None:
            continue
        chosen[name] = (name, choice[0])
        checks += [(((name, k),), view.interval((name, k)), bar) for k in choice[1] for bar in contract.at]
    mine = chosen.get(roles.candidate)
    if contract.margin is not None and mine and roles.production in chosen:
        theirs = chosen[roles.production]
        checks.append(((mine, theirs), view.difference(mine, theirs), contract.margin))
    free = rival(view, roles) if contract.free_margin is not None and mine else None
    if free is not None and may_pay(view, free):
        checks.append(((mine, free), view.difference(mine, free), contract.free_margin))
    return checks


def _cells_of(checks: list[Check]) -> list[Cell]:
    return list(dict.fromkeys(cell for cells, _, _ in checks for cell in cells))


def unsettled(view: View, roles: Roles, contract: Contract) -> list[Cell]:
    """The cells whose measurement could still change a verdict of `contract` (module docstring), without repeats,
    in a stable order; [] when every verdict is settled (or the contract has no bar)."""
    return _cells_of([c for c in _checks(view, roles, contract) if _open(c[1], c[2])])


def settleable(ci: Optional[list[float]], bar: float, reach: float) -> bool:
    """Whether an open verdict (`ci` straddles `bar`, or no interval yet) could be settled by the passes left:
    `ci` narrowed about its centre by the factor `reach` would clear `bar`. No interval yet: always worth a pass."""
    if verdict(ci, bar) == UNKNOWN:
        return True
    lo, hi = ci
    centre, half = (lo + hi) / 2, (hi - lo) / 2 * reach
    return verdict([centre - half, centre + half], bar) != STRADDLES


def to_measure(view: View, roles: Roles, contract: Contract) -> list[Cell]:
    """The cells worth another pass: those of the open verdicts (:func:`unsettled`) that the budget left could
    settle (:func:`settleable` at the view's :meth:`View.reach` of their cells); [] when none could."""
    return _cells_of([c for c in _checks(view, roles, contract)
                      if _open(c[1], c[2]) and settleable(c[1], c[2], view.reach(c[0]))])


def beyond_reach(key: str, max_repeats: int) -> str:
    """Why an engine stopped adding passes when verdicts are still open but :func:`to_measure` names nothing (its
    metrics.json ``repeats.stopped``, serving.json ``added_passes.stopped``); `key` is the engine's budget setting."""
    return (f"the passes left up to {key}={max_repeats} could not settle it (each open interval, narrowed as far "
            "as they could narrow it, would still hold its bar)")
