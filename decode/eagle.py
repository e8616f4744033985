"""An EAGLE-1 draft head and the speculative loop that drives it: a draft that reads the target's own features.

EAGLE (Li et al. 2024) predicts token t+2 from the token t+1 and the target's feature at t: ``fc(cat(embed(x_{t+1}),
h_t))`` -> one Llama decoder layer whose input norm is the identity -> ``hidden + residual`` -> the target's lm_head,
with no final norm. h_t is the target's last hidden state *after* its final norm (what a Llama forward hands its
head, and what vLLM hands its EAGLE proposer). The embedding and the head are the target's (vLLM shares them when
the checkpoint has none), so the draft's own weights are one layer and ``fc``: a few percent of the target.

The head's arithmetic and its on-disk form are exactly vLLM 0.32's ``EagleLlamaForCausalLM``
(vllm/model_executor/models/llama_eagle.py), so that a head trained here (train/eagle.py) is served by
``--speculative-config '{"method": "eagle", "model": DIR, ...}'`` (serve/server.py reads the method from the
checkpoint's config):

- :class:`EagleHead`: the layer (``forward``: every position reads a real feature, as in training and in a decode
  round's first proposal; ``second``: each position reads the head's own previous output instead, the keys and
  values of earlier positions staying those of real features, as in a round's second proposal);
- :func:`save_eagle` / :func:`load_eagle` / :func:`is_eagle_dir`: the checkpoint directory (``config.json`` +
  ``model.safetensors``, vLLM's weight names).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

EAGLE_ARCH = "EagleLlamaForCausalLM"
WEIGHTS = "model.safetensors"
_LAYER = "layers.0."
_NAMES = {  # attribute -> vLLM's checkpoint name
    "fc": "fc.weight", "q": _LAYER + "self_attn.q_proj.weight", "k": _LAYER + "self_attn.k_proj.weight",
    "v": _LAYER + "self_attn.v_proj.weight", "o": _LAYER + "self_attn.o_proj.weight",
    "post_norm": _LAYER + "post_attention_layernorm.weight", "gate": _LAYER + "mlp.gate_proj.weight",
    "up": _LAYER + "mlp.up_proj.weight", "down": _LAYER + "mlp.down_proj.weight",
}


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class DecoderLayerMath:
    """The decoder layer both EAGLE heads run (a Llama layer without biases): attention's q/k/v with rotary
    embeddings, then o, the post-attention norm and the MLP. A head supplies the weights (``q k v o post_norm gate
    up down``), its shape (``nh nkv hd eps``), ``cos_sin(pos, dtype)`` and ``_norm(x, weight)`` (its RMSNorm)."""

    def _qkv(self, x: torch.Tensor, pos: torch.Tensor, linear=F.linear, rotary=None, repeat: bool = True):
        """q [B, nh, T, hd], k and v [B, nh, T, hd] (KV heads repeated; `repeat` False: the nkv KV heads
        [B, nkv, T, hd], for an attention that reads them grouped), rotary applied. `linear`: the product
        (F.linear, or one of decode/lean.py's forms in a decode); `rotary`: ``cos_sin`` of `pos`, when the caller
        keeps a table."""
        b, t, _ = x.shape
        cos, sin = self.cos_sin(pos, x.dtype) if rotary is None else rotary
        q = linear(x, self.q).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = linear(x, self.k).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = linear(x, self.v).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if not repeat:
            return q, k, v
        rep = self.nh // self.nkv
        return q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

    def _finish(self, residual: torch.Tensor, attn: torch.Tensor, linear=F.linear) -> torch.Tensor:
        """The layer after attention: attn [B, nh, T, hd] -> the layer's output [B, T, H]."""
        b, _, t, _ = attn.shape
        r = residual + linear(attn.transpose(1, 2).reshape(b, t, self.nh * self.hd), self.o)
        y = self._norm(r, self.post_norm)
        return r + linear(F.silu(linear(y, self.gate)) * linear(y, self.up), self.down)


class EagleHead(DecoderLayerMath, torch.nn.Module):
    """fc + one Llama decoder layer over (embedding, target feature) -> hidden [B, T, H] for the target's head.

    Built from a Llama-family target (its config and rotary embedding; a decoder layer of it to start from,
    `init_layer`). The start: ``fc = [0 | I]`` and the layer's two residual writes (o_proj, down_proj) at a tenth
    of the source layer's, so that the head starts near h_t itself (its logits on the target's scale: there is
    no final norm) and learns the step from there.
    """

    def __init__(self, target: torch.nn.Module, init_layer: int = -1):
        super().__init__()
        cfg = target.config
        self.config = cfg
        self.h, self.nh, self.nkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        self.hd = getattr(cfg, "head_dim", None) or self.h // self.nh
        self.eps = cfg.rms_norm_eps
        if getattr(cfg, "model_type", None) != "llama":  # Qwen3's q/k norms, Mistral's windows: other arithmetic
            raise ValueError(f"an EAGLE head here is vLLM's EagleLlamaForCausalLM, for Llama targets; this target is "
                             f"{getattr(cfg, 'model_type', None)!r}: not supported")
        src = target.model.layers[init_layer % cfg.num_hidden_layers]
        a, m = src.self_attn, src.mlp
        linears = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
        if any(getattr(lin, "bias", None) is not None for lin in linears):
            raise ValueError("an EAGLE head here has no biases (vLLM's EagleLlamaForCausalLM would expect them from "
                             "a target with attention_bias / mlp_bias): this target is not supported")
        # the target's rotary embedding, used but not owned (not a submodule: head.to(...) must not convert it)
        self.__dict__["rotary"] = target.model.rotary_emb
        like = dict(dtype=a.q_proj.weight.dtype, device=a.q_proj.weight.device)

        def copy(module, scale: float = 1.0):
            return torch.nn.Parameter(module.weight.detach().clone() * scale)

        self.fc = torch.nn.Parameter(torch.cat([torch.zeros(self.h, self.h, **like), torch.eye(self.h, **like)], dim=1))
        self.q, self.k, self.v, self.o = copy(a.q_proj), copy(a.k_proj), copy(a.v_proj), copy(a.o_proj, 0.1)
        self.post_norm = copy(src.post_attention_layernorm)
        self.gate, self.up, self.down = copy(m.gate_proj), copy(m.up_proj), copy(m.down_proj, 0.1)

    # -- the arithmetic ------------------------------------------------------------------------------
    def cos_sin(self, pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [B, 1, T, hd] of the positions `pos` [B, T]: the target's rotary embedding."""
        cos, sin = self.rotary(self.q.new_empty(0, dtype=dtype), pos)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return _rms(x, weight, self.eps)

    def forward(self, emb: torch.Tensor, h: torch.Tensor, pos: torch.Tensor):
        """`emb` [B, T, H] (embeddings of x_{t+1}), `h` [B, T, H] (the target's features h_t), `pos` [B, T]
        -> (hidden [B, T, H], (k, v) of every position, for :meth:`second`). Causal over the T positions."""
        x = F.linear(torch.cat([emb, h], dim=-1), self.fc)
        q, k, v = self._qkv(x, pos)
        return self._finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True)), (k, v)

    def second(self, emb: torch.Tensor, h_own: torch.Tensor, pos: torch.Tensor, kv) -> torch.Tensor:
        """Each position i reads `h_own[i]` (the head's own output at i-1) in place of a target feature; the keys
        and values of positions < i are :meth:`forward`'s `kv` (real features), its own are its own ->
        hidden [B, T, H]: what a decode round's second proposal computes at every position at once."""
        x = F.linear(torch.cat([emb, h_own], dim=-1), self.fc)
        q, k2, v2 = self._qkv(x, pos)
        k1, v1 = kv
        t = q.shape[2]
        scale = 1.0 / math.sqrt(self.hd)
        before = torch.ones(t, t, dtype=torch.bool, device=q.device).tril(-1)
        s = (q @ k1.transpose(-1, -2) * scale).masked_fill(~before, float("-inf"))
        own = (q * k2).sum(-1, keepdim=True) * scale
        p = torch.softmax(torch.cat([s, own], dim=-1), dim=-1)
        return self._finish(x, p[..., :t] @ v1 + p[..., t:] * v2)

    # -- the checkpoint ------------------------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """The head's weights under vLLM's checkpoint names (no embed_tokens / lm_head: the target's are shared)."""
        return {name: getattr(self, attr).detach().contiguous() for attr, name in _NAMES.items()}

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        missing = [n for n in _NAMES.values() if n not in weights]
        if missing:
            raise ValueError(f"an EAGLE checkpoint lacks {missing}")
        with torch.no_grad():
            for attr, name in _NAMES.items():
                getattr(self, attr).copy_(weights[name])


