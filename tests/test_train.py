"""train: losses go down, agreement goes up, LoRA merge, resume equality, NaN stop, clear input errors."""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_model, make_tokenizer
from draftsmith.artifacts.errors import ConfigError, UserError
from draftsmith.train import trainer
from draftsmith.train import distill, loop
from draftsmith.train.checkpoints import latest_checkpoint
from draftsmith.train.datagen import DatagenConfig
from draftsmith.train.datagen import run as run_datagen
from draftsmith.train.trainer import TrainConfig, TrainingError


def word_prompts(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [" ".join(f"w{int(i)}" for i in torch.randint(0, 60, (int(torch.randint(3, 9, (1,), generator=gen)),),
                                                             generator=gen)) for _ in range(n)]


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("pair")
    target = make_model("llama", seed=0)
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    draft = make_model("llama", seed=9, layers=1)
    draft.save_pretrained(root / "draft")
    tokenizer.save_pretrained(root / "draft")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in word_prompts(80)))
    run_datagen(DatagenConfig(target=str(root / "target"), prompts=str(prompts), out_dir=str(root / "data"),
                              max_new_tokens=12, batch_size=16, heldout_fraction=0.2, top_k_logprobs=8))
    return root


def cfg(pair_dirs, tmp_path, **kw):
    base = dict(data_dir=str(pair_dirs / "data"), draft=str(pair_dirs / "draft"), target=str(pair_dirs / "target"),
                out_dir=str(tmp_path / "train"), steps=30, batch_size=8, lr=3e-3, warmup_steps=2, eval_every=30,
                save_every=0, eval_rows=16)
    return TrainConfig(**(base | kw))


def first_last(metrics, key):
    return metrics["history"]["eval"][0][key], metrics["history"]["eval"][-1][key]


@pytest.mark.parametrize("loss, teacher", [("fkl", "online"), ("tvd", "online"), ("jsd", "cached"), ("ce", "online")])
def test_training_lowers_the_loss_and_raises_agreement(pair_dirs, tmp_path, loss, teacher):
    c = cfg(pair_dirs, tmp_path, loss=loss, teacher=teacher, eval_every=10)
    metrics = trainer.run(c)
    l0, l1 = first_last(metrics, "heldout/loss")
    a0, a1 = first_last(metrics, "heldout/top1_agreement")
    train_losses = [h["loss"] for h in metrics["history"]["train"]]
    assert sum(train_losses[-5:]) < sum(train_losses[:5]), train_losses
    assert l1 < l0 and a1 >= a0, (l0, l1, a0, a1)
    out = tmp_path / "train"
    assert (out / "draft" / "config.json").exists() and (out / "draft" / "tokenizer.json").exists()
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out / "draft")  # loadable
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["loss"] == loss and manifest["stage"] == "train"
    assert metrics["mixed_precision"] == "no"  # what auto resolved to: float32 for a draft model on a CPU


def test_baseline_agreement_starts_low(pair_dirs, tmp_path):
    metrics = trainer.run(cfg(pair_dirs, tmp_path, steps=1, lr=1e-9, eval_every=1))
    assert metrics["final"]["heldout/top1_agreement"] < 0.5


