"""The champion gate under concurrency: a sweep's jobs promoting at once into one registry.

Fake eval outputs (metrics.json + tiny draft directories): promote() only reads metrics, hashes and
copies the draft directory, and loads the target's tokenizer to record the target's identity, so no
model is needed. The multi-process test runs every job's promote() at the same moment (a barrier)
against one registry root, several rounds; before the compare-and-set fix production ended on
whichever job registered last.
"""

import importlib
import json
import multiprocessing as mp
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import WORDS, make_tokenizer

from draftsmith.config import DraftsmithConfig
from draftsmith.promote import promote
from draftsmith.registry import LocalRegistry, RegistryError, check_registry_target, fingerprint, target_identity
from draftsmith.eval.runner import eval_set_id

EVAL_SET = "set-a"
# (speedup, acceptance_rate, greedy_match) of the sweep's jobs; 2.5 and 1.7 fail the greedy gate, so 1.92 must win
# (1.45's acceptance rate 0.3 vetoes nothing: a measured speedup decides)
JOBS = [(1.31, 0.7, 1.0), (1.55, 0.7, 1.0), (1.92, 0.7, 1.0), (1.63, 0.7, 1.0), (1.7, 0.7, 0.9), (2.5, 0.7, 0.95),
        (1.45, 0.3, 1.0)]
VERSION_FILES = ("draft", "metrics.json", "promotion.json", "speculative_config.json", "version.json")


def fake_target(path: Path, words: list[str] | None = None) -> Path:
    """A target directory with what target_identity reads: config.json and a tokenizer."""
    path.mkdir(parents=True)
    vocab = len(words or WORDS) + 4
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab}))
    make_tokenizer(words).save_pretrained(path)
    return path


def fake_draft(path: Path, seed: int) -> Path:
    """A model-like directory whose bytes differ by seed."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    (path / "model.safetensors").write_bytes(seed.to_bytes(4, "little") * 256)
    return path


def summary_entry(speedup: float, acceptance: float = 0.7, greedy: float = 1.0, half_width: float = 0.005) -> dict:
    """A metrics.json summary entry whose speedup's 95% interval is speedup +- half_width."""
    return {"best_k": 4, "temperature": 0.0, "speedup": speedup, "acceptance_rate": acceptance,
            "speedup_ci95": [speedup - half_width, speedup + half_width], "repeats": 2,
            "token_acceptance": 0.8, "mean_accepted_tokens": 3.0, "greedy_match": greedy}


def fake_eval(run_dir: Path, target: Path, draft: Path, trained: dict, eval_set: str = EVAL_SET,
              production: tuple[Path, dict] | None = None) -> Path:
    """An out_dir whose eval/metrics.json measured `draft` as "trained" (and a production draft, if given)."""
    drafts, summary = {"trained": str(draft)}, {"trained": trained}
    if production is not None:
        drafts["production"], summary["production"] = str(production[0]), production[1]
    (run_dir / "eval").mkdir(parents=True)
    (run_dir / "eval" / "metrics.json").write_text(json.dumps(
        {"schema_version": 1, "config": {"target": str(target), "drafts": drafts}, "eval_set": eval_set,
         "records": [], "summary": summary}))
    return run_dir


def config(name: str = "demo") -> DraftsmithConfig:
    cfg = DraftsmithConfig()
    cfg.promote.name = name
    return cfg


# -- many jobs at once -------------------------------------------------------------------------
def _promote_worker(module: str, rounds: list[tuple[str, str]], barrier, queue):
    """One sweep job: in each round, wait for the others, then promote its eval output into the round's registry."""
    run_promote = importlib.import_module(module).promote
    for out_dir, root in rounds:
        barrier.wait()  # every job decides at the same moment
        try:
            record = run_promote(config(), Path(out_dir), LocalRegistry(root))
        except Exception as exc:  # reported to the parent, which fails the test with it
            record = {"error": f"{type(exc).__name__}: {exc}"}
        queue.put((out_dir, json.loads(json.dumps(record, default=str))))


def sweep_rounds(tmp_path: Path, n_rounds: int) -> list[dict]:
    """`n_rounds` rounds of the six JOBS (in a shuffled order each round): eval outputs and a fresh registry."""
    target = fake_target(tmp_path / "target")
    rounds, rng = [], random.Random(0)
    for r in range(n_rounds):
        order = JOBS[:]
        rng.shuffle(order)
        jobs = []
        for i, (speedup, acceptance, greedy) in enumerate(order):
            draft = fake_draft(tmp_path / f"r{r}" / f"draft{i}", seed=100 * r + i)
            out = fake_eval(tmp_path / f"r{r}" / f"job{i}", target, draft, summary_entry(speedup, acceptance, greedy))
            jobs.append({"out_dir": str(out), "draft": draft, "speedup": speedup,
                         "passes": greedy == 1.0 and speedup >= 1.1})
        rounds.append({"root": str(tmp_path / f"r{r}" / "registry"), "jobs": jobs})
    return rounds


