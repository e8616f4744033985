"""The one measurement policy (eval/policy.py) on hand-made views: settled, undecided -> which cells next, the
champion and the training-free differences, and the contract built from promote.*."""

from dataclasses import dataclass, field

import pytest

from draftsmith.eval.policy import Contract, Roles, free_may_be_recorded, rival, settleable, to_measure, unsettled


@dataclass
class Hand:
    """A view written by hand: per name the K rule's (chosen K, choosable K), per cell a speedup and an interval,
    per pair of cells a difference interval."""

    choices: dict
    cells: dict  # (name, k) -> (speedup, interval)
    differences: dict = field(default_factory=dict)  # ((name, k), (name, k)) -> interval
    reaches: dict = field(default_factory=dict)  # cells -> the narrowing the budget left allows (default 0: any)

    def choice(self, name):
        return self.choices.get(name)

    def speedup(self, cell):
        return self.cells[cell][0]

    def interval(self, cell):
        return self.cells[cell][1]

    def difference(self, a, b):
        return self.differences.get((a, b))

    def reach(self, cells):
        return self.reaches.get(cells, 0.0)


BARS = Contract(at=(1.0, 1.1))


def test_settled_when_every_choosable_k_clears_the_bars():
    view = Hand({"trained": (2, [2])}, {("trained", 2): (1.5, [1.3, 1.7]), ("trained", 4): (1.0, [0.9, 1.08])})
    assert unsettled(view, Roles("trained"), BARS) == []  # K=4 straddles 1.0 but cannot be chosen
    assert unsettled(view, Roles("trained"), Contract()) == []  # no bar: nothing to settle


def test_a_straddling_choosable_k_is_measured_next():
    view = Hand({"trained": (2, [2, 4])}, {("trained", 2): (1.5, [1.3, 1.7]), ("trained", 4): (1.3, [1.05, 1.6])})
    assert unsettled(view, Roles("trained"), BARS) == [("trained", 4)]  # straddles 1.1
    view.cells[("trained", 4)] = (1.3, None)  # no interval yet: unknown, measured too
    assert unsettled(view, Roles("trained"), BARS) == [("trained", 4)]


def test_only_the_candidate_and_production_are_settled():
    view = Hand({"trained": (2, [2]), "base": (2, [2])},
                {("trained", 2): (1.5, [1.3, 1.7]), ("base", 2): (1.1, [0.9, 1.3])})
    assert unsettled(view, Roles("trained"), BARS) == []
    assert unsettled(view, Roles("base"), BARS) == [("base", 2)]


def test_the_champion_difference():
    view = Hand({"trained": (2, [2]), "production": (3, [3])},
                {("trained", 2): (1.5, [1.3, 1.7]), ("production", 3): (1.45, [1.3, 1.6])},
                {(("trained", 2), ("production", 3)): [-0.05, 0.15]})
    roles = Roles("trained", production="production")
    assert unsettled(view, roles, BARS) == []  # no margin in the contract
    assert unsettled(view, roles, Contract(at=(1.1,), margin=0.02)) == [("trained", 2), ("production", 3)]
    view.differences[(("trained", 2), ("production", 3))] = [0.03, 0.1]
    assert unsettled(view, roles, Contract(at=(1.1,), margin=0.02)) == []


def test_the_training_free_difference_against_the_fastest_method_that_pays():
    view = Hand({"trained": (2, [2]), "ngram": (3, [3]), "ngram:1-2": (1, [1])},
                {("trained", 2): (1.5, [1.3, 1.7]), ("ngram", 3): (1.4, [1.2, 1.6]), ("ngram:1-2", 1): (1.2, [1.1, 1.3])},
                {(("trained", 2), ("ngram", 3)): [-0.1, 0.3], (("trained", 2), ("ngram:1-2", 1)): [0.1, 0.5]})
    roles = Roles("trained", free=("ngram:1-2", "ngram"))
    assert rival(view, roles) == ("ngram", 3)
    free = Contract(at=(1.1,), free_margin=0.0)
    assert unsettled(view, roles, free) == [("trained", 2), ("ngram", 3)]
    view.differences[(("trained", 2), ("ngram", 3))] = [0.05, 0.3]
    assert unsettled(view, roles, free) == []
    # a method that surely does not pay here (its interval wholly below 1) is no rival: nothing to settle against it
    slow = Hand({"trained": (2, [2]), "ngram": (3, [3])}, {("trained", 2): (1.5, [1.3, 1.7]), ("ngram", 3): (0.95, [0.8, 0.98])},
                {(("trained", 2), ("ngram", 3)): [-0.1, 0.9]})
    assert unsettled(slow, Roles("trained", free=("ngram",)), free) == []
    # but one whose point reads below 1 on an interval that reaches above it still is (no lucky pass excuses)
    slow.cells[("ngram", 3)] = (0.95, [0.8, 1.1])
    assert unsettled(slow, Roles("trained", free=("ngram",)), free) == [("trained", 2), ("ngram", 3)]