def test_lora_merged_model_matches_base_plus_adapter(pair_dirs, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer.run(cfg(pair_dirs, tmp_path, finetune="lora", lora_r=4, steps=8, lr=1e-2))
    out = tmp_path / "train"
    merged = AutoModelForCausalLM.from_pretrained(out / "draft").eval()
    base = AutoModelForCausalLM.from_pretrained(pair_dirs / "draft")
    with_adapter = PeftModel.from_pretrained(base, out / "adapter").eval()
    ids = torch.randint(4, 64, (2, 10))
    with torch.no_grad():
        a, b = merged(input_ids=ids).logits, with_adapter(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-4)
    fresh = AutoModelForCausalLM.from_pretrained(pair_dirs / "draft")
    with torch.no_grad():
        assert not torch.allclose(a, fresh(input_ids=ids).logits, atol=1e-3)  # training changed something


def test_lora_modules_that_match_nothing(pair_dirs, tmp_path):
    with pytest.raises(TrainingError, match=r"matches no module.*q_proj"):
        trainer.run(cfg(pair_dirs, tmp_path, finetune="lora", lora_target_modules=["attn_c"]))


def test_resume_gives_the_same_weights(pair_dirs, tmp_path, monkeypatch):
    common = dict(steps=6, save_every=2, eval_every=0, grad_accum=2, batch_size=4)
    trainer.run(cfg(pair_dirs, tmp_path / "a", **common))
    reference = load_file(tmp_path / "a" / "train" / "draft" / "model.safetensors")

    real = distill.batch_loss
    calls = {"n": 0}

    def crash_on_ninth(*args, **kwargs):  # micro-batch 9 = step 5 (grad_accum 2): after checkpoint 4
        calls["n"] += 1
        if calls["n"] == 9:
            raise KeyboardInterrupt("simulated kill")
        return real(*args, **kwargs)

    monkeypatch.setattr(distill, "batch_loss", crash_on_ninth)
    with pytest.raises(KeyboardInterrupt):
        trainer.run(cfg(pair_dirs, tmp_path / "b", **common))
    assert not (tmp_path / "b" / "train" / "draft").exists()
    assert latest_checkpoint(tmp_path / "b" / "train")[1] == 4
    monkeypatch.setattr(distill, "batch_loss", real)
    trainer.run(cfg(pair_dirs, tmp_path / "b", **common))
    resumed = load_file(tmp_path / "b" / "train" / "draft" / "model.safetensors")
    assert reference.keys() == resumed.keys()
    for key in reference:
        assert torch.equal(reference[key], resumed[key]), key


def test_non_finite_loss_stops_with_a_clear_message(pair_dirs, tmp_path, monkeypatch):
    real = distill.batch_loss
    calls = {"n": 0}

    def nan_on_third(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] == 3 else loss), metrics

    monkeypatch.setattr(distill, "batch_loss", nan_on_third)
    with pytest.raises(TrainingError, match=r"not finite .* at step 2.*step_0000002"):
        trainer.run(cfg(pair_dirs, tmp_path, steps=5, save_every=1, eval_every=0))
    assert latest_checkpoint(tmp_path / "train")[1] == 2


def test_on_policy_batches_run(pair_dirs, tmp_path, monkeypatch):
    """On-policy micro-batches are sampled from the draft and are the batches the loss is computed on."""
    sampled, scored = [], []
    real_sample, real_loss = distill.on_policy_batch, distill.batch_loss

    def sample(*args, **kwargs):
        sampled.append(real_sample(*args, **kwargs))
        return sampled[-1]

    def loss(cfg_, logits, batch, *rest):
        scored.append(batch)
        return real_loss(cfg_, logits, batch, *rest)

    monkeypatch.setattr(distill, "on_policy_batch", sample)
    monkeypatch.setattr(distill, "batch_loss", loss)
    c = cfg(pair_dirs, tmp_path, on_policy_fraction=0.5, on_policy_max_new_tokens=6, steps=4, grad_accum=2,
            eval_every=0)
    metrics = trainer.run(c)
    assert len(metrics["history"]["train"]) == 4
    # the loop's draw: micro-batch m is on-policy when rand(seed + m) < fraction (the same on every rank)
    expected = sum(torch.rand(1, generator=torch.Generator().manual_seed(c.seed + m)).item() < 0.5 for m in range(8))
    assert 0 < expected < 8  # this seed mixes both kinds, so the check below can fail either way
    assert metrics["on_policy_batches"] == len(sampled) == expected
    assert [h["on_policy_batches"] for h in metrics["history"]["train"]] == [
        sum(torch.rand(1, generator=torch.Generator().manual_seed(c.seed + 2 * s + m)).item() < 0.5 for m in range(2))
        for s in range(4)]
    assert all(any(b is s for b in scored) for s in sampled)  # each sampled batch was trained on
    for batch in sampled:  # prompt + up to 6 sampled tokens, scored on the sampled tokens only
        assert all(batch.loss_mask[i].sum() <= 6 for i in range(len(batch.prompt_lens)))
        assert batch.input_ids.shape[1] <= max(batch.prompt_lens) + 6
    saved = json.loads((tmp_path / "train" / "train_metrics.json").read_text())
    assert saved["on_policy_batches"] == expected