def run_sweep(rounds: list[dict], module: str = "draftsmith.promote") -> list[dict[str, dict]]:
    """Start one process per job; each promotes in every round at once with the others. -> per round {out_dir: record}."""
    n = len(rounds[0]["jobs"])
    # fork: the jobs start in a second instead of importing torch six times over; each process still opens
    # its own lock file descriptor, as separate sweep jobs do (the parent holds no registry lock here)
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_promote_worker,
                         args=(module, [(rd["jobs"][i]["out_dir"], rd["root"]) for rd in rounds], barrier, queue))
             for i in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in range(n * len(rounds))]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    records = dict(results)
    return [{job["out_dir"]: records[job["out_dir"]] for job in rd["jobs"]} for rd in rounds]


def check_round(rd: dict, records: dict[str, dict], margin: float = 0.02) -> None:
    """Production is the best passing draft; versions are complete; every record tells what happened."""
    reg = LocalRegistry(rd["root"])
    errors = [r["error"] for r in records.values() if "error" in r]
    assert not errors, errors
    best = max((j for j in rd["jobs"] if j["passes"]), key=lambda j: j["speedup"])
    production = reg.resolve("demo", "production")
    assert production["fingerprint"] == fingerprint(best["draft"]), (
        f"production is v{production['version']} at speedup {production['summary']['speedup']}, "
        f"not the best passing draft ({best['speedup']})")

    versions = reg.versions("demo")
    numbers = [v["version"] for v in versions]
    assert numbers == list(range(1, len(versions) + 1)) and production["version"] == numbers[-1]
    speedups = [v["summary"]["speedup"] for v in versions]
    assert all(b >= a + margin for a, b in zip(speedups, speedups[1:])), speedups  # each beat its predecessor
    identity = target_identity(Path(rd["jobs"][0]["out_dir"]).parent.parent / "target")
    for v in versions:
        path = reg.path("demo", v["version"])
        assert all((path / f).exists() for f in VERSION_FILES), sorted(p.name for p in path.iterdir())
        assert fingerprint(path / "draft") == v["fingerprint"]
        assert v["target"] == identity
    assert not [p for p in Path(rd["root"], "demo").iterdir() if p.name.startswith(".v")]  # no temp dirs left

    by_fp = {v["fingerprint"]: v for v in versions}
    promoted = 0
    for job in rd["jobs"]:
        record = records[job["out_dir"]]
        version = by_fp.get(fingerprint(job["draft"]))
        assert record["eval_measured_production"] is None  # the sweep's evals ran on an empty registry
        compared = record["compared_with"]
        if record["promote"]:
            promoted += 1
            assert version is not None and record["registry"]["version"] == version["version"]
            stored = json.loads((reg.path("demo", version["version"]) / "promotion.json").read_text())
            assert stored["compared_with"] == compared and stored["reasons"] == record["reasons"]
            if version["version"] == 1:
                assert compared is None and record["decision_retaken"] is False
                continue
            previous = version["version"] - 1  # what was production when this job decided
            assert record["decision_retaken"] is True and record["champion_version"] == previous
            assert compared == {"version": previous, "speedup": speedups[previous - 1],
                                "source": f"recorded with v{previous} on the same eval set", "eval_set": EVAL_SET}
            continue
        assert version is None and record["registry"] is None
        if not job["passes"]:
            assert not any(r.startswith("all gates passed") for r in record["reasons"])
            if compared is None:
                continue
        # refused by the champion: it names the production that beat it, with that version's recorded figures
        assert compared["speedup"] == speedups[compared["version"] - 1]
        assert compared["source"] == f"recorded with v{compared['version']} on the same eval set"
        if job["passes"]:
            assert job["speedup"] < compared["speedup"] + margin
            assert any(r.startswith(f"speedup {job['speedup']:.3f} [") and
                       f"does not beat production v{compared['version']}'s" in r for r in record["reasons"]), \
                record["reasons"]
    assert promoted == len(versions)


def test_concurrent_sweep_promotions_end_on_the_best_passing_draft(tmp_path):
    rounds = sweep_rounds(tmp_path, n_rounds=5)
    for rd, records in zip(rounds, run_sweep(rounds)):
        check_round(rd, records)


