"""An EAGLE-3 draft head: three of the target's layers fused, a decoder layer of its own, its own reduced head.

EAGLE-3 (Li et al. 2025, arXiv 2503.01840) reads the target's residual stream at three depths (low, middle, high;
layer ids k mean "the stream entering layer k", HF's ``hidden_states[k]``: vLLM's default (2, L//2, L-3)),
concatenated and fused by ``fc`` (3H -> H). One Llama decoder layer whose attention reads [norm(embedding of
x_{t+1}) || norm(fused feature)] (2H wide), a final norm, and a head over a *draft vocabulary* of Vd ids
(``d2t``: draft id i is target id i + d2t[i]; ``t2d``: which target ids are in it). A proposal after the first
reads the head's own previous output (its pre-norm hidden state) in place of the fused feature.

The arithmetic is vLLM 0.32's ``Eagle3LlamaForCausalLM`` (vllm/model_executor/models/llama_eagle3.py) with the
norm flags this module writes out (``norm_before_residual`` false, as EAGLE-3's own code; ``norm_before_fc``,
``fc_norm``, ``norm_output`` false), one layer:

    e = rms(emb, input_layernorm); r = f; x = cat(e, rms(f, hidden_norm))       # f: fc(aux) or own output
    r = r + o_proj(attn(x)); out = r + mlp(rms(r, post_attention_layernorm))   # out: the pre-norm output
    logits = lm_head(rms(out, norm))   over the draft vocabulary

The layer is the head's own (its ``transformer_layer_config``: a Llama config without biases or q/k norms,
with the target's hidden size, heads and rotary base), not a copy of the target's, so any decoder-only target
whose features can be read serves: Llama, Mistral, Qwen2 (biases), Qwen3 (q/k norms). The folder is in the
speculators format (:func:`save_eagle3`): ``vllm serve DIR`` serves the verifier it names with the head.

- :class:`Eagle3Head`: the module; ``ttt`` runs the training-time test over whole rows (step j at slot s reads
  the real keys of slots <= s-j and its own chain's keys at s-j+1 .. s: the attention a decode round sees);
- :class:`Eagle3Runner`: the head with a KV cache, one slot per call, for draftsmith's loop (decode/loop.py);
- :func:`save_eagle3` / :func:`load_eagle3` / :func:`is_eagle3_dir`: the speculators-format folder.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from draftsmith.decode.eagle import DecoderLayerMath, EagleRunner

WEIGHTS = "model.safetensors"
SPECULATORS_TYPE = "eagle3"
_L = "layers.0."
_NAMES = {  # attribute -> the checkpoint's name (speculators' and vLLM's)
    "fc": "fc.weight", "in_norm": _L + "input_layernorm.weight", "hidden_norm": _L + "hidden_norm.weight",
    "q": _L + "self_attn.q_proj.weight", "k": _L + "self_attn.k_proj.weight", "v": _L + "self_attn.v_proj.weight",
    "o": _L + "self_attn.o_proj.weight", "post_norm": _L + "post_attention_layernorm.weight",
    "gate": _L + "mlp.gate_proj.weight", "up": _L + "mlp.up_proj.weight", "down": _L + "mlp.down_proj.weight",
    "norm": "norm.weight", "lm_head": "lm_head.weight",
}
NORM_FLAGS = {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False}


def default_layers(n_layers: int) -> list[int]:
    """vLLM's default EAGLE-3 feature layers for a target of `n_layers` layers: (2, L//2, L-3)."""
    return [2, n_layers // 2, n_layers - 3]


def target_text_config(target_config):
    """The decoder's config of a target (a multimodal one's ``text_config``)."""
    return getattr(target_config, "text_config", None) or target_config


def rope_theta(config) -> float:
    """The rotary base of a config (transformers 5's ``rope_parameters``, or an older ``rope_theta``)."""
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def layer_config(target_config, intermediate_size: int | None = None) -> dict:
    """The head's ``transformer_layer_config``: one Llama decoder layer with the target's width, heads and rotary
    base, no biases, no q/k norms (the head's own arithmetic, whatever the target's family)."""
    t = target_text_config(target_config)
    hd = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": int(t.vocab_size),
        "hidden_size": int(t.hidden_size), "intermediate_size": int(intermediate_size or t.intermediate_size),
        "num_hidden_layers": 1, "num_attention_heads": int(t.num_attention_heads),
        "num_key_value_heads": int(t.num_key_value_heads), "head_dim": int(hd), "hidden_act": "silu",
        "rms_norm_eps": float(t.rms_norm_eps), "max_position_embeddings": int(t.max_position_embeddings),
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta(t)}, "rope_theta": rope_theta(t),
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        "bos_token_id": getattr(t, "bos_token_id", None), "eos_token_id": getattr(t, "eos_token_id", None),
    }


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, as vLLM's and LlamaRMSNorm."""
    dtype = x.dtype
    x = x.float()
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


