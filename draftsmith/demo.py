"""The embedded demo pair: a tokenizer, a target and a draft built from the Python standard library.

Nothing is downloaded: the text is the running interpreter's own standard-library source (test
folders and generated tables left out), the tokenizer is a byte-level BPE trained on it, and both
models are small Llama-style causal LMs trained on it with fixed seeds. The pair is built once and
cached under a user cache directory (``DRAFTSMITH_CACHE`` overrides it), keyed by its spec.

The pair is a target trained on the whole standard library and a *base* draft, a much smaller
model pretrained on a different slice of it (everything outside the demo domain packages), so
that it is plausibly misaligned with the target on the demo domain. The pipeline then distills
the base draft on the target's answers to domain prompts (:func:`write_domain_prompts`).

:func:`build_demo_draft` (used by the decode benchmark) distills a draft from scratch with
draftsmith's own datagen and train stages.
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

from draftsmith.artifacts import atomic_dir, write_text
from draftsmith.artifacts.progress import progress
from draftsmith.artifacts.errors import UserError

EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "encodings", "pydoc_data", "__pycache__", "__phello__"}
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|unk|>"]
# The demo domain: prompts for datagen and eval come from these top-level packages; the base
# draft never sees them, the target sees everything.
DOMAIN_PACKAGES = ("asyncio", "email", "http", "json", "logging", "urllib", "xml", "concurrent", "multiprocessing",
                   "importlib", "unittest", "xmlrpc", "wsgiref", "sqlite3")


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
    target: ModelSpec = field(default_factory=lambda: ModelSpec(layers=6, hidden=512, heads=8, steps=150, lr=2e-3))
    base_draft: ModelSpec = field(default_factory=lambda: ModelSpec(layers=2, hidden=128, heads=2, steps=200, lr=3e-3))
    domain: tuple[str, ...] = DOMAIN_PACKAGES
    seed: int = 0
    version: int = 2

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


PRESETS = {
    "default": DemoSpec(),
    # seconds to build; for tests of the demo path (bootstrap, domain prompts), not for measurements
    "tiny": DemoSpec(vocab_size=300, seq_len=32, batch_size=4, target=ModelSpec(layers=1, hidden=32, heads=2, steps=3),
                     base_draft=ModelSpec(layers=1, hidden=16, heads=2, steps=2)),
}


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
        raise UserError(f"no standard-library source found under {root}; the demo needs the interpreter's .py files "
                        "(install the full Python, not a minimal one without its library sources)")
    return sorted(files)


def in_domain(path: Path, domain: tuple[str, ...]) -> bool:
    """Whether a standard-library file belongs to one of the `domain` top-level packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return path.relative_to(root).parts[0].removesuffix(".py") in domain


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
    bar = progress(range(spec.steps), desc=desc, unit="step")
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


def build_demo_pair(spec: DemoSpec | None = None, root: Path | None = None, log=print) -> tuple[Path, Path]:
    """(target_dir, base_draft_dir) of the demo pair, trained and cached on first use.

    The target is trained on the whole standard library; the base draft on the files outside
    ``spec.domain``. Both directories hold the shared tokenizer.
    """
    spec = spec or DemoSpec()
    entry = (root or cache_root()) / f"demo-pair-{spec.key()}"
    if not (entry / "manifest.json").exists():
        with atomic_dir(entry) as tmp:
            started = time.time()
            torch.manual_seed(spec.seed)
            files = stdlib_files()
            log(f"draftsmith demo: building the demo pair from {len(files)} standard-library files "
                f"(once; cached in {entry})")
            texts = read_texts(files)
            tokenizer = train_tokenizer(texts, spec.vocab_size)
            rows = pack(tokenizer, texts, spec.seq_len)
            other = pack(tokenizer, [t for f, t in zip(files, texts) if not in_domain(f, spec.domain)], spec.seq_len)
            log(f"draftsmith demo: tokenizer of {len(tokenizer)} tokens; target on {rows.numel():,} tokens, "
                f"base draft on the {other.numel():,} tokens outside the demo domain")
            target = make_model(spec.target, tokenizer, spec.seq_len, spec.seed)
            target_losses = fit(target, rows, spec.target, spec.batch_size, spec.seed, "demo target")
            draft = make_model(spec.base_draft, tokenizer, spec.seq_len, spec.seed + 1)
            draft_losses = fit(draft, other, spec.base_draft, spec.batch_size, spec.seed + 1, "demo base draft")
            for name, model in (("target", target), ("base-draft", draft)):
                model.eval()
                model.save_pretrained(tmp / name)
                tokenizer.save_pretrained(tmp / name)
            manifest = {"spec": asdict(spec), "python": sys.version, "files": len(files), "tokens": rows.numel(),
                        "target_params": target.num_parameters(), "target_final_loss": target_losses[-1],
                        "draft_params": draft.num_parameters(), "draft_final_loss": draft_losses[-1],
                        "build_s": time.time() - started}
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return entry / "target", entry / "base-draft"


def build_demo_target(spec: DemoSpec | None = None, root: Path | None = None, log=print) -> Path:
    """The demo target directory (with its tokenizer), built with the pair on first use."""
    return build_demo_pair(spec, root, log)[0]


def write_domain_prompts(path: Path, tokenizer, n: int = 320, prompt_tokens: int = 48, seed: int = 1000,
                         domain: tuple[str, ...] = DOMAIN_PACKAGES) -> Path:
    """Write `n` demo-domain prompts as JSONL ({"prompt": text}) to `path` (atomically); returns it."""
    prompts = demo_prompts(tokenizer, n, prompt_tokens, seed=seed, domain=domain)
    write_text(path, "".join(json.dumps({"prompt": tokenizer.decode(p[0])}) + "\n" for p in prompts))
    return path


def build_demo_draft(target_dir: Path, spec: DraftSpec | None = None, root: Path | None = None, log=print) -> Path:
    """A draft distilled from the demo target with draftsmith's own datagen and train stages, cached."""
    from transformers import AutoTokenizer

    from draftsmith.train import datagen, trainer

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
        datagen.run(datagen.DatagenConfig(target=str(target_dir), prompts=str(jsonl), top_k_logprobs=0,
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


def demo_prompts(tokenizer, n: int, prompt_tokens: int, seed: int = 0, domain: tuple[str, ...] | None = None,
                 files: list[Path] | None = None) -> list[torch.Tensor]:
    """`n` prompts [1, prompt_tokens] cut from random places of the standard library (or of the
    `domain` packages only), seeded; from `files` instead when given (e.g. standard-library text that
    :func:`stdlib_files` leaves out)."""
    files = stdlib_files() if files is None else list(files)
    if domain is not None:
        files = [f for f in files if in_domain(f, domain)]
    gen = torch.Generator().manual_seed(seed)
    prompts: list[torch.Tensor] = []
    tokenized: dict[Path, list[int]] = {}  # a file drawn again is not tokenized again (one large file: many draws)
    while len(prompts) < n:
        path = files[int(torch.randint(len(files), (1,), generator=gen))]
        if path not in tokenized:
            text = path.read_text(encoding="utf-8", errors="replace")
            tokenized[path] = tokenizer(text, add_special_tokens=False).input_ids
        ids = tokenized[path]
        if len(ids) < prompt_tokens + 1:
            continue
        start = int(torch.randint(len(ids) - prompt_tokens, (1,), generator=gen))
        prompts.append(torch.tensor([ids[start : start + prompt_tokens]]))
    return prompts