# -- production moved after the eval measured it -------------------------------------------------
@pytest.fixture
def measured_v1(tmp_path):
    """A registry whose production v1 an eval measured beside a candidate (measured 1.25; recorded 1.2)."""
    target = fake_target(tmp_path / "target")
    reg = LocalRegistry(tmp_path / "reg")
    identity = target_identity(target)
    first = promote(config(), fake_eval(tmp_path / "job1", target, fake_draft(tmp_path / "d1", 1),
                                        summary_entry(1.2)), reg)
    assert first["promote"] and reg.aliases("demo") == {"production": 1} and first["target"] == identity
    v1_draft = reg.path("demo", 1) / "draft"

    def candidate(i: int, speedup: float) -> Path:
        return fake_eval(tmp_path / f"job{i}", target, fake_draft(tmp_path / f"d{i}", i), summary_entry(speedup),
                         production=(v1_draft, summary_entry(1.25)))
    return SimpleNamespace(reg=reg, target=target, candidate=candidate, tmp=tmp_path)


def another_promotes(ns, i: int, speedup: float, eval_set: str) -> None:
    """Another job (another eval) registers draft `i` as production meanwhile."""
    out = fake_eval(ns.tmp / f"other{i}", ns.target, fake_draft(ns.tmp / f"d{i}", i), summary_entry(speedup), eval_set)
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    ns.reg.register("demo", ns.tmp / f"d{i}", metrics=metrics, promotion={"candidate": summary_entry(speedup)}, k=4,
                    target=target_identity(ns.target))


def test_production_unchanged_uses_the_eval_measurement(measured_v1):
    record = promote(config(), measured_v1.candidate(2, 1.5), measured_v1.reg)
    assert record["promote"] and record["registry"]["version"] == 2
    assert record["compared_with"] == {"version": 1, "speedup": 1.25, "source": "measured in this eval",
                                       "eval_set": EVAL_SET}
    assert record["decision_retaken"] is False and record["eval_measured_production"]["version"] == 1
    assert record["reasons"] == ["all gates passed; beats production v1 (1.250)"]


def test_production_from_another_eval_set_appearing_meanwhile_is_refused(measured_v1):
    out = measured_v1.candidate(2, 1.5)
    another_promotes(measured_v1, 3, 1.4, eval_set="set-b")
    record = promote(config(), out, measured_v1.reg)
    assert record["promote"] is False and record["registry"] is None and record["compared_with"] is None
    assert record["champion_version"] == 2 and record["decision_retaken"] is True
    assert record["reasons"] == [
        "the production draft v2 was not measured on this eval set, so the candidate cannot be compared with it "
        "(production moved to v2 after this eval measured v1, and v2 was promoted on another eval set (set-b; this "
        "eval: set-a)): run eval again with eval.compare_production=true, which measures the current production "
        "draft beside the candidate"]
    assert [v["version"] for v in measured_v1.reg.versions("demo")] == [1, 2]
    assert measured_v1.reg.aliases("demo") == {"production": 2}


@pytest.mark.parametrize("speedup, promoted", [(1.5, True), (1.41, False)])
def test_production_moved_on_the_same_eval_set_is_decided_again(measured_v1, speedup, promoted):
    """v1 was beaten (measured 1.25) but v2 (recorded 1.4 on the same eval set) appeared meanwhile."""
    out = measured_v1.candidate(2, speedup)
    another_promotes(measured_v1, 3, 1.4, eval_set=EVAL_SET)
    record = promote(config(), out, measured_v1.reg)
    assert record["promote"] is promoted and record["decision_retaken"] is True
    assert record["compared_with"] == {"version": 2, "speedup": 1.4, "source": "recorded with v2 on the same eval set",
                                       "eval_set": EVAL_SET}
    retaken = ("decision re-taken: production is v2, not the draft this eval measured (v1); compared with v2's speedup "
               "1.400, recorded with v2 on the same eval set")
    if promoted:
        assert record["reasons"] == ["all gates passed; beats production v2 (1.400)", retaken]
        assert measured_v1.reg.aliases("demo") == {"production": 3} and record["registry"]["version"] == 3
    else:
        assert record["reasons"] == ["speedup 1.410 [1.405, 1.415] does not beat production v2's 1.400 [1.395, 1.405] by the margin 0.02", retaken]
        assert measured_v1.reg.aliases("demo") == {"production": 2}


# -- one target per registry name ---------------------------------------------------------------
def test_a_name_holds_drafts_of_one_target(measured_v1):
    ns, other_words = measured_v1, [f"x{i}" for i in range(20)]
    other = fake_target(ns.tmp / "other-target", other_words)
    check_registry_target(ns.reg, "demo", "production", ns.target)  # same target: fine
    check_registry_target(ns.reg, "fresh", "production", other)  # nothing registered under the name: fine
    with pytest.raises(RegistryError) as err:
        check_registry_target(ns.reg, "demo", "production", other)
    message = str(err.value)
    assert message.startswith(f"registry {ns.reg.root}: promote.name 'demo' holds drafts for target {ns.target} "
                              "(config ") and f"not for {other} (config " in message
    assert "use another promote.name or registry.root (production is v1)" in message and "\n" not in message
    with pytest.raises(RegistryError, match="holds drafts for target .* not for .*use another promote.name"):
        ns.reg.register("demo", fake_draft(ns.tmp / "d9", 9), metrics={}, promotion={}, k=2,
                        target=target_identity(other))
    out = fake_eval(ns.tmp / "job-other", other, fake_draft(ns.tmp / "d8", 8), summary_entry(3.0))
    record = promote(config(), out, ns.reg)
    assert record["promote"] is False and record["registry"] is None
    assert record["reasons"][-1].startswith("registry ") and "not for " + str(other) in record["reasons"][-1]
    assert [v["version"] for v in ns.reg.versions("demo")] == [1]


