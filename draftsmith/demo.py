"""The embedded demo pair: a tokenizer, a target and a draft built from the Python standard library.

Nothing is downloaded: the text is the running interpreter's own standard-library source (test
folders and generated tables left out), the tokenizer is a byte-level BPE trained on it, and both
models are small Llama-style causal LMs trained on it with fixed seeds. The pair is built once and
cached under a user cache directory (``DRAFTSMITH_CACHE`` overrides it), keyed by its spec.

The demo draft is made by draftsmith's own stages: the target answers prompts cut from the
standard library (datagen), and a small draft is distilled on those answers with the target as an
online teacher (train), so that it agrees with the target where it matters: on the target's own
outputs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from decode.artifacts import atomic_dir

EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "encodings", "pydoc_data", "__pycache__", "__phello__"}
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|unk|>"]


@dataclass
class ModelSpec:
    """Size of one Llama-style demo model and how long it trains."""

    layers: int
    hidden: int
    heads: int
    steps: int
    lr: float = 3e-3


@dataclass
class DemoSpec:
    """Everything that determines the demo tokenizer and target; its hash names the cache entry."""

    vocab_size: int = 4096
    seq_len: int = 128
    batch_size: int = 16
    target: ModelSpec = field(default_factory=lambda: ModelSpec(layers=8, hidden=512, heads=8, steps=160, lr=2e-3))
    seed: int = 0
    version: int = 1

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True) + sys.version.split()[0]
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass
class DraftSpec:
    """The distilled demo draft: its size, and the datagen + train run that aligns it to the target."""

    model: ModelSpec = field(default_factory=lambda: ModelSpec(layers=2, hidden=128, heads=2, steps=300, lr=3e-3))
    prompts: int = 384
    prompt_tokens: int = 48
    max_new_tokens: int = 64
    loss: str = "fkl"
    batch_size: int = 16
    seed: int = 1000  # prompt sampling seed, apart from the benchmark's held-out prompts (seed 0)
    version: int = 1

    def key(self, target_key: str) -> str:
        blob = json.dumps(asdict(self), sort_keys=True) + target_key
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def cache_root() -> Path:
    """Where built demo pairs live: $DRAFTSMITH_CACHE, else the platform's user cache dir."""
    env = os.environ.get("DRAFTSMITH_CACHE")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("draftsmith"))


