"""An EAGLE-1 draft head: one decoder layer that reads the target's own last hidden states.

EAGLE (Li et al. 2024) predicts token t+2 from the token t+1 and the target's feature at t: ``fc(cat(embed(x_{t+1}),
h_t))`` -> one Llama decoder layer whose input norm is the identity -> ``hidden + residual`` -> the target's lm_head,
with no final norm. h_t is the target's last hidden state *after* its final norm (what a Llama forward hands its
head, and what vLLM hands its EAGLE proposer). The embedding and the head are the target's (vLLM shares them
when the checkpoint has none), so the draft's own weights are one layer and ``fc``: a few percent of the target.

This module is the head's arithmetic and its on-disk form, exactly as vLLM 0.32's ``EagleLlamaForCausalLM``
(vllm/model_executor/models/llama_eagle.py) computes and loads it, so that a head trained here is served by
``--speculative-config '{"method": "eagle", "model": DIR, ...}'`` (serve/server.py picks the method from the
checkpoint's config):

- :class:`EagleHead`: the layer (``forward``: every position reads a real feature, as in training and in a
  decode round's first proposal; ``second``: each position reads the head's own previous output instead, the
  keys and values of earlier positions staying those of real features, as in a round's second proposal);
- :func:`target_features`: the target's post-norm hidden states and argmax over given token rows (teacher
  forcing: one forward per batch);
- :func:`shifted`: a batch of feature rows laid out for the head (input token x_{t+1}, feature h_t, the
  teacher's feature h_{t+1} and argmax at t+1);
- :func:`save_eagle` / :func:`load_eagle`: the checkpoint directory (``config.json`` + ``model.safetensors``,
  vLLM's weight names).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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


class EagleHead(torch.nn.Module):
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
        self.rotary = target.model.rotary_emb
        src = target.model.layers[init_layer % cfg.num_hidden_layers]
        a, m = src.self_attn, src.mlp

        def copy(module, scale: float = 1.0):
            return torch.nn.Parameter(module.weight.detach().clone() * scale)

        self.fc = torch.nn.Parameter(torch.cat([torch.zeros(self.h, self.h), torch.eye(self.h)], dim=1))
        self.q, self.k, self.v, self.o = copy(a.q_proj), copy(a.k_proj), copy(a.v_proj), copy(a.o_proj, 0.1)
        self.post_norm = copy(src.post_attention_layernorm)
        self.gate, self.up, self.down = copy(m.gate_proj), copy(m.up_proj), copy(m.down_proj, 0.1)

    # -- the arithmetic ------------------------------------------------------------------------------
    def _qkv(self, x: torch.Tensor, pos: torch.Tensor):
        b, t, _ = x.shape
        cos, sin = self.rotary(x, pos)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = F.linear(x, self.q).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = F.linear(x, self.k).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = F.linear(x, self.v).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        rep = self.nh // self.nkv
        return q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

    def _finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = attn.shape
        x = x + F.linear(attn.transpose(1, 2).reshape(b, t, self.nh * self.hd), self.o)
        y = _rms(x, self.post_norm, self.eps)
        return x + F.linear(F.silu(F.linear(y, self.gate)) * F.linear(y, self.up), self.down)

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
    """Whether `path` holds an EAGLE-1 head's checkpoint (its config.json names an ``Eagle...`` architecture;
    serve/server.py's :func:`~draftsmith.serve.server.speculative_method` decides it, for serving too)."""
    from draftsmith.serve.server import speculative_method

    return speculative_method(path) == "eagle"


def load_eagle(path: str | Path, target: torch.nn.Module) -> EagleHead:
    """The head saved at `path` by :func:`save_eagle`, for `target`."""
    from safetensors.torch import load_file

    path = Path(path)
    if not is_eagle_dir(path):
        raise ValueError(f"{path} is not an EAGLE head's checkpoint (no config.json naming {EAGLE_ARCH}); "
                         "write one with draftsmith.train.eagle.save_eagle")
    head = EagleHead(target)
    head.load_weights(load_file(str(path / WEIGHTS)))
    return head