def eagle_config(target_config) -> dict:
    """config.json of an EAGLE head for `target_config`: the target's Llama config with one layer, the head's
    architecture, and the target's vocabulary (its embedding and head are shared, not stored)."""
    cfg = target_config.to_dict()
    cfg.update(architectures=[EAGLE_ARCH], num_hidden_layers=1, tie_word_embeddings=False)
    for key in ("layer_types", "_name_or_path", "quantization_config"):
        cfg.pop(key, None)
    return cfg


def save_eagle(out_dir: str | Path, head: EagleHead, **info) -> Path:
    """Write `head` at `out_dir` (config.json + model.safetensors, vLLM's layout) and ``draftsmith_eagle.json``
    (`info`: how it was trained), each atomically; -> out_dir."""
    from safetensors.torch import save_file

    from draftsmith.artifacts import write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (WEIGHTS + ".tmp")
    save_file(head.weights(), str(tmp))
    tmp.replace(out / WEIGHTS)
    write_json(out / "config.json", eagle_config(head.config))
    write_json(out / "draftsmith_eagle.json", {"kind": "eagle", **info})
    return out


def is_eagle_dir(path: str | Path) -> bool:
    """Whether `path` holds a checkpoint this module loads: its config.json names :data:`EAGLE_ARCH`."""
    from draftsmith.artifacts.formats import model_architectures

    return EAGLE_ARCH in model_architectures(path)