def test_settleable_narrows_the_interval_about_its_centre():
    # [0.9, 1.3] about 1.1 with half-width 0.2: halved -> [1.0, 1.2] clears 0.95 but not 1.05
    assert settleable([0.9, 1.3], 0.95, 0.5)
    assert not settleable([0.9, 1.3], 1.05, 0.5)
    assert settleable([0.9, 1.3], 1.05, 0.2)  # [1.06, 1.14]
    assert not settleable([0.9, 1.3], 0.95, 1.0)  # no pass left: nothing narrows
    assert settleable(None, 1.0, 1.0)  # no interval yet: a pass is always worth taking
    assert settleable([-0.3, 0.1], 0.0, 0.25) and not settleable([-0.3, 0.1], 0.0, 0.6)  # a difference below 0


def test_only_verdicts_the_budget_could_settle_are_measured():
    """An open verdict whose interval, narrowed as far as the passes left allow, still holds the bar is given up
    (it stays open: unsettled still names it); the others are measured."""
    view = Hand({"trained": (2, [2]), "ngram": (2, [2])},
                {("trained", 2): (1.6, [1.3, 1.9]), ("ngram", 2): (1.55, [1.3, 1.8])},
                {(("trained", 2), ("ngram", 2)): [-0.45, 0.35]})
    roles, free = Roles("trained", free=("ngram",)), Contract(at=(1.1,), free_margin=0.0)
    pair = (("trained", 2), ("ngram", 2))
    assert unsettled(view, roles, free) == to_measure(view, roles, free) == list(pair)
    view.reaches[pair] = 0.5  # [-0.25, 0.15]: the budget cannot take the difference off 0
    assert to_measure(view, roles, free) == []
    assert unsettled(view, roles, free) == list(pair)  # still open: inconclusive, not decided
    view.differences[pair] = [-0.1, 0.5]  # centre 0.2, half 0.3 -> [0.05, 0.35] at 0.5: worth it
    assert to_measure(view, roles, free) == list(pair)
    # a bar check narrows by its own cell's reach, not the pair's
    view.cells[("trained", 2)] = (1.3, [1.0, 1.6])
    view.differences[pair] = [0.2, 0.5]
    view.reaches[(("trained", 2),)] = 0.5  # [1.15, 1.45] would clear 1.1
    assert to_measure(view, roles, free) == [("trained", 2)]
    view.reaches[(("trained", 2),)] = 0.9
    assert to_measure(view, roles, free) == []


def test_the_rival_may_be_recorded_only_when_the_candidate_is_settled_against_it():
    view = Hand({"trained": (2, [2]), "ngram": (3, [3])},
                {("trained", 2): (1.3, [1.15, 1.45]), ("ngram", 3): (1.8, [1.6, 2.0])},
                {(("trained", 2), ("ngram", 3)): [-0.7, -0.3]})
    roles, contract = Roles("trained", free=("ngram",), recordable=("ngram",)), Contract(at=(1.1,), free_margin=0.0)
    assert free_may_be_recorded(view, roles, contract) == ("ngram", 3)  # lookup surely ahead
    assert free_may_be_recorded(view, roles, Contract(at=(1.1,))) is None  # no training-free gate
    view.differences[(("trained", 2), ("ngram", 3))] = [-0.7, 0.1]  # undecided: the draft may yet be promoted
    assert free_may_be_recorded(view, roles, contract) is None
    view.cells[("trained", 2)] = (0.9, [0.8, 1.0])  # the draft is refused by the bar itself
    assert free_may_be_recorded(view, roles, contract) == ("ngram", 3)
    view.cells[("ngram", 3)] = (0.9, [0.8, 0.95])  # but lookup does not pay either: nothing to record
    assert free_may_be_recorded(view, roles, contract) is None
    # refused by the champion: production surely ahead
    champ = Hand({"trained": (2, [2]), "ngram": (3, [3]), "production": (2, [2])},
                 {("trained", 2): (1.3, [1.15, 1.45]), ("ngram", 3): (1.3, [1.1, 1.5]),
                  ("production", 2): (1.6, [1.5, 1.7])},
                 {(("trained", 2), ("ngram", 3)): [-0.2, 0.2], (("trained", 2), ("production", 2)): [-0.4, -0.2]})
    with_prod = Roles("trained", production="production", free=("ngram",), recordable=("ngram",))
    assert free_may_be_recorded(champ, with_prod, Contract(at=(1.1,), margin=0.0, free_margin=0.0)) == ("ngram", 3)


