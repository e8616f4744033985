"""A lean cached forward for Llama-family decoders, and the choice between it and the model's own.

Why it exists: at batch 1 a small model's HF forward is mostly Python. A tiny draft's ``model(...)``
call is almost all overhead, and even a larger target spends a good share of each forward outside
its matrix products (mask construction, the growing ``DynamicCache`` concatenation, module
dispatch, output objects). Serving engines (vLLM, gpt-fast) run their own lean model code, so HF's
per-call overhead inflates the draft's cost ratio c, biases the best K downwards and hides the gain
a draft would really bring.

:class:`LeanModel` runs the same computation as the HF modules it wraps, op for op (RMSNorm in
float32 as ``LlamaRMSNorm``, rotary embeddings from the model's own ``rotary_emb``, SDPA with the
model's scaling, SiLU-gated MLP), on the model's own weight tensors (no copy), with a
preallocated KV buffer per layer: a new block is written in place and a rollback is a length
change. It covers ``llama``, ``mistral``, ``qwen2`` and ``qwen3`` checkpoints whose modules are
the plain ones (``nn.Linear`` projections: no LoRA wrapper, no quantized layers, no offload
hooks) and whose attention is full (no active sliding window). :func:`lean_unsupported` says why
any other model is not covered; ``backend="auto"`` then falls back to :class:`~decode.cache.CachedModel`.

It is one of the two runners of decode/runners.py (the runner interface, and the choice between them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftsmith.artifacts.errors import ConfigError

LEAN_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def _find(model: torch.nn.Module, path: str):
    obj = model
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def config_unsupported(config) -> str | None:
    """Why :class:`LeanModel` cannot run a model of this config exactly, or None when the config allows it (the
    model's modules are :func:`lean_unsupported`'s to check): read before a model is loaded (preflight)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in LEAN_MODEL_TYPES:
        return f"model type {model_type!r} (lean forward covers {', '.join(LEAN_MODEL_TYPES)})"
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(config, 'hidden_act', None)!r} (lean forward covers silu)"
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return "sliding-window attention layers"
    if getattr(config, "sliding_window", None) is not None and model_type == "mistral":
        return "mistral sliding window"
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if "dynamic" in rope_type or rope_type == "longrope":
        return f"rope_type {rope_type!r} (position tables that change with the sequence length)"
    return None


def lean_unsupported(model: torch.nn.Module) -> str | None:
    """Why :class:`LeanModel` cannot run `model` exactly, or None when it can."""
    config = getattr(model, "config", None)
    reason = config_unsupported(config)
    if reason is not None:
        return reason
    if type(model).__name__ not in {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}:
        return f"model class {type(model).__name__} (a wrapper or a head other than the causal-LM one)"
    layers = _find(model, "model.layers")
    if layers is None or _find(model, "model.rotary_emb") is None or _find(model, "model.norm") is None:
        return "no model.layers / model.rotary_emb / model.norm"
    for i, layer in enumerate(layers):
        for path in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            module = _find(layer, path)
            if type(module) is not torch.nn.Linear:
                return f"layer {i} {path} is {type(module).__name__}, not a plain nn.Linear (LoRA? quantized?)"
    for module in model.modules():
        if hasattr(module, "_hf_hook") or module._forward_hooks or module._forward_pre_hooks:
            return f"forward hooks on {type(module).__name__} (offloading or instrumentation)"
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return f"output head {type(head).__name__}, not a plain nn.Linear"
    return None


def unsupported_error(reason: str) -> ConfigError:
    """The error for a model the lean forward does not cover (`reason` from :func:`lean_unsupported`)."""
    return ConfigError(f"the lean forward does not cover this model: {reason}; use backend='hf' (decode.backend=hf)")


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm, op for op."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotary_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """cos [L, D], sin [L, D] -> (cos, signed sin, half swap) with
    ``x * cos + x[..., swap] * signed_sin == x * cos + rotate_half(x) * sin`` bitwise
    (rotate_half(x) = cat(-x2, x1); -a * b == a * -b exactly), in 4 ops instead of 7."""
    half = cos.shape[-1] // 2
    signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    swap = torch.cat((torch.arange(half, 2 * half), torch.arange(half))).to(cos.device)
    return cos, signed_sin, swap


def _linear(module: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return module.weight, module.bias


def _linear_block(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for a block of T > 1 tokens [1, T, in] -> [1, T, out], computed as W @ x^T.

    On CPU (MKL), ``x @ W^T`` with a few rows can repack the whole weight and run far slower than a
    one-token product; ``W @ x^T`` streams the weight once. The sums are the same up to rounding
    order (~1e-6 relative).
    """
    out = torch.mm(weight, x[0].T).T.contiguous()  # [T, out], rows contiguous: SDPA's flash kernel needs its
    if bias is not None:                             # inputs' last dimension dense (else it takes the math path)
        out = out + bias
    return out[None]