def load_eagle(path: str | Path, target: torch.nn.Module) -> EagleHead:
    """The head saved at `path` by :func:`save_eagle`, for `target` (in its dtype, on its device)."""
    from safetensors.torch import load_file

    path = Path(path)
    if not is_eagle_dir(path):
        raise ValueError(f"{path} is not an EAGLE head's checkpoint (no config.json naming {EAGLE_ARCH}); "
                         "write one with draftsmith.decode.eagle.save_eagle")
    head = EagleHead(target)
    head.load_weights(load_file(str(path / WEIGHTS)))
    return head.eval()


# -- the head in a decode loop ----------------------------------------------------------------------
class EagleRunner:
    """An :class:`EagleHead` with its own KV cache for one decode: the draft side of :func:`eagle_generate`.

    Slot t of the cache holds the pair (x_{t+1}, h_t). ``forward(tokens [T], feats [T, H])`` appends T slots and
    returns the head's hidden states at them [T, H]; ``logits(hidden [T, H])`` scores them with the target's head
    (only the rows of `vocab` when given: logits over the full `width`, -inf elsewhere, as decode/vocab.py's
    reduced heads do); ``crop(length)`` rolls the cache back. The same arithmetic as ``EagleHead.forward`` over the
    whole sequence (tests/test_eagle.py), up to float rounding.

    `products(T)` gives the matrix product for a block of T slots (default F.linear): in a decode, the target's
    lean forward's measured form (decode/lean.py ``LeanModel.block_product``), the head's matrices being streamed
    from memory as the target's are. The cache keeps the nkv KV heads (not repeated to nh: SDPA's ``enable_gqa``
    reads them), and the rotary table is computed once per capacity.
    """

    def __init__(self, head: EagleHead, embed: torch.Tensor, lm_head: torch.Tensor, capacity: int,
                 vocab: torch.Tensor | None = None, products=None):
        self.head, self.embed, self.width = head, embed, lm_head.shape[0]
        self.vocab = vocab
        self.rows = lm_head if vocab is None else lm_head[vocab]
        self._setup(capacity, products)

    def _setup(self, capacity: int, products) -> None:
        self.products = products or (lambda t: F.linear)
        self.k = self.v = None
        self.length = 0
        self.forwards = 0
        self._allocate(max(int(capacity), 16))

    def _allocate(self, capacity: int) -> None:
        """(Re)allocate the cache and the rotary table for `capacity` slots, keeping the slots held."""
        head, like = self.head, dict(dtype=self.embed.dtype, device=self.embed.device)
        k, v = (torch.zeros((1, head.nkv, capacity, head.hd), **like) for _ in range(2))
        if self.k is not None:
            k[:, :, : self.length], v[:, :, : self.length] = self.k[:, :, : self.length], self.v[:, :, : self.length]
        self.k, self.v = k, v
        self.cos, self.sin = head.cos_sin(torch.arange(capacity, device=self.embed.device)[None], self.embed.dtype)

    def __len__(self) -> int:
        return self.length

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def forward(self, tokens: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        head = self.head
        t, start = tokens.shape[0], self.length
        end = start + t
        if end > self.k.shape[2]:
            self._allocate(max(end, 2 * self.k.shape[2]))
        linear = self.products(t)
        x, residual = self._layer_inputs(tokens, feats, linear)  # [1, T, H_in], [1, T, H]
        rotary = self.cos[:, :, start:end], self.sin[:, :, start:end]
        q, k, v = head._qkv(x, None, linear=linear, rotary=rotary, repeat=False)
        self.k[:, :, start:end], self.v[:, :, start:end] = k, v
        mask = None
        if t > 1:
            keys = torch.arange(end, device=x.device)
            mask = keys[None, :] <= keys[start:, None]  # query i sees keys 0 .. start + i
        attn = F.scaled_dot_product_attention(q, self.k[:, :, :end], self.v[:, :, :end], attn_mask=mask,
                                              enable_gqa=head.nkv != head.nh)
        self.length = end
        self.forwards += 1
        return head._finish(residual, attn, linear=linear)[0]

    def _layer_inputs(self, tokens: torch.Tensor, feats: torch.Tensor, linear) -> tuple[torch.Tensor, torch.Tensor]:
        """(the layer's input [1, T, H], its residual stream [1, T, H]) of `tokens` [T] and `feats` [T, H]: EAGLE-1's
        fc over [embedding || feature], which is both."""
        x = linear(torch.cat([F.embedding(tokens, self.embed), feats], dim=-1)[None], self.head.fc)
        return x, x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's head over `hidden` [T, H] -> logits [T, width] (-inf outside `vocab` when given)."""
        from draftsmith.decode.vocab import scatter_logits

        sub = self.products(hidden.shape[0])(hidden[None], self.rows)[0]
        return sub if self.vocab is None else scatter_logits(sub, self.vocab, self.width)
