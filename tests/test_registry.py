"""The local registry: versions, idempotence, aliases, concurrency, errors, the CLI; the W&B mirror."""

import json
import multiprocessing as mp

import pytest

from draftsmith import registry_cli
from draftsmith.registry import LocalRegistry, RegistryError, fingerprint

PROMOTION = {"promote": True, "candidate": {"best_k": 3, "speedup": 1.4, "acceptance_rate": 0.7}}


def fake_draft(path, seed: int):
    """A model-like directory (config.json + weights bytes); contents differ by seed."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    (path / "model.safetensors").write_bytes(bytes([seed % 256]) * 1000)
    return path


def test_register_is_versioned_idempotent_and_moves_aliases(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    a, b = fake_draft(tmp_path / "a", 1), fake_draft(tmp_path / "b", 2)
    v1 = reg.register("demo", a, metrics={"m": 1}, promotion=PROMOTION, k=3)
    assert v1["version"] == 1 and v1["created"]
    entry = tmp_path / "reg" / "demo" / "v1"
    assert fingerprint(entry / "draft") == fingerprint(a)
    assert json.loads((entry / "speculative_config.json").read_text()) == {
        "model": str((entry / "draft").resolve()), "method": "draft_model", "num_speculative_tokens": 3}
    assert json.loads((entry / "metrics.json").read_text()) == {"m": 1}
    assert json.loads((entry / "promotion.json").read_text()) == PROMOTION
    again = reg.register("demo", a, metrics={"m": 2}, promotion=PROMOTION, k=4, aliases=["staging"])
    assert again["version"] == 1 and not again["created"]
    assert json.loads((entry / "metrics.json").read_text()) == {"m": 1}  # never overwritten
    assert reg.aliases("demo") == {"production": 1, "staging": 1}
    v2 = reg.register("demo", b, metrics={}, promotion=PROMOTION, k=2, aliases=["staging"])
    assert v2["version"] == 2 and reg.aliases("demo") == {"production": 1, "staging": 2}
    assert reg.set_alias("demo", "production", "v2") == {"production": 2, "staging": 2}
    assert reg.resolve("demo", "production")["version"] == 2 and reg.resolve("demo", 1)["version"] == 1
    assert [v["version"] for v in reg.versions("demo")] == [1, 2]


@pytest.mark.parametrize("call, message", [
    (lambda r: r.resolve("demo", "canary"), "has no alias 'canary'"),
    (lambda r: r.resolve("demo", "v9"), "has no version 9"),
    (lambda r: r.versions("../etc"), "registry name '../etc' is invalid"),
    (lambda r: r.set_alias("demo", "bad alias", 1), "not a valid alias"),
])
def test_bad_references_are_clear_errors(tmp_path, call, message):
    reg = LocalRegistry(tmp_path / "reg")
    reg.register("demo", fake_draft(tmp_path / "a", 1), metrics={}, promotion=PROMOTION, k=2)
    with pytest.raises(RegistryError, match=message):
        call(reg)


def test_unwritable_root_and_non_model_dir_are_clear_errors(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(RegistryError, match="is not writable.*registry.root"):
        LocalRegistry(blocker / "reg").register("demo", fake_draft(tmp_path / "a", 1), metrics={}, promotion={}, k=2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RegistryError, match="no config.json"):
        LocalRegistry(tmp_path / "reg").register("demo", tmp_path / "empty", metrics={}, promotion={}, k=2)


def _register_worker(root, draft, barrier, queue):
    barrier.wait()  # all processes start registering at the same moment
    version = LocalRegistry(root).register("demo", draft, metrics={}, promotion=PROMOTION, k=2,
                                           aliases=["production"])
    queue.put((str(draft), version["version"], version["created"]))


def test_concurrent_promotions_never_lose_or_corrupt_a_version(tmp_path):
    drafts = [fake_draft(tmp_path / f"d{i}", i) for i in range(6)]
    jobs = drafts + drafts[:2]  # two drafts promoted twice at once: still one version each
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(len(jobs)), ctx.Queue()
    procs = [ctx.Process(target=_register_worker, args=(tmp_path / "reg", d, barrier, queue)) for d in jobs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    results = [queue.get(timeout=5) for _ in jobs]
    reg = LocalRegistry(tmp_path / "reg")
    versions = reg.versions("demo")
    assert [v["version"] for v in versions] == list(range(1, 7))  # contiguous, none lost
    assert len({v["fingerprint"] for v in versions}) == 6
    by_draft = {}
    for draft, number, _created in results:
        by_draft.setdefault(draft, set()).add(number)
    assert all(len(numbers) == 1 for numbers in by_draft.values())  # the same draft got the same version
    assert sum(created for *_, created in results) == 6
    for v in versions:
        assert fingerprint(reg.path("demo", v["version"]) / "draft") == v["fingerprint"]
    assert reg.aliases("demo")["production"] in range(1, 7)
    assert not [p for p in (tmp_path / "reg" / "demo").iterdir() if p.name.startswith(".v")]  # no temp dirs left


def test_registry_cli_list_show_alias(tmp_path, capsys):
    root = tmp_path / "reg"
    reg = LocalRegistry(root)
    reg.register("demo", fake_draft(tmp_path / "a", 1), metrics={}, promotion=PROMOTION, k=3)
    reg.register("demo", fake_draft(tmp_path / "b", 2), metrics={}, promotion=PROMOTION, k=2, aliases=["staging"])
    assert registry_cli.main(["--root", str(root), "list"]) == 0
    listing = capsys.readouterr().out
    assert "v1" in listing and "production" in listing and "v2" in listing and "staging" in listing
    assert registry_cli.main(["--root", str(root), "show", "demo", "staging"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["version"] == 2 and shown["speculative_config"]["num_speculative_tokens"] == 2
    assert registry_cli.main(["--root", str(root), "alias", "demo", "production", "2"]) == 0
    assert reg.aliases("demo") == {"production": 2, "staging": 2}
    assert registry_cli.main(["--root", str(root), "show", "demo", "v7"]) == 2
    assert "has no version 7" in capsys.readouterr().err


def test_registry_cli_takes_its_options_before_or_after_the_subcommand(tmp_path, capsys, monkeypatch):
    root = tmp_path / "reg"
    LocalRegistry(root).register("demo", fake_draft(tmp_path / "a", 1), metrics={}, promotion=PROMOTION, k=3)
    monkeypatch.chdir(tmp_path)  # the default root, ./registry, holds nothing: a --root that is ignored shows
    for argv in (["show", "demo", "--root", str(root)], ["--root", str(root), "show", "demo"],
                 ["show", "--root", str(root), "demo", "production"]):
        assert registry_cli.main(argv) == 0, argv
        assert json.loads(capsys.readouterr().out)["version"] == 1
    assert registry_cli.main(["list", "--root", str(root)]) == 0 and "v1" in capsys.readouterr().out
    assert registry_cli.main(["show", "demo"]) == 2  # ./registry: nothing there
    assert "registry" in capsys.readouterr().err


class FakeOnlineRun:
    """Stands in for an online wandb run: the one call W&B cannot make offline (link_artifact) is
    faked here and recorded; everything else about the flow is real."""

    offline = False
    disabled = False

    def __init__(self):
        self.logged, self.linked = [], []

    def log_artifact(self, artifact, aliases=None):
        self.logged.append((artifact.name, artifact.type, dict(artifact.metadata), aliases))
        return artifact

    def link_artifact(self, artifact, target_path, aliases=None):
        self.linked.append((artifact.name, target_path, aliases))


def test_wandb_mirror_offline_records_pending_link_and_online_completes_it(tmp_path, monkeypatch):
    import wandb

    from draftsmith import wandb_registry

    reg = LocalRegistry(tmp_path / "reg")
    reg.register("demo", fake_draft(tmp_path / "a", 1), metrics={}, promotion=PROMOTION, k=3)
    version_dir = reg.path("demo", 1)
    out = wandb_registry.link_model(None, version_dir, "demo", "drafts", ["production"], {"speedup": 1.4}, reg.root,
                                    mode="offline", wandb_dir=str(tmp_path / "wandb"))
    assert out["status"] == "pending"
    pending = json.loads((reg.root / wandb_registry.PENDING).read_text())
    assert pending == [{"version_dir": str(version_dir), "name": "demo", "collection": "drafts",
                        "aliases": ["production"], "metadata": {"speedup": 1.4}}]
    assert list((tmp_path / "wandb").glob("wandb/offline-run-*"))  # the artifact is logged for `wandb sync`

    run = FakeOnlineRun()
    assert wandb_registry.complete_pending(run, reg.root) == [str(version_dir)]
    assert run.linked == [("demo", "wandb-registry-model/drafts", ["production"])]
    assert run.logged[0][1] == "model" and run.logged[0][2] == {"speedup": 1.4}
    assert json.loads((reg.root / wandb_registry.PENDING).read_text()) == []

    out = wandb_registry.link_model(None, version_dir, "demo", "drafts", ["production"], {}, reg.root, mode="disabled")
    assert out["status"] == "disabled"
    assert wandb.run is None


@pytest.mark.parametrize("min_speedup, gate_failures", [(1.1, 0), (5.0, 1)])
def test_promote_rejects_when_the_production_draft_was_not_measured(tmp_path, min_speedup, gate_failures):
    """A production draft exists but this eval did not measure it (eval.compare_production=false):
    the candidate cannot be compared, so it is rejected with that reason, after any failed gates."""
    from draftsmith.config import DraftsmithConfig
    from draftsmith.promote import promote

    reg = LocalRegistry(tmp_path / "reg")
    reg.register("demo", fake_draft(tmp_path / "old", 1), metrics={}, promotion=PROMOTION, k=2)
    candidate = fake_draft(tmp_path / "new", 2)
    summary = {"trained": {"best_k": 4, "temperature": 0.0, "speedup": 1.5, "speedup_ci95": [1.4, 1.6],
                           "acceptance_rate": 0.7, "token_acceptance": 0.8, "mean_accepted_tokens": 3.0,
                           "greedy_match": 1.0}}
    (tmp_path / "run" / "eval").mkdir(parents=True)
    (tmp_path / "run" / "eval" / "metrics.json").write_text(json.dumps(
        {"schema_version": 1, "config": {"drafts": {"trained": str(candidate)}}, "records": [], "summary": summary}))
    cfg = DraftsmithConfig()
    cfg.promote.name, cfg.promote.min_speedup = "demo", min_speedup
    record = promote(cfg, tmp_path / "run", reg)
    assert record["promote"] is False and record["registry"] is None
    assert len(record["reasons"]) == gate_failures + 1
    assert (gate_failures == 0) == all("min_speedup" not in r for r in record["reasons"])
    assert "v1 was not measured on this eval set" in record["reasons"][-1]
    assert not any(r.startswith("all gates passed") for r in record["reasons"])
    assert [v["version"] for v in reg.versions("demo")] == [1]