def test_versions_without_a_target_identity_are_unknown_and_said_so(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    reg.register("demo", fake_draft(tmp_path / "old", 1), metrics={"schema_version": 1, "eval_set": EVAL_SET, "records": [], "summary": {}},
                 promotion={"candidate": summary_entry(1.2)}, k=4)  # as before identities were recorded
    target = fake_target(tmp_path / "target")
    check_registry_target(reg, "demo", "production", target)
    record = promote(config(), fake_eval(tmp_path / "job", target, fake_draft(tmp_path / "new", 2),
                                         summary_entry(1.5)), reg)
    assert record["promote"] and record["registry"]["version"] == 2
    assert any(r.startswith("note: production v1 was registered without a target identity") for r in record["reasons"])


# -- the registry's transaction and the eval set id ------------------------------------------------
def test_transaction_is_reentrant_and_ends_with_its_block(tmp_path):
    reg = LocalRegistry(tmp_path / "reg", lock_timeout_s=2)
    with reg.transaction("demo") as tx:
        assert tx.find("production") is None
        reg.register("demo", fake_draft(tmp_path / "a", 1), metrics={}, promotion={}, k=2)  # same thread: no deadlock
        with reg.transaction("demo") as inner:
            inner.set_alias("staging", 1)
        assert tx.aliases() == {"production": 1, "staging": 1}
    with pytest.raises(RegistryError, match="transaction on 'demo' has ended"):
        tx.find("production")


def test_eval_set_id_covers_the_decode_settings():
    cfg = SimpleNamespace(target="t", max_new_tokens=8, k=[2, 4], temperature=[0.0], top_k=0, top_p=1.0, seed=0,
                          backend="lean", dtype="float32", device="cpu", draft_vocab=0)
    prompts = [torch.tensor([[1, 2, 3]])]
    base = eval_set_id(cfg, prompts)
    # the id of a full-vocabulary eval is what it was before eval.draft_vocab existed (computed with the code of
    # commit dbd2207), so registry versions recorded then are still compared with new evals
    assert base == "216c675b94e613c6"
    assert eval_set_id(SimpleNamespace(**vars(cfg)), prompts) == base
    for key, value in [("backend", "hf"), ("dtype", "bfloat16"), ("device", "cuda"), ("seed", 1), ("k", [2]),
                       ("top_p", 0.9), ("target", "u"), ("draft_vocab", 8192)]:
        assert eval_set_id(SimpleNamespace(**{**vars(cfg), key: value}), prompts) != base, key
    assert eval_set_id(cfg, [torch.tensor([[1, 2, 4]])]) != base


@pytest.mark.parametrize("gain, decision", [(0.30, "promoted"), (0.0, "inconclusive"), (-0.3, "refused")])
def test_champion_measured_beside_is_judged_on_the_paired_difference(measured_v1, gain, decision):
    """With per-prompt timings in metrics.json, candidate vs production is the interval of their paired
    difference: a clear gain promotes, a tie is inconclusive (never promoted on a lucky pass), a loss refuses."""
    out = measured_v1.candidate(2, 1.25 + gain)
    path = out / "eval" / "metrics.json"
    metrics = json.loads(path.read_text())
    rng = random.Random(7)

    def record(draft: str, speedup: float) -> dict:  # 8 prompts x 2 passes, noisy, at the summary's K and T
        plain = [[1.0 + rng.uniform(-0.1, 0.1) for _ in range(8)] for _ in range(2)]
        spec = [[p / speedup * (1 + rng.uniform(-0.05, 0.05)) for p in row] for row in plain]
        return {"draft": draft, "k": 4, "temperature": 0.0, "timings": {"plain_s": plain, "spec_s": spec}}

    metrics["records"] = [record("trained", 1.25 + gain), record("production", 1.25)]
    path.write_text(json.dumps(metrics))
    result = promote(config(), out, measured_v1.reg)
    assert result["decision"] == decision and result["difference_ci95"] is not None
    lo, hi = result["difference_ci95"]
    assert lo <= gain + 0.1 and hi >= gain - 0.1  # around the true difference