def test_draft_from_config_is_random_init(pair_dirs, tmp_path):
    metrics = trainer.run(cfg(pair_dirs, tmp_path, draft_from_config=True, steps=2, eval_every=2))
    assert metrics["final"]["heldout/loss"] > 0


def test_bad_inputs_fail_before_training(pair_dirs, tmp_path, tokenizer):
    with pytest.raises(TrainingError, match="fewer than method.batch_size=500"):
        trainer.run(cfg(pair_dirs, tmp_path, batch_size=500))
    other = tmp_path / "other"
    make_model("llama", seed=1, layers=1).save_pretrained(other)
    make_tokenizer([f"v{i}" for i in range(60)]).save_pretrained(other)
    with pytest.raises(Exception, match="tokenizer"):
        trainer.run(cfg(pair_dirs, tmp_path, draft=str(other)))
    with pytest.raises(TrainingError, match="generated by .* not by the configured target"):
        trainer.run(cfg(pair_dirs, tmp_path, target=str(other)))
    with pytest.raises(TrainingError, match="generated by .* tokenizer differs"):
        trainer.run(cfg(pair_dirs, tmp_path, target=str(other), allow_other_target=True))
    with pytest.raises(UserError, match="not a datagen output"):
        trainer.run(cfg(pair_dirs, tmp_path, data_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="pair.target is required"):
        TrainConfig(data_dir="d", draft="x", out_dir="o", loss="fkl", teacher="online")
    with pytest.raises(ConfigError, match="method.loss='kl' is not one of"):
        TrainConfig(data_dir="d", draft="x", out_dir="o", loss="kl", target="t")
    with pytest.raises(ConfigError, match="method.lora_r must be >= 1"):  # the rank, not the target modules
        TrainConfig(data_dir="d", draft="x", out_dir="o", finetune="lora", lora_r=0)


@pytest.mark.slow
def test_two_cpu_processes_train_one_model(pair_dirs, tmp_path):
    """torchrun with 2 CPU processes (gloo): both ranks take part, parameters stay identical, one output."""
    import dataclasses
    import os
    import subprocess
    import sys

    import psutil

    config = cfg(pair_dirs, tmp_path, steps=4, batch_size=4, save_every=2, eval_every=4)
    path = tmp_path / "train.json"
    path.write_text(json.dumps(dataclasses.asdict(config)))
    # loopback only: the rendezvous, the ranks' store and gloo never resolve this host's name (a sandbox whose name
    # resolves nowhere would hang them)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    # --standalone: the rendezvous on a free port, not the fixed 29500 another process may hold
    log = tmp_path / "torchrun.log"
    with open(log, "w") as sink:
        # the log is a file, not a pipe: torchrun starts each rank in a session of its own, so a rank that outlives
        # torchrun would hold a pipe open and block the read forever
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr",
                                 "127.0.0.1", "--nproc_per_node", "2", "-m", "draftsmith.train.trainer", str(path)],
                                stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                try:
                    p.kill()  # the ranks too: they are not in torchrun's process group
                except psutil.NoSuchProcess:
                    pass
            proc.wait()
            pytest.fail(f"torchrun did not finish in 300 s; its log ends:\n{log.read_text()[-3000:]}")
    assert proc.returncode == 0, log.read_text()[-3000:]
    out = tmp_path / "train"
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["world_size"] == 2
    a, b = metrics["rank_param_checksums"]  # gathered from both ranks
    assert a == b
    assert [p.name for p in out.iterdir() if p.name.startswith("draft")] == ["draft"]
    assert latest_checkpoint(out)[1] == 4


def test_metrics_reach_wandb_offline(pair_dirs, tmp_path, monkeypatch):
    """accelerate's tracker interface with W&B in offline mode: the run's history holds the train metrics."""
    from wandb_offline import history

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    # mode and dir also as init arguments: once a wandb session exists in this process (other tests),
    # wandb ignores changed environment variables
    trainer.run(cfg(pair_dirs, tmp_path, steps=3, eval_every=3, log_with="wandb", tracker_project="draftsmith-test",
                    tracker_init={"wandb": {"mode": "offline", "dir": str(tmp_path)}}))
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    rows = history(runs[0])
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == 3 and all(v > 0 for v in losses)
    assert any("heldout/top1_agreement" in r for r in rows)