def _linear_one(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for one token [1, 1, in] -> [1, 1, out], computed as W @ [x; 0]^T (a two-column product).

    On some CPUs MKL runs a matrix-vector product (what F.linear does for one row) on one thread and a product
    with two columns on all of them. The zero column costs nothing the memory traffic does not already pay.
    """
    x = x[0]
    out = torch.mm(weight, torch.cat((x, torch.zeros_like(x))).T)[:, 0].contiguous()[None]  # [1, out], dense
    if bias is not None:
        out = out + bias
    return out[None]


def _linear_padded(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for a block of T > 1 tokens [1, T, in] -> [1, T, out], computed as W @ [x; 0]^T with T + 1 columns,
    the first T kept: the block form of :func:`_linear_one`. MKL's kernel for a few columns runs some widths
    faster than narrower ones (on some CPUs three tokens run faster padded to four columns)."""
    x = x[0]
    out = torch.mm(weight, torch.cat((x, x.new_zeros(1, x.shape[1]))).T)[:, : x.shape[0]].T.contiguous()  # dense
    if bias is not None:
        out = out + bias
    return out[None]


# The products of a block of T tokens through a matrix (all F.linear up to float rounding): what MKL runs fastest
# depends on the CPU and on T, so the lean forward measures it (fastest_form)
LINEAR, WEIGHT_FIRST, PADDED = "F.linear", "weight-first", "padded"
FORMS = (LINEAR, WEIGHT_FIRST, PADDED)


def product(form: str, t: int):
    """The function computing `form`'s product for a block of `t` tokens (for one token, the weight-first product
    is the padded one: W @ [x; 0]^T)."""
    if form == LINEAR:
        return F.linear
    if form not in FORMS:
        raise ValueError(f"unknown block product {form!r}: one of {FORMS}")
    if t == 1:
        return _linear_one
    return _linear_block if form == WEIGHT_FIRST else _linear_padded


def candidate_forms(t: int) -> tuple[str, ...]:
    """The forms worth timing for `t` tokens: one token has two (F.linear, W @ [x; 0]^T); a prefill-sized block
    (> 16) is bound by arithmetic, where a zero column only adds work."""
    if t == 1:
        return LINEAR, PADDED
    return (LINEAR, WEIGHT_FIRST) if t > 16 else FORMS


# (device, dtype, threads, the matrices' shapes, T) -> the fastest form there, measured once; and each form's median ms
_BLOCK_FORM: dict[tuple, str] = {}
_BLOCK_MS: dict[tuple, dict[str, float]] = {}

STREAMED_BYTES = 256 << 20  # the matrices timed for a small block: enough to stream from memory, as a forward does


def fastest_form(weights: list[torch.Tensor], t: int, repeats: int = 5) -> str:
    """The fastest of :func:`candidate_forms` for `t` tokens through `weights`, timed once per process on this machine
    (medians of `repeats` runs on random inputs, the forms' order rotated every run) and remembered.

    Which form MKL runs faster depends on the CPU and on T, not on anything draftsmith can read: each of the
    forms is the fastest for some T on some CPU.
    Pass the matrices a forward reads (the caller's :meth:`LeanModel._timed_weights`): timed on one layer's
    alone, they sit in the cache and the comparison is not the one a forward makes.
    """
    import time

    size = t if t <= 16 else 1 << (t - 1).bit_length()  # prefills of many lengths: one timing per power of two
    key = (weights[0].device.type, weights[0].dtype, torch.get_num_threads(), tuple(w.shape for w in weights), size)
    if key not in _BLOCK_FORM:
        gen = torch.Generator(weights[0].device).manual_seed(0)  # not the global RNG: a decode's sampling may use it
        inputs = [torch.randn(1, size, w.shape[1], dtype=w.dtype, device=w.device, generator=gen) for w in weights]
        forms = candidate_forms(size)
        times: dict[str, list[float]] = {form: [] for form in forms}
        with torch.inference_mode():
            for r in range(repeats + 1):
                for form in forms[r % len(forms):] + forms[:r % len(forms)]:
                    f = product(form, size)
                    started = time.perf_counter()
                    for x, w in zip(inputs, weights):
                        f(x, w)
                    if r:  # the first round warms them up
                        times[form].append(time.perf_counter() - started)
        _BLOCK_MS[key] = {form: sorted(times[form])[repeats // 2] * 1e3 for form in forms}
        _BLOCK_FORM[key] = min(forms, key=_BLOCK_MS[key].get)
    return _BLOCK_FORM[key]


def measured_forms() -> list[dict]:
    """The product forms this process measured (:func:`fastest_form`), for a run's record: per device, dtype, threads,
    block size and set of matrices, the form taken and each form's median milliseconds over those matrices. A
    decode's speed depends on them: a one-token form timed slow by a noisy moment slows plain decoding, and every
    speedup against it reads higher."""
    out = []
    for key, form in _BLOCK_FORM.items():
        device, dtype, threads, shapes, size = key
        out.append({"device": device, "dtype": str(dtype).removeprefix("torch."), "threads": threads, "tokens": size,
                    "matrices": len(shapes), "form": form, "ms": dict(_BLOCK_MS.get(key, {}))})
    return out


class _Layer:
    """The tensors of one decoder layer (references to the model's parameters)."""

    def __init__(self, layer: torch.nn.Module):
        attn, mlp = layer.self_attn, layer.mlp
        self.ln1 = (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        self.ln2 = (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
        # (weight, bias) pairs: F.linear on them is exactly nn.Linear.forward, minus the module call
        self.q, self.k, self.v, self.o = (_linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
        norms = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)  # qwen3: RMSNorm over the head dim
        self.qk_norm = None if norms[0] is None else tuple((n.weight, n.variance_epsilon) for n in norms)
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.n_heads = attn.q_proj.out_features // self.head_dim
        self.n_kv = attn.k_proj.out_features // self.head_dim
        self.gate, self.up, self.down = (_linear(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        self.qkv_o, self.mlp = (self.q, self.k, self.v, self.o), (self.gate, self.up, self.down)


class LeanModel:
    """A Llama-family causal LM run by hand over preallocated KV buffers (see the module docstring).

    Args:
        model: a model for which :func:`lean_unsupported` returns None, in eval mode.
        capacity: positions to preallocate (prompt + new tokens + k + 1 for a decode); the
            buffers double when a forward needs more.
        check: run :func:`lean_unsupported` (False only where the caller just did, as make_runner).
        rows: optional sorted, distinct LongTensor of head rows (token ids, checked by the caller:
            decode/runners.py): the head then computes only those rows (a copy of them, made once) and
            ``forward`` returns logits [keep, len(rows)] over them, in that order.
    """

    def __init__(self, model: torch.nn.Module, capacity: int = 256, check: bool = True,
                 rows: torch.Tensor | None = None):
        reason = lean_unsupported(model) if check else None
        if reason is not None:
            raise unsupported_error(reason)
        self.model = model
        inner = model.model
        self.layers = [_Layer(layer) for layer in inner.layers]
        self.embed = inner.embed_tokens.weight
        self.norm = (inner.norm.weight, inner.norm.variance_epsilon)
        self.head = _linear(model.get_output_embeddings())
        self.rows = None
        if rows is not None:  # a reduced head: the kept rows, contiguous, so the product streams only them
            self.rows = rows.to(self.embed.device)
            weight, bias = self.head
            self.head = (weight[self.rows].contiguous(), None if bias is None else bias[self.rows].contiguous())
        self.rotary = inner.rotary_emb
        # None (CPU) = per block size, the fastest product form on this machine (fastest_form: F.linear, W @ x^T or
        # W @ [x; 0]^T); one of FORMS = always that one; elsewhere exactly nn.Linear's product (LINEAR)
        self.block_form: str | None = None if self.embed.device.type == "cpu" else LINEAR
        self._forms: dict[tuple[str, int], str] = {}  # (layer | head, T) -> the measured form, for this model
        self.forwards = 0
        self.length = 0
        self.capacity = 0
        # True: each forward also keeps the post-norm hidden states of every position it ran in ``features``
        # [T, H] (what an EAGLE head reads: decode/loop.py eagle_generate)
        self.keep_features = False
        self.features: torch.Tensor | None = None
        # layer ids k: each forward also keeps the residual stream entering layer k at every position it ran,
        # concatenated in ``aux`` [T, len(ids) x H] (what an EAGLE-3 head reads: decode/loop.py eagle3_generate)
        self.keep_layers: tuple[int, ...] = ()
        self.aux: torch.Tensor | None = None
        self._allocate(max(int(capacity), 16))

    def _allocate(self, capacity: int) -> None:
        """(Re)allocate KV buffers and rotary tables for `capacity` positions, keeping the cached prefix."""
        ref = self.embed
        old = getattr(self, "kv", None)
        self.kv = []
        for i, layer in enumerate(self.layers):
            shape = (1, layer.n_kv, capacity, layer.head_dim)
            k = torch.empty(shape, dtype=ref.dtype, device=ref.device)
            v = torch.empty(shape, dtype=ref.dtype, device=ref.device)
            if old is not None and self.length:
                k[:, :, : self.length] = old[i][0][:, :, : self.length]
                v[:, :, : self.length] = old[i][1][:, :, : self.length]
            self.kv.append((k, v))
        positions = torch.arange(capacity, device=ref.device)[None]  # [1, capacity]
        cos, sin = self.rotary(ref[:1][None], positions)  # the model's own rotary module: [1, capacity, head_dim]
        self.cos, self.signed_sin, self.swap = _rotary_tables(cos[0], sin[0])
        self.capacity = capacity

    def block_product(self, t: int, where: str = "layer"):
        """The product for `t` tokens through the decoder layers' matrices (`where` "layer") or the head ("head"):
        as :attr:`block_form` says (None: :func:`fastest_form` on this machine, looked up once per block size;
        :data:`LINEAR`: nn.Linear's own product)."""
        form = self.block_form
        if form is None:
            key = (where, t)
            if key not in self._forms:
                self._forms[key] = fastest_form(self._timed_weights(where, t), t)
            form = self._forms[key]
        return product(form, t)

    def chosen_forms(self) -> dict[str, str]:
        """The product form this model's forwards took per ``"layer@T"`` / ``"head@T"`` so far."""
        return {f"{where}@{t}": form for (where, t), form in sorted(self._forms.items())}

    def _timed_weights(self, where: str, t: int) -> list[torch.Tensor]:
        """The matrices :func:`fastest_form` times for a block of `t` tokens: the head, or the
        layers' in forward order up to :data:`STREAMED_BYTES` (from memory, as in a forward; one layer's for
        prefill-sized blocks, whose products are bound by arithmetic, not by reading the weights)."""
        if where == "head":
            return [self.head[0]]
        weights: list[torch.Tensor] = []
        for layer in self.layers if t <= 16 else self.layers[:1]:
            weights += [w for w, _ in (*layer.qkv_o, *layer.mlp)]
            if sum(w.numel() * w.element_size() for w in weights) >= STREAMED_BYTES:
                break
        return weights

    def __len__(self) -> int:
        """Number of positions held in the cache."""
        return self.length

    def crop(self, length: int) -> None:
        """Drop cached positions beyond `length` (a no-op when the cache is not longer)."""
        self.length = min(self.length, length)

    def forward(self, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
        """Run `input_ids` [1, T] after the cached prefix; return logits [keep, V] (or [keep, len(rows)]) of the last
        `keep` positions."""
        t = input_ids.shape[1]
        start, end = self.length, self.length + t
        if end > self.capacity:
            self._allocate(max(end, 2 * self.capacity))
        h = F.embedding(input_ids, self.embed)  # [1, T, H]
        cos = self.cos[start:end][None, None]  # [1, 1, T, D]
        sin = self.signed_sin[start:end][None, None]
        swap = self.swap
        linear = self.block_product(t, "layer")
        mask = None
        if t > 1 and start > 0:  # block after a prefix: query i sees keys 0 .. start + i
            keys = torch.arange(end, device=h.device)
            mask = keys[None, :] <= (keys[start:, None])  # [T, end] bool
        kept = []
        for i, (layer, (k_buf, v_buf)) in enumerate(zip(self.layers, self.kv)):
            if i in self.keep_layers:
                kept.append(h[0])
            x = _rms_norm(h, *layer.ln1)
            q = linear(x, *layer.q).view(1, t, -1, layer.head_dim)
            k = linear(x, *layer.k).view(1, t, -1, layer.head_dim)
            if layer.qk_norm is not None:
                q, k = _rms_norm(q, *layer.qk_norm[0]), _rms_norm(k, *layer.qk_norm[1])
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = linear(x, *layer.v).view(1, t, -1, layer.head_dim).transpose(1, 2)
            q = q * cos + q.index_select(-1, swap) * sin  # rotary embedding, as apply_rotary_pos_emb
            k_buf[:, :, start:end] = k * cos + k.index_select(-1, swap) * sin
            v_buf[:, :, start:end] = v
            attn = F.scaled_dot_product_attention(
                q, k_buf[:, :, :end], v_buf[:, :, :end], attn_mask=mask, scale=layer.scaling,
                is_causal=t > 1 and start == 0, enable_gqa=layer.n_kv != layer.n_heads,
            )  # [1, heads, T, D]
            h = h + linear(attn.transpose(1, 2).reshape(1, t, -1), *layer.o)
            x = _rms_norm(h, *layer.ln2)
            h = h + linear(F.silu(linear(x, *layer.gate)) * linear(x, *layer.up), *layer.down)
        if self.keep_layers:
            self.aux = torch.cat([kept[sorted(self.keep_layers).index(k)] for k in self.keep_layers], dim=-1)
        self.length = end
        self.forwards += 1
        head = self.block_product(keep, "head")
        if self.keep_features:
            normed = _rms_norm(h, *self.norm)
            self.features = normed[0]  # [T, H]
            return head(normed[:, -keep:], *self.head)[0]
        return head(_rms_norm(h[:, -keep:], *self.norm), *self.head)[0]  # [keep, V] (or [keep, len(rows)])