# -- features and batches --------------------------------------------------------------------------
@torch.no_grad()
def target_features(target: torch.nn.Module, rows: list[tuple[list[int], list[int]]], batch: int = 16) -> list[dict]:
    """Teacher-forced target features of (prompt_ids, completion_ids) rows -> per row, in order: ``ids`` [L],
    ``h`` [L, H] (post-norm last hidden states), ``top`` [L] (the target's argmax over its full head) and
    ``prompt_len``. Rows are batched by length, right-padded (causal attention: the padding never reaches a
    real position)."""
    out: list[dict | None] = [None] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]) + len(rows[i][1]))
    device = target.lm_head.weight.device
    for s in range(0, len(order), batch):
        idx = order[s:s + batch]
        seqs = [list(rows[i][0]) + list(rows[i][1]) for i in idx]
        n = max(map(len, seqs))
        ids = torch.zeros(len(seqs), n, dtype=torch.long, device=device)
        mask = torch.zeros(len(seqs), n, dtype=torch.long, device=device)
        for j, q in enumerate(seqs):
            ids[j, :len(q)] = torch.tensor(q, device=device)
            mask[j, :len(q)] = 1
        hs = target.model(input_ids=ids, attention_mask=mask).last_hidden_state
        top = target.lm_head(hs).argmax(-1)
        for j, i in enumerate(idx):
            length = len(seqs[j])
            out[i] = {"ids": ids[j, :length].cpu(), "h": hs[j, :length].cpu(), "top": top[j, :length].cpu(),
                      "prompt_len": len(rows[i][0])}
    return out  # type: ignore[return-value]


@dataclass
class Shifted:
    """Feature rows laid out for the head, slot t of a row of length L (t < L-1): the input token x_{t+1}
    (``next_ids``), the feature h_t (``h``), the teacher's feature h_{t+1} (``h_next``) and argmax at t+1
    (``top_next``: the target's choice of x_{t+2}); ``valid`` marks real slots, ``completion`` the slots a decode
    round proposes at (t >= P-1 for a prompt of P tokens: x_P, the first new token, comes from the prefill)."""

    next_ids: torch.Tensor
    h: torch.Tensor
    h_next: torch.Tensor
    top_next: torch.Tensor
    valid: torch.Tensor
    completion: torch.Tensor
    pos: torch.Tensor


def shifted(items: list[dict]) -> Shifted:
    """:class:`Shifted` of :func:`target_features` rows (right-padded to the longest)."""
    n = max(len(it["ids"]) for it in items) - 1
    b, width = len(items), items[0]["h"].shape[-1]
    s = Shifted(next_ids=torch.zeros(b, n, dtype=torch.long), h=torch.zeros(b, n, width),
                h_next=torch.zeros(b, n, width), top_next=torch.full((b, n), -1, dtype=torch.long),
                valid=torch.zeros(b, n, dtype=torch.bool), completion=torch.zeros(b, n, dtype=torch.bool),
                pos=torch.arange(n).unsqueeze(0).expand(b, n))
    for j, it in enumerate(items):
        length = len(it["ids"]) - 1
        s.next_ids[j, :length] = it["ids"][1:]
        s.h[j, :length] = it["h"][:-1]
        s.h_next[j, :length] = it["h"][1:]
        s.top_next[j, :length] = it["top"][1:]
        s.valid[j, :length] = True
        # a round's first proposal reads (x_P, h_{P-1}): slots t >= P-1 (x_P itself comes from the prefill)
        s.completion[j, max(0, it["prompt_len"] - 1):length] = True
    return s


def eagle_loss(head: EagleHead, s: Shifted, emb_w: torch.Tensor, head_w: torch.Tensor,
               w_reg: float = 1.0, second: float = 0.0) -> tuple[torch.Tensor, dict]:
    """The head's training loss on a :class:`Shifted` batch -> (loss, parts).

    Soft cross-entropy to the target's distribution at t+1 over the rows of `head_w` (the target's head, or its
    rows on the draft vocabulary: the target's distribution renormalised there), plus `w_reg` x smooth-L1 of the
    head's output against h_{t+1} (EAGLE's feature regression), at every real slot. With `second` > 0, plus
    `second` x the same cross-entropy of the second proposal (:meth:`EagleHead.second`, reading the head's own
    output at the slot before, gradients flowing through it): the proposal a K >= 2 round makes, trained where it
    is made rather than hoped for from the regression alone (HASS, EAGLE-3's training-time test)."""
    emb = F.embedding(s.next_ids, emb_w)
    out, kv = head(emb, s.h, s.pos)
    with torch.no_grad():
        teacher = torch.softmax(s.h_next[s.valid] @ head_w.T, dim=-1)
    ce = -(teacher * torch.log_softmax(out[s.valid] @ head_w.T, dim=-1)).sum(-1).mean()
    reg = F.smooth_l1_loss(out[s.valid], s.h_next[s.valid])
    loss, parts = ce + w_reg * reg, {"ce": float(ce.detach()), "reg": float(reg.detach())}
    if second > 0:
        own = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)  # slot t+1 reads the output at t
        out2 = head.second(emb, own, s.pos, kv)
        later = s.valid.clone()
        later[:, 0] = False  # slot 0 has no slot before it
        teacher2 = torch.softmax(s.h_next[later] @ head_w.T, dim=-1)
        ce2 = -(teacher2 * torch.log_softmax(out2[later] @ head_w.T, dim=-1)).sum(-1).mean()
        loss = loss + second * ce2
        parts["ce2"] = float(ce2.detach())
    return loss, parts
