"""Model shapes the planner and the real-shaped random models need, without downloading weights.

`Shapes` holds the few numbers that size a decoder-only transformer; `model_shapes(name)` reads
them from a model's config.json (local or a cached hub copy) and falls back to the built-in
`KNOWN` table. `build_random_model(shapes)` builds a randomly initialised Qwen2 of exactly that
shape in memory, so memory and speed can be measured where no weights can be downloaded
(tools/card_check/__main__.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.models import resolve_model


@dataclass
class Shapes:
    """What sizes a decoder-only transformer (Llama/Qwen2 layout)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    params: int = 0
    dtype: str = "bfloat16"
    """dtype of the stored weights (config.json's dtype / torch_dtype)"""

    def __post_init__(self):
        if not self.params:
            self.params = self.linear_params() + self.embedding_params() + self.norm_params()

    def linear_sizes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each decoder linear, by HF module name."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, \
            self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def linear_params(self) -> int:
        return self.layers * sum(a * b for a, b in self.linear_sizes().values())

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def norm_params(self) -> int:
        return (2 * self.layers + 1) * self.hidden


def kv_cache_bytes(s: Shapes, seqs: int, tokens: int, dtype_bytes: int) -> int:
    """Bytes of keys and values for `seqs` sequences of `tokens` tokens each."""
    return seqs * tokens * 2 * s.layers * s.kv_heads * s.head_dim * dtype_bytes


KNOWN = {
    # config.json values of the hub models (Qwen2 architecture); params include q/k/v biases
    "deepseek-ai/deepseek-r1-distill-qwen-1.5b": Shapes(
        layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, head_dim=128,
        vocab=151936, tied=False, params=1_777_088_000),
    "qwen/qwen2.5-1.5b-instruct": Shapes(
        layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, head_dim=128,
        vocab=151936, tied=True, params=1_543_714_304),
    "qwen/qwen2-0.5b-instruct": Shapes(
        layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64,
        vocab=151936, tied=True, params=494_032_768),
}


def _config(name: str):
    """The model's config as an attribute object: config.json read directly when the model is
    a local directory (no transformers import, so the driver stays light), else AutoConfig."""
    import json
    import os
    from types import SimpleNamespace

    path = resolve_model(name)
    file = os.path.join(path, "config.json")
    if os.path.isfile(file):
        with open(file) as f:
            raw = json.load(f)
        if "num_hidden_layers" in raw:  # a plain decoder config, not a nested multimodal one
            return SimpleNamespace(**raw)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def model_shapes(name: str) -> Shapes:
    """Shapes from the model's config (local, cached or hub), else the built-in table."""
    try:
        c = _config(name)
        heads = c.num_attention_heads
        return Shapes(layers=c.num_hidden_layers, hidden=c.hidden_size,
                      intermediate=c.intermediate_size, heads=heads,
                      kv_heads=getattr(c, "num_key_value_heads", None) or heads,
                      head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
                      vocab=c.vocab_size, tied=bool(getattr(c, "tie_word_embeddings", False)),
                      dtype=str(getattr(c, "dtype", None) or getattr(c, "torch_dtype", None)
                                or "float32").replace("torch.", ""))
    except Exception as err:  # noqa: BLE001 - unreachable hub, missing cache, odd config
        if name.lower() in KNOWN:
            return KNOWN[name.lower()]
        raise ValueError(f"model.name: no config for {name!r} ({type(err).__name__}) and no "
                         f"built-in shapes; known: {', '.join(KNOWN)}") from None


def qwen2_config(s: Shapes):
    """A transformers Qwen2Config of shape `s` (Qwen2/2.5 and the R1 distills are Qwen2)."""
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=s.hidden, intermediate_size=s.intermediate,
                       num_hidden_layers=s.layers, num_attention_heads=s.heads,
                       num_key_value_heads=s.kv_heads, vocab_size=s.vocab,
                       tie_word_embeddings=s.tied, max_position_embeddings=32768,
                       use_sliding_window=False)


def build_random_model(s: Shapes, dtype=None, device: str = "cpu", seed: int = 0):
    """A randomly initialised Qwen2ForCausalLM of shape `s` (no download, no checkpoint)."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(qwen2_config(s))
    return model.to(dtype or torch.bfloat16).eval()