class Eagle3Head(DecoderLayerMath, torch.nn.Module):
    """The EAGLE-3 head (module docstring). `cfg`: its ``transformer_layer_config`` (:func:`layer_config`);
    `layers`: the target's feature layer ids; `vocab`: the draft vocabulary's target ids, sorted (None: the whole
    target vocabulary); `target_hidden`: the width of each feature layer."""

    def __init__(self, cfg: dict, layers: list[int], vocab: torch.Tensor | None = None,
                 target_hidden: int | None = None, dtype=torch.float32, device=None):
        super().__init__()
        self.cfg, self.layers = dict(cfg), sorted(int(i) for i in layers)
        h, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.h, self.nh, self.nkv, self.hd, self.eps = h, nh, nkv, hd, cfg["rms_norm_eps"]
        self.target_hidden = int(target_hidden or h)
        self.target_vocab = int(cfg["vocab_size"])
        ids = torch.arange(self.target_vocab) if vocab is None else torch.as_tensor(vocab, dtype=torch.long).cpu()
        if ids.numel() == 0 or bool((ids[1:] <= ids[:-1]).any()) or int(ids.min()) < 0 \
                or int(ids.max()) >= self.target_vocab:
            raise ValueError(f"an EAGLE-3 draft vocabulary must be sorted distinct ids in [0, {self.target_vocab})")
        self.register_buffer("vocab", ids.to(device), persistent=False)  # draft id -> target id
        inter = cfg["intermediate_size"]
        like = dict(dtype=dtype, device=device)

        def param(*shape, std: float | None = None, ones: bool = False):
            t = torch.ones(*shape, **like) if ones else torch.randn(*shape, **like) * (std or 0.02)
            return torch.nn.Parameter(t)

        self.fc = param(h, len(self.layers) * self.target_hidden)
        self.in_norm, self.hidden_norm = param(h, ones=True), param(h, ones=True)
        self.q, self.k, self.v = param(nh * hd, 2 * h), param(nkv * hd, 2 * h), param(nkv * hd, 2 * h)
        self.o = param(h, nh * hd)
        self.post_norm = param(h, ones=True)
        self.gate, self.up, self.down = param(inter, h), param(inter, h), param(h, inter)
        self.norm = param(h, ones=True)
        self.lm_head = param(ids.numel(), h)
        theta = float(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"])
        self.__dict__["inv_freq"] = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))

    @property
    def draft_vocab_size(self) -> int:
        return int(self.vocab.numel())

    # -- vocabulary maps ---------------------------------------------------------------------------------
    def d2t(self) -> torch.Tensor:
        """int64 [Vd]: target id = draft id + d2t[draft id] (vLLM's and speculators' offsets)."""
        return (self.vocab.cpu() - torch.arange(self.draft_vocab_size)).to(torch.long)

    def t2d(self) -> torch.Tensor:
        """bool [V]: which target ids the draft vocabulary holds."""
        mask = torch.zeros(self.target_vocab, dtype=torch.bool)
        mask[self.vocab.cpu()] = True
        return mask

    # -- the arithmetic --------------------------------------------------------------------------------
    def fuse(self, aux: torch.Tensor, linear=F.linear) -> torch.Tensor:
        """The target's features at the head's layers, concatenated [..., 3 x target_hidden] -> [..., H]."""
        return linear(aux, self.fc)

    def _inputs(self, emb: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention input [.., 2H], residual [.., H]) of the layer for token embeddings and features."""
        return torch.cat([_rms(emb, self.in_norm, self.eps), _rms(hidden, self.hidden_norm, self.eps)], -1), hidden

    def cos_sin(self, pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [B, 1, T, hd] of the positions `pos` [B, T]."""
        freqs = pos.to(torch.float32)[..., None] * self.inv_freq.to(pos.device)  # [B, T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]  # [B, 1, T, hd]

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return _rms(x, weight, self.eps)

    def logits(self, out: torch.Tensor, linear=F.linear) -> torch.Tensor:
        """Pre-norm outputs [.., H] -> logits over the draft vocabulary [.., Vd]."""
        return linear(_rms(out, self.norm, self.eps), self.lm_head)

    def forward(self, aux: torch.Tensor, emb: torch.Tensor, pos: torch.Tensor, steps: int,
                window: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The training forward: the target's features at the head's layers `aux` [B, T, 3 x target_hidden] fused,
        then :meth:`ttt` over whole rows, or :meth:`ttt_window` over the slots `window` [B, W] (a module call, so
        that data-parallel wrappers see it)."""
        fused = self.fuse(aux)
        if window is None:
            return self.ttt(emb, fused, pos, steps)
        return self.ttt_window(emb, fused, pos, steps, window)

    def ttt(self, emb: torch.Tensor, fused: torch.Tensor, pos: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """The training-time test over whole rows: `emb` [B, T, H] (embeddings of x_{t+1}), `fused` [B, T, H]
        (fc of the target's features at t), `pos` [B, T] -> the pre-norm outputs of steps 0 .. steps-1, each
        [B, T, H]. Step 0 is the head over real features (causal). Step j at slot s reads (x_{s+1}, step j-1's
        output at slot s-1) and attends the real keys of slots <= s-j and the keys of its own chain — step i's at
        slot s-j+i, i = 1..j — exactly the slots a decode round's (j+1)-th proposal sees in its cache. Slots s < j
        have no chain (their outputs are not meaningful: a loss masks them)."""
        t = emb.shape[1]
        keys, values, outs = [], [], []
        hidden = fused
        idx = torch.arange(t, device=emb.device)
        for j in range(steps):
            x, residual = self._inputs(emb, hidden)
            q, k, v = self._qkv(x, pos)
            keys.append(k)
            values.append(v)
            if j == 0:
                attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                real = idx[None, :] <= idx[:, None] - j  # [T, T]: key u visible from slot s when u <= s - j
                attn = _chain_attention(q, keys[0], values[0], real, keys, values, j)
            out = self._finish(residual, attn)
            outs.append(out)
            hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)  # slot s reads step j at s-1
        return outs

    def ttt_window(self, emb: torch.Tensor, fused: torch.Tensor, pos: torch.Tensor, steps: int,
                   window: torch.Tensor) -> list[torch.Tensor]:
        """:meth:`ttt`'s outputs at the slots `window` [B, W] only (row b: W consecutive slots, ascending; slots
        after a row's own end may repeat its last one: a loss masks them) -> each step's [B, W, H].

        The same arithmetic as :meth:`ttt` where it is read: step 0's keys and values come from every slot of the
        row (real features: every later step attends them), but its queries, attention output and MLP run at the
        window's slots, and steps 1.. run there only. A loss on a completion's slots (a window from the slot before
        its first token) reads nothing outside it, so the prompt's slots cost a projection, not a layer per step."""
        t = emb.shape[1]

        def gather(x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, W, D] at the window's slots
            return x.gather(1, window[..., None].expand(-1, -1, x.shape[-1]))

        emb_w, pos_w = gather(emb), pos.gather(1, window)
        q_all, k0, v0 = self._qkv(self._inputs(emb, fused)[0], pos)  # [B, nh, T, hd]
        q0 = q_all.gather(2, window[:, None, :, None].expand(-1, self.nh, -1, self.hd))  # the window's queries
        idx = torch.arange(t, device=emb.device)
        seen = idx[None, None, :] <= window[:, :, None]  # [B, W, T]: key u visible from window slot s when u <= s
        outs = [self._finish(gather(fused), F.scaled_dot_product_attention(q0, k0, v0, attn_mask=seen[:, None]))]
        keys, values = [None], [None]  # steps 1..: keys and values at the window's slots
        for j in range(1, steps):
            hidden = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], dim=1)
            xj, residual = self._inputs(emb_w, hidden)
            q, k, v = self._qkv(xj, pos_w)
            keys.append(k)
            values.append(v)
            real = idx[None, None, :] <= window[:, :, None] - j  # [B, W, T]: real keys of slots <= s - j
            outs.append(self._finish(residual, _chain_attention(q, k0, v0, real[:, None], keys, values, j)))
        return outs

    # -- the checkpoint --------------------------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """The head's tensors under the checkpoint's names, with ``d2t`` and ``t2d`` where the draft vocabulary is
        not the whole target vocabulary (vLLM loads the maps only then)."""
        out = {name: getattr(self, attr).detach().contiguous() for attr, name in _NAMES.items()}
        if self.draft_vocab_size != self.target_vocab:
            out["d2t"], out["t2d"] = self.d2t(), self.t2d()
        return out

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        missing = [n for n in _NAMES.values() if n not in weights]
        if missing:
            raise ValueError(f"an EAGLE-3 checkpoint lacks {missing}")
        with torch.no_grad():
            for attr, name in _NAMES.items():
                own = getattr(self, attr)
                if tuple(weights[name].shape) != tuple(own.shape):
                    raise ValueError(f"{name}: shape {tuple(weights[name].shape)}, the config says {tuple(own.shape)}")
                own.copy_(weights[name])


def _chain_attention(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, real: torch.Tensor, keys: list,
                     values: list, j: int) -> torch.Tensor:
    """Unrolled step j's attention (j >= 1): queries `q` [B, nh, S, hd] over step 0's keys and values `k0` / `v0`
    [B, nh, T, hd] where `real` (broadcast to [B, nh, S, T]) lets them, and over the chain's own keys — step i's at
    slot s - (j - i), i = 1..j, from ``keys[i]`` / ``values[i]`` [B, nh, S, hd] — one softmax over both."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    t = k0.shape[2]
    s0 = (q @ k0.transpose(-1, -2) * scale).masked_fill(~real, float("-inf"))
    diag, vals = [], []
    for i in range(1, j + 1):
        shift = j - i
        ki, vi = _shift(keys[i], shift), _shift(values[i], shift)
        diag.append((q * ki).sum(-1, keepdim=True) * scale)
        vals.append(vi)
    p = torch.softmax(torch.cat([s0, *diag], dim=-1).float(), dim=-1).to(q.dtype)
    return p[..., :t] @ v0 + sum(p[..., t + n: t + n + 1] * vals[n] for n in range(j))


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [B, nh, T, hd] moved n slots later along T (zeros in front): slot s holds x's slot s - n."""
    if n == 0:
        return x
    return torch.cat([torch.zeros_like(x[:, :, :n]), x[:, :, :-n]], dim=2)


