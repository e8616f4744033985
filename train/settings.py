"""The settings of the datagen and train stages: the schema the pipeline's Hydra config nests.

Each setting is declared once, here, with its one default; ``data.*`` keys are
:class:`DatagenSettings`, ``method.*`` keys are :class:`TrainSettings`. Checks run in
``__post_init__`` (so a Hydra override, a YAML preset and the Python API are validated alike) and
name the key the user types. The stages' run configs (``train.datagen.DatagenConfig``,
:class:`TrainConfig`) extend these with the paths the pipeline wires in. Light to import
(no torch), so that the command line starts fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from draftsmith.artifacts.errors import check, check_choice
from draftsmith.artifacts.hashing import WHERE
from draftsmith.serve.settings import ServerSettings
from draftsmith.train.prompts import PromptFormat, PromptSource

LOSSES = ("ce", "fkl", "rkl", "jsd", "tvd")
ENGINES = ("hf", "vllm", "auto")
RESPONSES = ("generate", "given", "auto")
HIDDEN_STATES = ("none", "eagle3", "auto")


@dataclass(kw_only=True)
class DatagenVllmSettings(ServerSettings):
    """How datagen runs the target on vLLM (``data.engine=vllm``): the schema of the ``data.vllm.*`` keys.

    The server settings shared with the serving A/B (``serve.*``: draftsmith/serve/settings.py), under
    their datagen prefix. vLLM's OpenAI-compatible server is started here (train/datagen_vllm.py) unless
    `url` names one that runs elsewhere.
    """

    KEY: ClassVar[str] = "data.vllm"


@dataclass(kw_only=True)
class DatagenSettings(PromptFormat):
    """The datagen settings: the schema of the pipeline's ``data.*`` keys (one declaration, one default).

    Errors name the ``data.*`` key; the Python API takes the same names.
    """

    prompts: str = ""  # .jsonl / .parquet / folder of text files / HF dataset id
    max_prompts: Optional[int] = None  # stop reading after this many kept prompts
    max_prompt_tokens: int = 512  # longer prompts are dropped (counted in the manifest)
    heldout_fraction: float = 0.1  # share of prompts held out for eval, by text hash
    min_prompts: int = 1  # fewer usable training prompts than this is an error
    max_new_tokens: int = 128  # target completion length
    temperature: float = 0.0  # 0 = greedy completions
    top_p: float = 1.0
    n_completions: int = 1  # completions per prompt (sampling only)
    top_k_logprobs: int = 32  # > 0 keeps the target's top-k log-probs (needed by method.teacher=cached)
    batch_size: int = 32  # hf: prompts per generate batch; vllm: requests in flight (>= the server's --max-num-seqs)
    seed: int = 0
    engine: str = "hf"  # hf (transformers generate, here) | vllm (vLLM's server: data.vllm.*) | auto (vllm where
    # data.vllm.url is set or data.vllm.python imports vLLM, else hf; the pipeline resolves it before hashing)
    # where completions come from: generate (the target writes them) | given (a record's own response, which the
    # target scores: top-k log-probs from one forward; data.engine=hf) | auto (given where a record carries one,
    # else generated). Which records carry one: train/prompts.py
    responses: str = "generate"
    # the target's hidden states kept beside the rows, from vLLM as it writes them (data.engine=vllm; one per
    # generated row): none | eagle3 (the streams entering the layers an EAGLE-3 head reads by default, vLLM's
    # (2, L//2, L-3), and the stream after the last layer, the final norm's input): a method=eagle3 train stage
    # reads them instead of running the target over the rows (train/target_states.py) | auto (eagle3 where that
    # train stage would run the target in float32 on a CPU, none elsewhere; the pipeline resolves it before
    # hashing: draftsmith/preflight.py resolve_hidden_states; the Python API's datagen, with no train stage to keep
    # them for, takes none)
    hidden_states: str = "none"
    vllm: DatagenVllmSettings = field(default_factory=DatagenVllmSettings, metadata=WHERE)  # how the server runs

    def __post_init__(self):
        super().__post_init__()
        check_choice("data.engine", self.engine, ENGINES)
        check_choice("data.responses", self.responses, RESPONSES)
        check_choice("data.hidden_states", self.hidden_states, HIDDEN_STATES)
        check(self.hidden_states != "eagle3" or self.n_completions == 1,
              "data.hidden_states=eagle3 needs data.n_completions=1: vLLM keeps one sequence's states per request")
        if isinstance(self.vllm, dict):  # the Python API and JSON configs may give the section as a dict
            self.vllm = DatagenVllmSettings(**self.vllm)
        check(self.max_new_tokens >= 1, f"data.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check(self.n_completions >= 1, f"data.n_completions must be >= 1, got {self.n_completions}")
        check(self.n_completions == 1 or self.temperature > 0,
              "data.n_completions > 1 needs data.temperature > 0: greedy completions would be identical")
        check(self.temperature >= 0, f"data.temperature must be >= 0, got {self.temperature}")
        check(0.0 < self.top_p <= 1.0, f"data.top_p must be in (0, 1], got {self.top_p}")
        check(self.batch_size >= 1, f"data.batch_size must be >= 1, got {self.batch_size}")
        check(self.top_k_logprobs >= 0, f"data.top_k_logprobs must be >= 0, got {self.top_k_logprobs}")
        check(self.max_prompt_tokens >= 1, f"data.max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        check(0.0 <= self.heldout_fraction < 1.0, f"data.heldout_fraction must be in [0, 1), got {self.heldout_fraction}")
        check(self.max_prompts is None or self.max_prompts >= 1,
              f"data.max_prompts must be >= 1 (or unset), got {self.max_prompts}")
        check(self.min_prompts >= 1, f"data.min_prompts must be >= 1, got {self.min_prompts}")

    def source(self) -> PromptSource:
        """The :class:`PromptSource` of these settings."""
        fmt = {f.name: getattr(self, f.name) for f in dataclasses.fields(PromptFormat)}
        return PromptSource(self.prompts, **fmt)


FINETUNES = ("full", "lora", "eagle", "eagle3")
HEADS = ("eagle", "eagle3")  # finetunes that train a head over the target's features, not a draft model
TEACHERS = ("cached", "online")
CACHED_TAILS = ("uniform", "bucket")
MIXED_PRECISION = ("auto", "no", "bf16", "fp16")
BEST_BY = ("auto", "expected_acceptance", "top1_agreement")


RENAMED = {"method": "finetune"}  # TrainSettings fields that were renamed: old -> new (draftsmith/config.py RENAMED)


@dataclass(kw_only=True)
class LoopSettings:
    """What every kind of training shares: the one training loop (train/loop.py), its schedule, held-out
    evaluations, best step and checkpoints."""

    name: str = "kd"  # a label for reports: kd | lora | seq-kd | on-policy | ...
    # what training changes: full (every weight of the draft) | lora (adapters, merged into the draft) | eagle (an
    # EAGLE-1 head over the target's own features, in place of a draft model: train/eagle_objective.py) | eagle3 (an
    # EAGLE-3 head over three of its layers, with its own draft vocabulary; a speculators-format folder:
    # train/eagle3_objective.py)
    finetune: str = "full"
    steps: int = 400  # optimizer steps
    batch_size: int = 16  # rows per micro-batch per process
    grad_accum: int = 1
    lr: float = 3e-3
    warmup_steps: int = 15
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_len: Optional[int] = None  # truncate rows to this many tokens
    mixed_precision: str = "auto"  # auto | no | bf16 | fp16
    eval_every: int = 100  # held-out metrics every N steps (0 = never)
    eval_rows: int = 64
    # the draft written is the one of the held-out evaluation with the best expected acceptance (top-1 agreement
    # without a teacher distribution), not the last step's; false: the last step's
    keep_best: bool = True
    # what ranks held-out evaluations: expected_acceptance (sum min(p, q): sampling) | top1_agreement (the draft's
    # argmax is the target's: greedy decoding; an EAGLE-3 head's greedy figure over all its proposals, the
    # acceptance length, ranks first) | auto (the pipeline: top1_agreement when every eval.temperature is 0)
    best_by: str = "auto"
    patience: int = 0  # stop after this many held-out evaluations without a better one (0 = train every step)
    save_every: int = 100  # checkpoint every N steps and at the end (0 = never: no resume)
    keep_checkpoints: int = 2
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda

    def check_loop(self) -> None:
        check_choice("method.finetune", self.finetune, FINETUNES)
        check_choice("method.mixed_precision", self.mixed_precision, MIXED_PRECISION)
        for key in ("steps", "batch_size", "grad_accum", "eval_rows"):
            check(getattr(self, key) >= 1, f"method.{key} must be >= 1, got {getattr(self, key)}")
        for key in ("eval_every", "save_every"):
            check(getattr(self, key) >= 0, f"method.{key} must be >= 0 (0 = never), got {getattr(self, key)}")
        check(self.lr > 0, f"method.lr must be > 0, got {self.lr}")
        check(self.warmup_steps >= 0, f"method.warmup_steps must be >= 0, got {self.warmup_steps}")
        check_choice("method.best_by", self.best_by, BEST_BY)
        check(self.patience >= 0, f"method.patience must be >= 0 (0 = never stop early), got {self.patience}")
        check(self.patience == 0 or self.eval_every > 0,
              "method.patience stops on held-out evaluations: it needs method.eval_every > 0")
        check(self.keep_checkpoints >= 1, f"method.keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        check(self.max_len is None or self.max_len >= 2, f"method.max_len must be >= 2 (or unset), got {self.max_len}")


@dataclass(kw_only=True)
class DistillSettings:
    """A draft model distilled from the target (method.finetune full or lora: train/distill.py): the loss, the
    teacher, on-policy batches; the reduced head (an EAGLE-1 head takes it too). Checked whatever the kind."""

    loss: str = "fkl"  # ce | fkl | rkl | jsd | tvd
    beta: float = 0.5  # generalized JSD mixing weight
    teacher: str = "cached"  # cached (datagen's top-k log-probs) | online (target forward per batch)
    cached_tail: str = "uniform"  # cached teacher's tail mass: spread evenly (uniform) or one bucket (bucket)
    on_policy_fraction: float = 0.0  # share of steps trained on draft-sampled continuations
    on_policy_max_new_tokens: int = 32
    freeze_embeddings: bool = False  # full method: keep the input embedding and the output head fixed (tied or not)
    # train the draft's head only on eval.draft_vocab's ids (the tokens it will propose from): the head's logits
    # are most of a large-vocabulary draft's step; needs eval.draft_vocab > 0 (an EAGLE-1 head takes it too)
    reduced_head: bool = False

    def check_distill(self) -> None:
        check_choice("method.loss", self.loss, LOSSES)
        check_choice("method.teacher", self.teacher, TEACHERS)
        check_choice("method.cached_tail", self.cached_tail, CACHED_TAILS)
        check(0.0 <= self.beta <= 1.0, f"method.beta must be in [0, 1], got {self.beta}")
        check(0.0 <= self.on_policy_fraction <= 1.0,
              f"method.on_policy_fraction must be in [0, 1], got {self.on_policy_fraction}")
        check(self.on_policy_max_new_tokens >= 1,
              f"method.on_policy_max_new_tokens must be >= 1, got {self.on_policy_max_new_tokens}")
        check(not (self.reduced_head and self.cached_tail == "bucket"),
              "method.reduced_head trains the head on the draft vocabulary's ids, which the one-bucket tail of "
              "method.cached_tail=bucket cannot be restricted to; use method.cached_tail=uniform")
        check(not (self.reduced_head and self.on_policy_fraction > 0),
              "method.reduced_head with on-policy batches is not supported (the draft samples from its full head); "
              "set method.on_policy_fraction=0 or method.reduced_head=false")


@dataclass(kw_only=True)
class LoraSettings:
    """LoRA adapters on the draft (method.finetune=lora), merged into it when training ends."""

    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: Any = "all-linear"  # "all-linear" or a list of module names (e.g. [q_proj, v_proj])

    def check_lora(self) -> None:
        check(self.lora_r >= 1, f"method.lora_r must be >= 1 (the LoRA rank), got {self.lora_r}")
        check(self.lora_alpha > 0, f"method.lora_alpha must be > 0, got {self.lora_alpha}")
        check(0.0 <= self.lora_dropout < 1.0, f"method.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        modules = self.lora_target_modules
        check(modules == "all-linear" or (isinstance(modules, (list, tuple)) and modules
                                          and all(isinstance(m, str) and m for m in modules)),
              f"method.lora_target_modules must be 'all-linear' or a non-empty list of module names, got {modules!r}")


@dataclass(kw_only=True)
class EagleSettings:
    """A head over the target's own features (method.finetune eagle: EAGLE-1, train/eagle.py; eagle3: EAGLE-3 with
    the training-time test, train/eagle3.py)."""

    # the slots the loss covers: all (every position of a row) | completion (the response's, where decode rounds
    # propose: EAGLE's own loss mask); the head reads the prompt's slots either way
    eagle_loss_on: str = "all"
    eagle_w_reg: float = 1.0  # eagle: weight of the feature regression (smooth-L1 to the target's next feature)
    eagle_second: float = 0.0  # eagle: weight of the second proposal's cross-entropy (K >= 2 rounds; 0 = EAGLE-1's)
    eagle_noise: float = 0.0  # eagle: uniform noise in [-x, x] on the features the head reads in training (EAGLE-1's)
    # eagle3: the target's layers whose input streams the head fuses (3 distinct ids); unset: vLLM's (2, L//2, L-3)
    eagle_layers: Any = None
    # the draft's vocabulary: eagle3, the N ids the target says most in the training data (its head's rows, mapped to
    # the target's by d2t; 0 = the target's whole vocabulary); method.reduced_head: the eval's (set from
    # eval.draft_vocab by the pipeline)
    draft_vocab: int = 0
    ttt_steps: int = 3  # eagle3: unrolled steps of the training-time test (the proposals trained as decoding makes them)
    ttt_decay: float = 0.8  # eagle3: step j's loss weighs ttt_decay ** j (EAGLE-3's and SpecForge's 0.8)

    def check_eagle(self, finetune: str) -> None:
        check_choice("method.eagle_loss_on", self.eagle_loss_on, ("all", "completion"))
        check(self.eagle_w_reg >= 0, f"method.eagle_w_reg must be >= 0, got {self.eagle_w_reg}")
        check(self.eagle_second >= 0, f"method.eagle_second must be >= 0, got {self.eagle_second}")
        check(self.eagle_noise >= 0, f"method.eagle_noise must be >= 0, got {self.eagle_noise}")
        if finetune != "eagle3":
            return
        layers = self.eagle_layers
        check(layers is None or (isinstance(layers, (list, tuple)) and len(layers) == 3
                                 and all(isinstance(i, int) and i >= 0 for i in layers) and len(set(layers)) == 3),
              f"method.eagle_layers must be 3 distinct layer ids of the target (or unset: vLLM's (2, L//2, L-3)), "
              f"got {layers!r}")
        check(self.ttt_steps >= 1, f"method.ttt_steps must be >= 1, got {self.ttt_steps}")
        check(0 < self.ttt_decay <= 1, f"method.ttt_decay must be in (0, 1], got {self.ttt_decay}")
        eagle1_only = [f"method.{key}={getattr(self, key)}" for key, default in
                       (("eagle_w_reg", 1.0), ("eagle_second", 0.0), ("eagle_noise", 0.0))
                       if getattr(self, key) != default]
        check(not eagle1_only, f"{', '.join(eagle1_only)}: EAGLE-1's loss terms do not apply to "
              "method.finetune=eagle3 (its loss is the training-time test's: method.ttt_steps, method.ttt_decay); "
              "leave them at their defaults")


@dataclass(kw_only=True)
class TrainSettings(EagleSettings, LoraSettings, DistillSettings, LoopSettings):  # fields: loop first
    """The train settings: the schema of the pipeline's ``method.*`` keys (one declaration, one default), in one
    section per kind of training — the loop every kind shares (:class:`LoopSettings`), distillation
    (:class:`DistillSettings`), LoRA (:class:`LoraSettings`), the EAGLE heads (:class:`EagleSettings`) — each
    validated by its own check; the keys stay flat (``method.lora_r``). This class checks what joins them.

    Errors name the ``method.*`` key; the Python API takes the same names.
    """

    def __post_init__(self):
        self.check_loop()
        self.check_distill()
        if self.finetune == "lora":
            self.check_lora()
        if self.finetune in HEADS:
            self.check_eagle(self.finetune)
        check(not (self.freeze_embeddings and self.finetune == "lora"),
              "method.freeze_embeddings applies to method.finetune=full (LoRA already keeps the embeddings fixed)")
        if self.finetune in HEADS:
            check(self.on_policy_fraction == 0, f"method.finetune={self.finetune} learns from the target's features "
                  "of the datagen rows: on-policy batches do not apply; set method.on_policy_fraction=0")
            check(not self.freeze_embeddings, f"method.freeze_embeddings does not apply to method.finetune="
                  f"{self.finetune} (the head uses the target's embedding, frozen)")
        if self.finetune == "eagle3":
            check(not self.reduced_head, "method.reduced_head does not apply to method.finetune=eagle3: its head has "
                  "its own draft vocabulary (method.draft_vocab)")
        check(self.draft_vocab >= 0, f"method.draft_vocab must be >= 0 (0 = the whole vocabulary), got {self.draft_vocab}")
        check(self.draft_vocab == 0 or self.finetune == "eagle3" or self.reduced_head,
              "method.draft_vocab sizes an EAGLE-3 head's vocabulary (method.finetune=eagle3); a draft model's "
              "reduced head takes eval.draft_vocab (method.reduced_head=true)")

    @property
    def needs_target(self) -> bool:
        """Whether training runs the target: an online teacher, on-policy batches, or an EAGLE head (it reads the
        target's features)."""
        return ((self.loss != "ce" and self.teacher == "online") or self.on_policy_fraction > 0
                or self.finetune in HEADS)


@dataclass(kw_only=True)
class TrainConfig(TrainSettings):
    """A train run: the settings plus what the pipeline wires in (data, draft, target, output, tracking).

    ``accelerate launch -m draftsmith.train.trainer train.json`` reads these fields from a JSON file.
    """

    data_dir: str  # a datagen output directory
    draft: str  # HF directory or hub id of the draft to start from
    out_dir: str
    target: Optional[str] = None  # needed for teacher=online and on-policy batches
    allow_other_target: bool = False  # accept data generated by a different target (same tokenizer)
    draft_from_config: bool = False  # True: only the draft's config is used (random init)
    resume: bool = True  # continue from the last checkpoint in out_dir when there is one
    log_with: Optional[str] = None  # an accelerate tracker name, e.g. "wandb"
    tracker_project: str = "draftsmith"
    tracker_init: dict = field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        check(not self.reduced_head or self.draft_vocab > 0,
              "method.reduced_head trains the head on the draft vocabulary the eval proposes from: set "
              "eval.draft_vocab=N (e.g. 8192), or method.reduced_head=false")
        check(not self.needs_target or bool(self.target),
              "pair.target is required for method.teacher=online, for on-policy batches and for "
              "method.finetune=eagle|eagle3 (or use "
              "method.teacher=cached with a datagen run that stored top-k log-probs, or method.loss=ce)")