def stdlib_files() -> list[Path]:
    """The standard library's .py files, sorted, without test folders and generated tables."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        p for p in root.rglob("*.py")
        if not EXCLUDED_DIRS.intersection(p.relative_to(root).parts) and not p.name.startswith("_sysconfigdata")
    ]
    if not files:
        raise RuntimeError(f"no standard-library source found under {root}; the demo needs the interpreter's .py files")
    return sorted(files)


def read_texts(files: list[Path]) -> list[str]:
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on `texts`, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|pad|>", bos_token="<|bos|>",
                                   eos_token="<|eos|>", unk_token="<|unk|>")


def pack(tokenizer, texts: list[str], seq_len: int) -> torch.Tensor:
    """Tokenize, join with EOS and cut into rows [N, seq_len]."""
    ids: list[int] = []
    for row in tokenizer(texts, add_special_tokens=False).input_ids:
        ids.extend(row)
        ids.append(tokenizer.eos_token_id)
    n = len(ids) // seq_len
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)


def make_model(spec: ModelSpec, tokenizer, seq_len: int, seed: int):
    """A fresh Llama-style causal LM of the given size (tied embeddings)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden, intermediate_size=spec.hidden * 8 // 3 // 32 * 32,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
        max_position_embeddings=max(1024, 4 * seq_len), tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def fit(model, rows: torch.Tensor, spec: ModelSpec, batch_size: int, seed: int, desc: str) -> list[float]:
    """Pretrain `model` on `rows` [N, T] with next-token cross-entropy.

    AdamW, linear warmup then cosine decay, gradient clipping at 1.0; returns the loss curve.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = max(1, spec.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(1.0, s / spec.steps)))))
    model.train()
    losses = []
    bar = tqdm(range(spec.steps), desc=desc, unit="step", dynamic_ncols=True)
    for _ in bar:
        batch = rows[torch.randint(0, rows.shape[0], (batch_size,), generator=gen)]  # [B, T]
        logits = model(input_ids=batch).logits[:, :-1].float()  # [B, T-1, V]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses


def build_demo_target(spec: DemoSpec | None = None, root: Path | None = None, log=print) -> Path:
    """The demo target directory (with its tokenizer), trained and cached on first use."""
    spec = spec or DemoSpec()
    entry = (root or cache_root()) / f"demo-target-{spec.key()}"
    if (entry / "manifest.json").exists():
        return entry / "target"
    with atomic_dir(entry) as tmp:
        started = time.time()
        torch.manual_seed(spec.seed)
        files = stdlib_files()
        log(f"draftsmith demo: training the demo target on {len(files)} standard-library files "
            f"(once; cached in {entry})")
        texts = read_texts(files)
        tokenizer = train_tokenizer(texts, spec.vocab_size)
        rows = pack(tokenizer, texts, spec.seq_len)
        log(f"draftsmith demo: tokenizer of {len(tokenizer)} tokens, {rows.numel():,} training tokens")
        target = make_model(spec.target, tokenizer, spec.seq_len, spec.seed)
        losses = fit(target, rows, spec.target, spec.batch_size, spec.seed, "demo target")
        target.eval()
        target.save_pretrained(tmp / "target")
        tokenizer.save_pretrained(tmp / "target")
        manifest = {"spec": asdict(spec), "python": sys.version, "files": len(files), "tokens": rows.numel(),
                    "params": target.num_parameters(), "final_loss": losses[-1], "build_s": time.time() - started}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return entry / "target"


def build_demo_draft(target_dir: Path, spec: DraftSpec | None = None, root: Path | None = None, log=print) -> Path:
    """A draft distilled from the demo target with draftsmith's own datagen and train stages, cached."""
    from train import datagen, trainer
    from train.prompts import PromptSource
    from transformers import AutoTokenizer

    spec = spec or DraftSpec()
    entry = (root or cache_root()) / f"demo-draft-{spec.key(Path(target_dir).parent.name)}"
    if (entry / "manifest.json").exists():
        return entry / "draft"
    with atomic_dir(entry) as tmp:
        started = time.time()
        log(f"draftsmith demo: distilling a {spec.model.layers}-layer draft from the demo target (once; cached in {entry})")
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
        prompts = demo_prompts(tokenizer, spec.prompts, spec.prompt_tokens, seed=spec.seed)
        jsonl = tmp / "prompts.jsonl"
        jsonl.write_text("".join(json.dumps({"prompt": tokenizer.decode(p[0])}) + "\n" for p in prompts))
        datagen.run(datagen.DatagenConfig(target=str(target_dir), prompts=PromptSource(str(jsonl)),
                                          out_dir=str(tmp / "datagen"), max_new_tokens=spec.max_new_tokens,
                                          batch_size=32, heldout_fraction=0.1, max_prompt_tokens=4 * spec.prompt_tokens))
        init = tmp / "init"
        make_model(spec.model, tokenizer, DemoSpec().seq_len, seed=1).save_pretrained(init)
        tokenizer.save_pretrained(init)
        metrics = trainer.run(trainer.TrainConfig(
            data_dir=str(tmp / "datagen"), draft=str(init), target=str(target_dir), out_dir=str(tmp / "train"),
            loss=spec.loss, teacher="online", steps=spec.model.steps, batch_size=spec.batch_size, lr=spec.model.lr,
            warmup_steps=spec.model.steps // 20, eval_every=max(1, spec.model.steps // 3), save_every=0, device="cpu"))
        os.replace(tmp / "train" / "draft", tmp / "draft")
        for sub in ("init", "train", "datagen"):
            shutil.rmtree(tmp / sub)
        jsonl.unlink()
        manifest = {"spec": asdict(spec), "target": str(target_dir), "final": metrics["final"],
                    "build_s": time.time() - started}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return entry / "draft"


def build_demo_pair(root: Path | None = None, log=print) -> tuple[Path, Path]:
    """(target_dir, draft_dir) of the demo pair, built and cached on first use."""
    target_dir = build_demo_target(root=root, log=log)
    return target_dir, build_demo_draft(target_dir, root=root, log=log)


def demo_prompts(tokenizer, n: int, prompt_tokens: int, seed: int = 0) -> list[torch.Tensor]:
    """`n` prompts [1, prompt_tokens] cut from random places of the standard library, seeded."""
    files = stdlib_files()
    gen = torch.Generator().manual_seed(seed)
    prompts: list[torch.Tensor] = []
    while len(prompts) < n:
        text = files[int(torch.randint(len(files), (1,), generator=gen))].read_text(encoding="utf-8", errors="replace")
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) < prompt_tokens + 1:
            continue
        start = int(torch.randint(len(ids) - prompt_tokens, (1,), generator=gen))
        prompts.append(torch.tensor([ids[start : start + prompt_tokens]]))
    return prompts
