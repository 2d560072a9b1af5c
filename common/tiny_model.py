"""A tiny random Llama with a character-level tokenizer, built offline (tests and `tiny`).

~87k parameters, 100-token vocabulary (specials, newline, printable ASCII); deterministic in
`seed`. `common.models.resolve_model("tiny-random-llama")` saves it once into the cache so every
process (Ray actor) loads identical weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def finish_generation_config(model, tokenizer) -> None:
    """Make generate() stop on the tokenizer's eos and pad with its pad token by default."""
    gen = model.generation_config
    eos_id = tokenizer.eos_token_id
    current = gen.eos_token_id
    current = [] if current is None else current if isinstance(current, list) else [current]
    gen.eos_token_id = eos_id if current in ([], [eos_id]) else sorted({eos_id, *current})
    gen.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = eos_id
    model.config.pad_token_id = tokenizer.pad_token_id

_TINY_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def build_tiny_tokenizer():
    """Character-level tokenizer: specials, ``\\n`` and printable ASCII (100 tokens)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {tok: i for i, tok in enumerate(_TINY_SPECIALS + chars)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Every character (newline included) is its own pre-token; Fuse joins them back losslessly.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(_TINY_SPECIALS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(seed: int = 0):
    """Build ``(model, tokenizer)`` for a tiny random Llama, deterministic in ``seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    # fork_rng: seeding must not disturb the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    finish_generation_config(model, tokenizer)
    return model.eval(), tokenizer


def save_tiny_model(path, seed: int = 0) -> Path:
    """Save the tiny random Llama (safetensors) and its tokenizer to ``path``."""
    model, tokenizer = build_tiny_model(seed)
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_qwen2(seed: int = 0, init_std: float = 0.02):
    """``(model, tokenizer)``: a tiny random Qwen2 (tied embeddings like Qwen2-0.5B, q/k/v
    biases, 2 heads of 32 so vLLM's CPU attention can load it), deterministic in ``seed``.

    ``init_std`` sets the weights' scale: 0.5 gives peaked next-token distributions (logits of
    a few units), where a stray sampling setting changes what is sampled visibly.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=len(tokenizer), max_position_embeddings=512,
        tie_word_embeddings=True, initializer_range=init_std, use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    finish_generation_config(model, tokenizer)
    return model.eval(), tokenizer


def save_tiny_qwen2(path, seed: int = 0, init_std: float = 0.02,
                    generation: dict | None = None) -> Path:
    """Save the tiny random Qwen2 and its tokenizer to ``path``; ``generation`` adds settings
    to its generation_config.json (as hub checkpoints ship them, e.g. a repetition_penalty)."""
    model, tokenizer = build_tiny_qwen2(seed, init_std)
    for key, value in (generation or {}).items():
        setattr(model.generation_config, key, value)
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_tiny_vllm_model(path, seed: int = 0) -> Path:
    """A tiny random Llama vLLM's CPU backend can load (head size 32, char tokenizer).

    Like `tiny-random-llama` (2 layers, hidden 64, vocab 100) but with 2 heads of 32.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=len(tokenizer), max_position_embeddings=512,
        tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