def head_for_target(target: torch.nn.Module, layers: list[int] | None = None,
                    vocab: torch.Tensor | None = None) -> Eagle3Head:
    """A new head for `target` (in its dtype, on its device) over the draft vocabulary `vocab` (None: the whole).

    The start: the layer's q/k/v read the feature half of their input as the target's last decoder layer does
    (its q/k/v weights; the embedding half starts at 0), its two residual writes (o, down) at a tenth of that
    layer's; ``fc`` passes the highest feature layer through; the final norm and the head are the target's
    (its final norm weight, its head's rows of the draft vocabulary). The head so starts near an early exit of
    the target at its highest feature layer, and learns the step from there."""
    tcfg = target_text_config(target.config)
    n_layers = int(tcfg.num_hidden_layers)
    layers = default_layers(n_layers) if layers is None else [int(i) for i in layers]
    bad = [i for i in layers if not 0 <= i < n_layers]
    if len(set(layers)) != 3 or len(layers) != 3 or bad:
        raise ValueError(f"EAGLE-3 reads 3 of the target's layers, distinct ids in [0, {n_layers}); got {layers} "
                         f"(vLLM's default (2, L//2, L-3) needs a target of at least 7 layers)")
    layers = sorted(layers)  # vLLM hands the head its layers' states in layer order
    emb_w = target.get_input_embeddings().weight
    head_w = target.get_output_embeddings().weight
    cfg = layer_config(tcfg)
    cfg["vocab_size"] = int(head_w.shape[0])
    head = Eagle3Head(cfg, layers, vocab, target_hidden=int(tcfg.hidden_size), dtype=emb_w.dtype, device=emb_w.device)
    src = _decoder_layers(target)[-1]
    a, m = src.self_attn, src.mlp
    h = head.h
    with torch.no_grad():
        head.fc.zero_()
        head.fc[:, (len(layers) - 1) * head.target_hidden:].copy_(torch.eye(h, dtype=emb_w.dtype))
        for own, lin in ((head.q, a.q_proj), (head.k, a.k_proj), (head.v, a.v_proj)):
            own.zero_()
            own[:, h:].copy_(lin.weight)
        head.o.copy_(a.o_proj.weight * 0.1)
        head.gate.copy_(m.gate_proj.weight)
        head.up.copy_(m.up_proj.weight)
        head.down.copy_(m.down_proj.weight * 0.1)
        head.post_norm.copy_(src.post_attention_layernorm.weight)
        head.hidden_norm.copy_(src.input_layernorm.weight)
        head.norm.copy_(final_norm(target).weight)
        head.lm_head.copy_(head_w[head.vocab])
    return head


