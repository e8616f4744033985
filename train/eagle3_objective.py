"""The EAGLE-3 objective (``method.finetune=eagle3``): a head over three of the target's layers (decode/eagle3.py),
trained with the training-time test (train/eagle3.py) in the one training loop (train/loop.py). It writes

    draft/              the head as a speculators-format folder (config.json with ``speculators_model_type: eagle3``,
                        its layer config, draft vocabulary, feature layers, norm flags and verifier; model.safetensors
                        under vLLM's names with ``d2t``/``t2d``): ``vllm serve draft/`` serves the verifier with it;
                        ``draftsmith_eagle.json`` (how it was trained) and the target's tokenizer
    features.pt         the target's features of the rows (train/features.py; deleted when the stage completes)

The draft vocabulary is the ``method.draft_vocab`` ids the target says most in the datagen output (decode/vocab.py
``datagen_vocab``, the target's EOS kept; 0: the whole vocabulary). The head starts from ``cfg.draft`` when that
is an EAGLE-3 folder for this target (trained further on new data), else from the target (decode/eagle3.py
``head_for_target``). Held-out figures (train/eagle3.py ``heldout_metrics``): agreement per unrolled position and
the acceptance length they imply, which ranks the evaluations (train/loop.py ``checkpoint_score``) under greedy
decoding.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.artifacts import atomic_dir
from draftsmith.decode.eagle3 import head_for_target, is_eagle3_dir, load_eagle3, save_eagle3
from draftsmith.decode.eos import pretrained_eos_ids
from draftsmith.decode.pair import load_model
from draftsmith.decode.runners import logit_width
from draftsmith.decode.vocab import datagen_vocab
from draftsmith.train.eagle3 import Shifted3, eagle3_loss, heldout_metrics, shifted3, target_aux_rows
from draftsmith.train.features import FEATURES, run_features
from draftsmith.train.loop import Objective, TrainingError
from draftsmith.train.settings import TrainConfig


def verifier_of(target: str, model) -> tuple[str, list[str]]:
    """(name_or_path, architectures) of the verifier a head folder names: a local target by its absolute path (what
    ``vllm serve HEAD_DIR`` loads), a hub id as given."""
    path = Path(target)
    name = str(path.resolve()) if path.exists() else target
    return name, list(getattr(model.config, "architectures", None) or [type(model).__name__])


def kept_states(cfg: TrainConfig, target, layers: list[int], bf16: bool, log=print):
    """(a reader of the target's states the datagen output keeps for these `layers`, for train/features.py
    run_features' `stored`, or None; where the features come from, for their key: "vllm" or "forward"). Rows the
    output keeps no states for (scored given responses) are computed by the forward."""
    from draftsmith.artifacts.formats import read_datagen_manifest
    from draftsmith.decode.eagle3 import final_norm
    from draftsmith.train.target_states import states_file, stored_features, stored_layers

    manifest = read_datagen_manifest(cfg.data_dir)
    kept = stored_layers(manifest)
    if kept is None:
        return None, "forward"
    if str(manifest.get("target")) != str(cfg.target):
        log(f"train: {cfg.data_dir} keeps the states of {manifest.get('target')}, not of pair.target={cfg.target}: "
            "the target runs over the rows here")
        return None, "forward"
    if sorted(kept[0]) != sorted(layers):
        log(f"train: {cfg.data_dir} keeps the target's states at layers {kept[0]}, the head reads {layers}: the "
            "target runs over the rows here")
        return None, "forward"
    norm, head_w = final_norm(target), target.get_output_embeddings().weight.detach()

    def stored(split: str, row: int, prompt: list[int], completion: list[int], top: bool):
        path = states_file(cfg.data_dir, split, row)
        if not path.exists() or len(prompt) + len(completion) < 3:  # a 2-token row has no slot without its last
            return None
        try:
            return stored_features(path, prompt, completion, len(layers), norm, head_w, top,
                                   torch.bfloat16 if bf16 and not top else torch.float32)
        except ValueError as exc:
            raise TrainingError(f"method.finetune=eagle3: {exc}") from exc

    log(f"train: the target's states at layers {layers} as vLLM kept them in {cfg.data_dir} "
        f"({manifest['hidden_states'].get('rows')} rows)")
    return stored, "vllm"


class Eagle3Objective(Objective):
    """An EAGLE-3 head over the target's teacher-forced features, scored by train/eagle3.py ``eagle3_loss`` (under
    ``method.mixed_precision``'s autocast; held-out figures in float32, as the head is served)."""

    label = "train (EAGLE-3 head)"

    def __init__(self, cfg: TrainConfig, accelerator, ds, tokenizer):
        self.cfg, self.accelerator, self.tokenizer = cfg, accelerator, tokenizer
        from draftsmith.decode.lean import lean_unsupported

        target = load_model(cfg.target, "target", "float32", accelerator.device)
        target.requires_grad_(False)
        reason = lean_unsupported(target)
        if reason is not None:  # the eval would refuse the head after all the training
            raise TrainingError(f"method.finetune=eagle3: draftsmith's loop runs an EAGLE-3 head on the target's lean "
                                f"forward, which does not cover {cfg.target!r} ({reason}); train a draft model "
                                "instead (method=kd)")
        self.verifier = verifier_of(cfg.target, target)
        width = logit_width(target)
        self.vocab_info = None
        vocab = None
        if cfg.draft_vocab and cfg.draft_vocab < width:
            vocab, self.vocab_info = datagen_vocab(cfg.data_dir, cfg.draft_vocab, width,
                                                   sorted(pretrained_eos_ids(cfg.target, tokenizer)),
                                                   key="method.draft_vocab")
        if is_eagle3_dir(cfg.draft):  # a head trained before, trained further (its own vocabulary and layers)
            try:
                head = load_eagle3(cfg.draft, target).train()
            except (ValueError, RuntimeError) as exc:
                raise TrainingError(f"method.finetune=eagle3: pair.draft={cfg.draft}: {exc}") from exc
            if cfg.eagle_layers is not None and sorted(cfg.eagle_layers) != head.layers:
                raise TrainingError(f"method.eagle_layers={list(cfg.eagle_layers)}, but the head at pair.draft="
                                    f"{cfg.draft} reads layers {head.layers}: unset method.eagle_layers to train it "
                                    "further, or train a new head (no EAGLE-3 folder as pair.draft)")
            if cfg.draft_vocab and cfg.draft_vocab != head.draft_vocab_size:
                raise TrainingError(f"method.draft_vocab={cfg.draft_vocab}, but the head at pair.draft={cfg.draft} "
                                    f"has {head.draft_vocab_size} ids: set method.draft_vocab=0 (keep its own) to "
                                    "train it further, or train a new head")
            self.vocab_info = {"size": head.draft_vocab_size, "source": str(cfg.draft)}
            accelerator.print(f"train: the EAGLE-3 head starts from {cfg.draft}")
        else:
            try:
                head = head_for_target(target, cfg.eagle_layers, vocab)
            except ValueError as exc:
                raise TrainingError(f"method.eagle_layers={cfg.eagle_layers}: {exc}") from exc
        self.model = self.bare = head
        self.emb_w = target.get_input_embeddings().weight.detach()
        self.full_w = target.get_output_embeddings().weight.detach()

        stored, source = kept_states(cfg, target, head.layers, str(accelerator.mixed_precision) == "bf16",
                                     accelerator.print)
        self.ftrain, self.fheld = run_features(cfg, accelerator, ds,
                                               lambda rows, top: target_aux_rows(target, rows, head.layers, top=top),
                                               stored=stored, kind="eagle3", layers=list(head.layers), source=source)
        self.n_rows = len(self.ftrain)

    def prepared(self, model) -> None:
        # the bare head without accelerate's autocast wrapper: held-out figures (and the best step they pick) in
        # float32, as the head is served; training runs under the autocast around its loss
        self.bare = self.accelerator.unwrap_model(model, keep_fp32_wrapper=False)
        self.bare.train()

    def batch(self, model, rows: list[int], micro: int) -> Shifted3:
        return shifted3([self.ftrain[i] for i in rows]).to(self.accelerator.device)

    def loss(self, model, batch: Shifted3) -> tuple[torch.Tensor, dict]:
        cfg = self.cfg
        with self.accelerator.autocast():
            # the forward through `model` (a data-parallel wrapper sees it), the head's logits on the module itself
            return eagle3_loss(self.bare, batch, self.emb_w, self.full_w, cfg.ttt_steps, cfg.ttt_decay,
                               cfg.eagle_loss_on, forward=model)

    def tokens(self, batch: Shifted3) -> int:
        return int(batch.valid.sum())

    def evaluate(self, model) -> dict:
        if not self.fheld:
            return {}
        cfg = self.cfg
        return heldout_metrics(self.bare, self.fheld, self.emb_w, self.full_w, cfg.ttt_steps, cfg.batch_size,
                               cfg.ttt_decay, cfg.eagle_loss_on)

    def record(self, history: dict) -> dict:
        return {"reduced_head": None, "draft_vocab": {**(self.vocab_info or {}),
                                                      "size": self.bare.draft_vocab_size}, "kind": "eagle3",
                "eagle_layers": list(self.bare.layers), "ttt_steps": self.cfg.ttt_steps,
                "features": {"train_rows": len(self.ftrain), "heldout_rows": len(self.fheld),
                             "tokens": sum(len(it["ids"]) for it in self.ftrain + self.fheld)}}

    def manifest(self) -> dict:
        return {"outputs": {"draft": "draft", "adapter": None}, "kind": "eagle3"}

    def save(self, model, out_dir: Path, step: int) -> None:
        cfg = self.cfg
        with atomic_dir(out_dir / "draft") as tmp:
            save_eagle3(tmp, self.bare, verifier=self.verifier[0], verifier_architectures=self.verifier[1],
                        k=cfg.ttt_steps, data=str(cfg.data_dir), target=str(cfg.target), step=step, lr=cfg.lr,
                        ttt_steps=cfg.ttt_steps, ttt_decay=cfg.ttt_decay, loss_on=cfg.eagle_loss_on,
                        train_rows=len(self.ftrain), draft_vocab=self.bare.draft_vocab_size)
            self.tokenizer.save_pretrained(tmp)

    def finished(self, out_dir: Path) -> None:
        (out_dir / FEATURES).unlink(missing_ok=True)
