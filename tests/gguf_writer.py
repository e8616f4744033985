"""Write a tiny Hugging Face Llama model and its tokenizer into a GGUF file, as llama.cpp's converter does.

The tests of GGUF inputs need a ``.gguf`` file whose right answer is known: this writes one from a
model built here, so that loading it back (transformers' GGUF reader, through :mod:`decode.gguf`)
can be compared with the original, logit for logit. What ``convert_hf_to_gguf.py`` does for
``LlamaForCausalLM``, and transformers' reader undoes
(``transformers/modeling_gguf_pytorch_utils.py``, ``integrations/ggml.py``,
``integrations/gguf/gguf_tokenizer_mapping.py``):

1. metadata under ``llama.*``: block_count, context_length, embedding_length, feed_forward_length,
   attention.head_count(_kv), rope.freq_base, rope.dimension_count (= head_dim),
   attention.layer_norm_rms_epsilon, vocab_size;
2. tensors renamed to ggml's names (``token_embd``, ``blk.N.attn_q`` ..., ``output_norm``,
   ``output``; no ``output`` when the head is tied to the embedding), stored F32 here;
3. the rows of ``q_proj`` / ``k_proj`` permuted from Hugging Face's rotary layout (two halves) to
   ggml's (interleaved pairs), per head: the reader reverses exactly this;
4. a byte-level BPE tokenizer as ``tokenizer.ggml.model=gpt2``: tokens, token types (control for the
   special tokens), merges, bos/eos/pad ids, the chat template.

Needs the ``gguf`` package (imported inside the functions, so that importing this module does not).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<|endoftext|>", "<|im_end|>", "<|pad|>"
# ids 0..3; EOS is not 2, the default of LlamaConfig, so a reader that ignores the file's ids shows
SPECIAL_TOKENS = [BOS, PAD, "<|im_start|>", EOS]
# A ChatML template like SmolLM2's, so that chat rendering has something to render with.
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens with a small model and verifies them with the large one.",
    "def add(a, b):\n    return a + b\n",
    "import json; print(json.dumps({'key': [1, 2, 3]}))",
    "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20",
]

# ggml token types (gguf.TokenType): NORMAL = 1, CONTROL = 3
_NORMAL, _CONTROL = 1, 3


def make_bpe_tokenizer(vocab_size: int = 320, texts: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 style: full byte alphabet, no prefix space) trained on `texts`."""
    from tokenizers import ByteLevelBPETokenizer

    core = ByteLevelBPETokenizer(add_prefix_space=False)
    core.train_from_iterator(texts or TEXTS, vocab_size=vocab_size, min_frequency=1, show_progress=False,
                             special_tokens=SPECIAL_TOKENS)  # the full byte alphabet is always included
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core._tokenizer, bos_token=BOS, eos_token=EOS,
                                        pad_token=PAD)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def llama_permute(weight: torch.Tensor, n_head: int, n_head_kv: int | None = None) -> torch.Tensor:
    """llama.cpp's ``LlamaModel.permute``: q/k rows from HF's half-split rotary layout to ggml's interleaved one.

    weight: [n_head * head_dim, hidden]; per head, rows (x_0..x_{d/2-1}, y_0..y_{d/2-1}) become
    (x_0, y_0, x_1, y_1, ...).
    """
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def _tokenizer_metadata(tokenizer: PreTrainedTokenizerFast) -> tuple[list[str], list[int], list[str]]:
    """(tokens in id order, their ggml token types, merges as "a b" strings) of a byte-level BPE tokenizer."""
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    if model["type"] != "BPE":
        raise ValueError(f"a byte-level BPE tokenizer is needed, got {model['type']}")
    vocab = tokenizer.get_vocab()  # includes the added (special) tokens
    tokens = [None] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    if None in tokens:
        raise ValueError("the tokenizer's ids are not contiguous")
    special = set(tokenizer.all_special_tokens)
    types = [_CONTROL if token in special else _NORMAL for token in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, types, merges


def _tensors(model, permute: bool):
    """(ggml name, float32 array) of a LlamaForCausalLM's weights, q/k permuted as llama.cpp does."""
    config = model.config
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads
    state = model.state_dict()
    yield "token_embd.weight", state["model.embed_tokens.weight"]
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        q, k = state[p + "self_attn.q_proj.weight"], state[p + "self_attn.k_proj.weight"]
        yield f"blk.{i}.attn_q.weight", llama_permute(q, n_head, n_head) if permute else q
        yield f"blk.{i}.attn_k.weight", llama_permute(k, n_head, n_kv) if permute else k
        yield f"blk.{i}.attn_v.weight", state[p + "self_attn.v_proj.weight"]
        yield f"blk.{i}.attn_output.weight", state[p + "self_attn.o_proj.weight"]
        yield f"blk.{i}.ffn_gate.weight", state[p + "mlp.gate_proj.weight"]
        yield f"blk.{i}.ffn_up.weight", state[p + "mlp.up_proj.weight"]
        yield f"blk.{i}.ffn_down.weight", state[p + "mlp.down_proj.weight"]
        yield f"blk.{i}.attn_norm.weight", state[p + "input_layernorm.weight"]
        yield f"blk.{i}.ffn_norm.weight", state[p + "post_attention_layernorm.weight"]
    yield "output_norm.weight", state["model.norm.weight"]
    if not config.tie_word_embeddings:
        yield "output.weight", state["lm_head.weight"]


def write_llama_gguf(model, tokenizer: PreTrainedTokenizerFast, path: str | Path, *, architecture: str = "llama",
                     permute: bool = True, name: str = "draftsmith tiny llama") -> Path:
    """Write `model` (a LlamaForCausalLM) and `tokenizer` (byte-level BPE) to `path` as an F32 GGUF file.

    `architecture` is written as general.architecture and the metadata prefix (another value makes a
    file transformers does not map); `permute=False` skips llama.cpp's q/k permutation (a wrong file,
    for tests that must see the difference).
    """
    import gguf

    config = model.config
    if len(tokenizer) != config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens and the model {config.vocab_size}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope_theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or config.rope_theta

    writer = gguf.GGUFWriter(str(path), architecture)  # writes general.architecture
    writer.add_name(name)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(head_dim)

    tokens, types, merges = _tokenizer_metadata(tokenizer)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)

    for tensor_name, tensor in _tensors(model, permute):
        writer.add_tensor(tensor_name, tensor.detach().to(torch.float32).contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def make_llama(vocab_size: int, *, seed: int = 0, layers: int = 3, hidden: int = 32, tied: bool = False):
    """A tiny random LlamaForCausalLM whose every tensor matters to its logits.

    Non-default rope theta and RMS epsilon (a reader that drops them changes the logits), norms that are
    not all ones (a swapped attn_norm/ffn_norm shows), a sharpened head (clear-cut greedy choices).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, rms_norm_eps=1e-3, tie_word_embeddings=tied,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                         bos_token_id=0, eos_token_id=3, pad_token_id=1)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.5 * torch.randn_like(param))
        model.get_output_embeddings().weight.mul_(8.0)
    model.generation_config.eos_token_id = None
    return model.eval()