def test_the_optimizer_is_adamw_fused_and_steps_as_adamw_does(monkeypatch):
    """new_optimizer: the fused AdamW kernel on the CPU (one pass per parameter), the same update as plain AdamW
    to float rounding, and plain AdamW where torch has no fused kernel for the parameters' device."""
    cfg = TrainConfig(data_dir="d", draft="m", out_dir="o", lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(7, 5, generator=gen), torch.randn(5, generator=gen)]
    grads = [[torch.randn(t.shape, generator=gen) for t in start] for _ in range(3)]
    fused = [torch.nn.Parameter(t.clone()) for t in start]
    plain = [torch.nn.Parameter(t.clone()) for t in start]
    opt = loop.new_optimizer(fused, cfg)
    ref = torch.optim.AdamW(plain, lr=1e-2, weight_decay=0.1, foreach=False)
    assert opt.defaults["fused"] is True and opt.defaults["lr"] == 1e-2 and opt.defaults["weight_decay"] == 0.1
    for step in grads:
        for params, o in ((fused, opt), (plain, ref)):
            for p, g in zip(params, step):
                p.grad = g.clone()
            o.step()
    for a, b, s in zip(fused, plain, start):
        assert not torch.equal(a.detach(), s)  # it moved
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
    # torch checks the fused kernel's devices only at the first step(): new_optimizer asks before building it
    import torch.utils._foreach_utils as foreach_utils

    monkeypatch.setattr(foreach_utils, "_get_fused_kernels_supported_devices", lambda: ["cuda"])
    fallback = loop.new_optimizer([torch.nn.Parameter(torch.zeros(3))], cfg)
    assert not fallback.defaults["fused"] and fallback.defaults["lr"] == 1e-2
    fallback.param_groups[0]["params"][0].grad = torch.ones(3)
    fallback.step()  # steps, where a fused optimizer on a device without the kernel would raise here


def test_auto_precision_is_bf16_for_an_eagle_head_on_a_cpu_with_native_bf16_only(monkeypatch):
    amx = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f amx_bf16 amx_tile\n"
    avx512bf16 = "flags\t\t: fpu avx512f avx512_bf16\n"
    avx2 = "flags\t\t: fpu sse avx2 fma\n"
    assert loop.cpu_has_native_bf16(amx) and loop.cpu_has_native_bf16(avx512bf16)
    assert not loop.cpu_has_native_bf16(avx2) and not loop.cpu_has_native_bf16("")
    for native in (True, False):
        monkeypatch.setattr(loop, "cpu_has_native_bf16", lambda cpuinfo=None, native=native: native)
        eagle = TrainConfig(data_dir="d", draft="m", target="t", out_dir="o", finetune="eagle")
        assert loop.mixed_precision(eagle, "cpu") == ("bf16" if native else "no")
        assert loop.mixed_precision(TrainConfig(data_dir="d", draft="m", out_dir="o"), "cpu") == "no"
        no = TrainConfig(data_dir="d", draft="m", target="t", out_dir="o", finetune="eagle", mixed_precision="no")
        assert loop.mixed_precision(no, "cpu") == "no"  # an explicit setting is kept


def test_a_second_run_in_one_process_takes_its_own_precision(tmp_path):
    """accelerate keeps process-wide state that refused a second Accelerator with another mixed precision (a Hydra
    multirun over method.mixed_precision); new_accelerator starts each run from a cleared state."""
    from accelerate.state import PartialState

    cfg = TrainConfig(data_dir="d", draft="m", target="t", out_dir=str(tmp_path), finetune="eagle")
    first = loop.new_accelerator(dataclasses.replace(cfg, mixed_precision="bf16"), "cpu")
    assert first.mixed_precision == "bf16"
    second = loop.new_accelerator(dataclasses.replace(cfg, mixed_precision="no"), "cpu")
    assert second.mixed_precision == "no" and second.device.type == "cpu"
    assert PartialState().num_processes == 1