def test_suffix_decoding_may_refuse_the_draft_but_only_prompt_lookup_is_measured_to_be_recorded():
    """Suffix decoding (vLLM only, never recorded) surely ahead of the draft settles its refusal; the method whose
    K schedule is worth measuring for "no draft needed" is then prompt lookup, when it may pay — never suffix."""
    view = Hand({"trained": (2, [2]), "ngram": (2, [2]), "suffix": (2, [2])},
                {("trained", 2): (1.3, [1.15, 1.45]), ("ngram", 2): (1.25, [1.1, 1.4]), ("suffix", 2): (1.8, [1.6, 2.0])},
                {(("trained", 2), ("suffix", 2)): [-0.7, -0.3], (("trained", 2), ("ngram", 2)): [-0.1, 0.2]})
    roles = Roles.of({"trained": "/d", "ngram": "ngram:2-4", "suffix": "suffix"})
    assert roles.free == ("ngram", "suffix") and roles.recordable == ("ngram",)
    contract = Contract(at=(1.1,), free_margin=0.0)
    assert free_may_be_recorded(view, roles, contract) == ("ngram", 2)  # refused against suffix; lookup may pay
    view.cells[("ngram", 2)] = (0.9, [0.8, 0.95])  # lookup does not pay: nothing worth recording
    assert free_may_be_recorded(view, roles, contract) is None
    only_suffix = Roles.of({"trained": "/d", "suffix": "suffix"})
    assert only_suffix.recordable == () and free_may_be_recorded(view, only_suffix, contract) is None


def test_the_contract_from_promote_settings():
    from draftsmith.config import PromoteConfig

    p = PromoteConfig(min_speedup=1.2, champion_margin=0.05, free_margin=0.01, serving_concurrency=8, k_schedule=False)
    c = Contract.of(p, production=True, free=True)
    assert c == Contract(at=(1.2,), margin=0.05, free_margin=0.01, concurrency=8, schedule=False)
    assert Contract.of(p, production=False, free=False) == Contract(at=(1.2,), concurrency=8, schedule=False)
    assert c.at_batch1() == Contract(at=(1.2,), margin=0.05, free_margin=0.01)


def test_a_production_version_that_is_a_training_free_method_is_the_champion_not_a_rival():
    """The registry's production may record prompt lookup ("no draft needed"): measured as "production" by its
    spec string, it plays the champion; eval/serve baselines naming the same method are not measured twice."""
    from draftsmith.artifacts.errors import ConfigError
    from draftsmith.eval.settings import with_training_free

    drafts = {"trained": "/runs/a/train/draft", "production": "ngram:2-4"}
    merged = with_training_free(drafts, ["ngram"], "serve.baselines")
    assert merged == drafts  # the same window: measured once, as production
    assert with_training_free(drafts, ["ngram:1-3"], "serve.baselines")["ngram"] == "ngram:1-3"
    roles = Roles.of(with_training_free(drafts, ["ngram:1-3"], "eval.baselines"))
    assert (roles.candidate, roles.production, roles.free) == ("trained", "production", ("ngram",))
    assert Roles.of(merged).free == ()
    with pytest.raises(ConfigError, match="eval.baselines"):
        with_training_free({"ngram": "/a/draft"}, ["ngram"], "eval.baselines")


def test_the_serving_ab_drives_every_lookup_server_as_one_even_production(tmp_path):
    """A production version that is prompt lookup plays the champion, yet its server is still a lookup server: a
    level where lookup finds no repeat drafts nothing there, which is no error (eval/serving.py _drive)."""
    from draftsmith.eval.serving import _Launched
    from draftsmith.eval.settings import ServingSettings

    drafts = {"trained": str(tmp_path / "draft"), "production": "ngram:2-4", "ngram": "ngram:1-3"}
    ab = _Launched(ServingSettings(engine="vllm"), target="t", drafts=drafts, k=[2], prompts=[[1, 2]], out=tmp_path,
                   dtype="float32", reference=None, decide=None, device="cpu", log=print)
    assert ab.lookup == {"production", "ngram"}
    assert Roles.of(drafts).free == ("ngram",)