def _decoder_layers(model):
    inner = getattr(model, "model", model)
    inner = getattr(inner, "language_model", inner)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no decoder layers (model.layers): not a decoder-only target")
    return layers


def final_norm(model):
    """The target's final norm: what its last layer's stream goes through before its head."""
    inner = getattr(model, "model", model)
    return getattr(getattr(inner, "language_model", inner), "norm")


@torch.no_grad()
def target_aux_features(target: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One teacher-forced forward of any HF decoder -> (the residual stream entering each of `layers`,
    concatenated in layer order [B, T, 3H]; the final post-norm hidden state [B, T, H], what the target's head
    reads). Read by pre-hooks on those layers, removed after the forward (transformers' own
    ``output_hidden_states`` leaves capture hooks on every layer, which would keep the target off the lean
    forward)."""
    decoder_layers = _decoder_layers(target)
    seen: dict[int, torch.Tensor] = {}
    handles = []
    for k in sorted(set(layers)):
        def grab(module, args, kwargs, k=k):
            seen[k] = args[0] if args else kwargs["hidden_states"]
        handles.append(decoder_layers[k].register_forward_pre_hook(grab, with_kwargs=True))
    try:
        out = target.model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        for handle in handles:
            handle.remove()
    return torch.cat([seen[k] for k in sorted(layers)], dim=-1), out.last_hidden_state


# -- the head in a decode loop ----------------------------------------------------------------------
class Eagle3Runner(EagleRunner):
    """An :class:`Eagle3Head` with its own KV cache for one decode (decode/loop.py ``eagle3_generate``): decode/eagle.py
    ``EagleRunner``'s slots, cache and crop, with EAGLE-3's layer inputs and head.

    Slot t holds (x_{t+1}, f_t): ``forward(tokens [T], hidden [T, H])`` appends T slots (hidden: fused target
    features, or the head's own previous output) and returns their pre-norm outputs [T, H]; ``logits(out)`` gives
    the draft vocabulary's logits placed at their target ids over the full `width` (-inf elsewhere)."""

    def __init__(self, head: Eagle3Head, embed: torch.Tensor, width: int, capacity: int, products=None):
        self.head, self.embed, self.width = head, embed, width
        self.ids = head.vocab.to(embed.device)
        self._setup(capacity, products)

    def _layer_inputs(self, tokens: torch.Tensor, hidden: torch.Tensor, linear) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head._inputs(F.embedding(tokens, self.embed)[None], hidden[None])  # [1, T, 2H], [1, T, H]

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's features at the head's layers [T, 3 x target_hidden] -> fused [T, H] (``fc``)."""
        return self.head.fuse(aux[None], self.products(aux.shape[0]))[0]

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Pre-norm outputs [T, H] -> logits [T, width] at the draft vocabulary's target ids, -inf elsewhere."""
        from draftsmith.decode.vocab import scatter_logits

        return scatter_logits(self.head.logits(out[None], self.products(out.shape[0]))[0], self.ids, self.width)


# -- the speculators-format folder -------------------------------------------------------------------
def speculators_config(head: Eagle3Head, *, verifier: str, verifier_architectures: list[str], k: int) -> dict:
    """config.json of a head folder in the speculators format (speculators/models/eagle3/config.py; read by vLLM's
    ``SpeculatorsConfig``): every norm flag written out (vLLM and speculators default ``norm_before_residual``
    differently), the proposal method with `k` tokens, the verifier by path or hub id and its architectures."""
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": SPECULATORS_TYPE,
        "speculators_version": "0.9.0", "transformer_layer_config": head.cfg,
        "draft_vocab_size": head.draft_vocab_size, "target_hidden_size": head.target_hidden,
        "eagle_aux_hidden_state_layer_ids": list(head.layers), **NORM_FLAGS, "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": SPECULATORS_TYPE,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(k),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
        "torch_dtype": "float32",
    }


def save_eagle3(out_dir: str | Path, head: Eagle3Head, *, verifier: str, verifier_architectures: list[str],
                k: int, **info) -> Path:
    """Write `head` at `out_dir` in the speculators format (config.json, model.safetensors with vLLM's names and
    the vocabulary maps) plus ``draftsmith_eagle.json`` (`info`: how it was trained); -> out_dir."""
    from safetensors.torch import save_file

    from draftsmith.artifacts import write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (WEIGHTS + ".tmp")
    save_file(head.weights(), str(tmp))
    tmp.replace(out / WEIGHTS)
    write_json(out / "config.json", speculators_config(head, verifier=verifier,
                                                       verifier_architectures=verifier_architectures, k=k))
    write_json(out / "draftsmith_eagle.json", {"kind": "eagle3", **info})
    return out


def is_eagle3_dir(path: str | Path) -> bool:
    """Whether `path` holds a speculators-format EAGLE-3 folder (config.json's ``speculators_model_type``)."""
    import json

    try:
        return json.loads((Path(str(path)) / "config.json").read_text()).get("speculators_model_type") \
            == SPECULATORS_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def read_eagle3_config(path: str | Path) -> dict:
    """The folder's config.json, checked for what this module reads (a clear error naming the file)."""
    import json

    file = Path(path) / "config.json"
    try:
        cfg = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{file}: not readable as an EAGLE-3 head's config ({exc})") from exc
    missing = [key for key in ("transformer_layer_config", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids")
               if key not in cfg]
    if cfg.get("speculators_model_type") != SPECULATORS_TYPE or missing:
        raise ValueError(f"{file}: not a speculators-format EAGLE-3 config (speculators_model_type "
                         f"{cfg.get('speculators_model_type')!r}, missing {missing})")
    flags = {k: cfg.get(k, False) for k in NORM_FLAGS}
    if flags != NORM_FLAGS:
        raise ValueError(f"{file}: norm flags {flags}; draftsmith runs heads with {NORM_FLAGS}")
    return cfg


def load_eagle3(path: str | Path, target: torch.nn.Module | None = None) -> Eagle3Head:
    """The head saved at `path` (in `target`'s dtype and on its device when given; checked against it: hidden size,
    vocabulary, layer count)."""
    from safetensors.torch import load_file

    path = Path(path)
    cfg = read_eagle3_config(path)
    weights = load_file(str(path / WEIGHTS))
    if "d2t" in weights:
        vocab = torch.arange(weights["d2t"].numel()) + weights["d2t"].long()
    else:
        vocab = None
    like = {}
    if target is not None:
        tcfg = target_text_config(target.config)
        width = int(target.get_output_embeddings().weight.shape[0])
        if int(cfg.get("target_hidden_size") or tcfg.hidden_size) != int(tcfg.hidden_size) \
                or int(cfg["transformer_layer_config"]["vocab_size"]) != width \
                or max(cfg["eagle_aux_hidden_state_layer_ids"]) >= int(tcfg.num_hidden_layers):
            raise ValueError(f"{path}: an EAGLE-3 head for a target of hidden size {cfg.get('target_hidden_size')}, "
                             f"vocabulary {cfg['transformer_layer_config']['vocab_size']} and layers "
                             f"{cfg['eagle_aux_hidden_state_layer_ids']}; this target has {tcfg.hidden_size}, "
                             f"{width} and {tcfg.num_hidden_layers} layers")
        w = target.get_input_embeddings().weight
        like = dict(dtype=w.dtype, device=w.device)
    head = Eagle3Head(cfg["transformer_layer_config"], cfg["eagle_aux_hidden_state_layer_ids"], vocab,
                      target_hidden=cfg.get("target_hidden_size"), **like)
    head.load_weights({k: v.to(**like) if like else v for k, v in weights.items()})
    return head.eval()
