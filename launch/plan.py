"""GPU memory planner: will a preset's learner and vLLM rollout worker fit on one card?

    python -m launch.plan --preset gpu-8gb [--gpu-gb 8] [--group-size 8] [--no-checkpointing]

Prints a budget table (GiB) and whether the peak fits; exit status 0 when it fits, 1 when not.
The learner and the vLLM worker run at the same time (max_staleness >= 1 overlaps the rollout
of step k+1 with training on step k), so the peak is the sum of both processes.

Model shapes come from the model's config.json (local or cached hub copy); for
DeepSeek-R1-Distill-Qwen-1.5B known values are built in, used when no config is reachable.
Estimates, per component (bytes):

* weights: NF4 (qlora) stores linear layers at 0.5 B/param + 3.2% quantisation constants
  (bitsandbytes double-quant: fp8 absmax per 64 weights, fp32 per 256 blocks); embeddings and
  an untied LM head stay bf16, as bitsandbytes leaves them. The table also shows the all-NF4
  figure the gpu-8gb seed published (~0.85 GB). lora/full: bf16.
* LoRA: r * (in + out) per adapted linear, fp32 params + grads + two AdamW moments = 16 B each.
  Full fine-tuning: fp32 master copy + grads + AdamW on every parameter.
* learner activations per micro-batch (b sequences x S tokens, bf16): with gradient
  checkpointing, one hidden state per layer plus one layer's recomputed working set
  (residual, q/k/v, attention output, 3 MLP intermediates); without, every layer's working set.
  LM-head logits only at the top-rho tokens of the b responses: K x V x 16 B (bf16 logits,
  fp32 copy, log-softmax and their gradients).
* vLLM: the same weight format as the learner (qlora: in-flight bitsandbytes NF4), KV cache for
  G x prompts sequences of prompt + response tokens (2 x layers x kv_heads x head_dim x 2 B per
  token), 0.3 GiB sampler/activation workspace; 0.5 GiB CUDA context per process.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from common.config import Config, ConfigError
from launch.presets import get_preset

GiB = 2**30
CUDA_CONTEXT = 0.5 * GiB
VLLM_WORKSPACE = 0.3 * GiB
NF4_BYTES = 0.5 * 1.032
"""bytes per NF4 weight including bitsandbytes' double-quantised constants"""
PUBLISHED = {"gpu-8gb": {"model_nf4_gb": 0.85, "peak_gb": 6.5, "group_size": 8}}
"""the seed's published gpu-8gb budget (the tests compare against it)"""


@dataclass
class Shapes:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    params: int = 0

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


KNOWN = {
    # config.json of the hub model (Qwen2 architecture); 1.78B parameters with the q/k/v biases
    "deepseek-ai/deepseek-r1-distill-qwen-1.5b": Shapes(
        layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, head_dim=128,
        vocab=151936, tied=False, params=1_777_088_000),
}


def model_shapes(name: str) -> Shapes:
    """Shapes from the model's config (local, cached or hub), else the built-in table."""
    try:
        from transformers import AutoConfig

        from common.models import resolve_model

        c = AutoConfig.from_pretrained(resolve_model(name))
        heads = c.num_attention_heads
        return Shapes(layers=c.num_hidden_layers, hidden=c.hidden_size,
                      intermediate=c.intermediate_size, heads=heads,
                      kv_heads=getattr(c, "num_key_value_heads", None) or heads,
                      head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
                      vocab=c.vocab_size, tied=bool(getattr(c, "tie_word_embeddings", False)))
    except Exception as err:  # noqa: BLE001 - unreachable hub, missing cache, odd config
        if name.lower() in KNOWN:
            return KNOWN[name.lower()]
        raise ConfigError(f"model.name: no config for {name!r} ({type(err).__name__}) and no "
                          f"built-in shapes; known: {', '.join(KNOWN)}") from None


def weight_bytes(s: Shapes, mode: str) -> float:
    if mode == "qlora":
        return s.linear_params() * NF4_BYTES + (s.params - s.linear_params()) * 2
    return s.params * 2


def budget(cfg: Config, shapes: Shapes | None = None) -> list[tuple[str, str, float]]:
    """[(process, component, bytes)] for `cfg`."""
    s = shapes or model_shapes(cfg.model.name)
    r, ro = cfg.lora, cfg.rollout
    seq = ro.max_prompt_tokens + ro.max_new_tokens
    b = cfg.grpo.micro_batch
    tokens = b * seq
    if r.mode == "full":
        train = s.params * 16
        train_name = "full fine-tuning: fp32 params + grads + AdamW"
    else:
        sizes = s.linear_sizes()
        lora = s.layers * sum(r.r * (i + o) for m, (i, o) in sizes.items() if m in r.modules())
        train = lora * 16
        train_name = f"LoRA r={r.r}: {lora / 1e6:.1f}M params + grads + AdamW (fp32)"
    working = tokens * (2 * s.hidden + (s.heads + 2 * s.kv_heads) * s.head_dim
                        + s.heads * s.head_dim + 3 * s.intermediate) * 2
    if cfg.model.gradient_checkpointing:
        acts = s.layers * tokens * s.hidden * 2 + working
        acts_name = f"activations, checkpointed ({b} x {seq} tokens)"
    else:
        acts = s.layers * working
        acts_name = f"activations, no checkpointing ({b} x {seq} tokens)"
    k = max(1, round(cfg.grpo.entropy_rho * b * ro.max_new_tokens))
    seqs = ro.group_size * ro.prompts_per_step
    kv = seqs * seq * 2 * s.layers * s.kv_heads * s.head_dim * 2
    fmt = "NF4 linears, bf16 embeddings" if r.mode == "qlora" else "bf16"
    return [
        ("learner", "CUDA context", CUDA_CONTEXT),
        ("learner", f"base weights ({fmt})", weight_bytes(s, r.mode)),
        ("learner", train_name, train),
        ("learner", acts_name, acts),
        ("learner", f"LM-head logits at top-rho tokens ({k} x {s.vocab})", k * s.vocab * 16),
        ("vllm", "CUDA context", CUDA_CONTEXT),
        ("vllm", f"weights ({fmt})", weight_bytes(s, r.mode)),
        ("vllm", f"KV cache ({seqs} seqs x {seq} tokens)", kv),
        ("vllm", "sampler/activation workspace", VLLM_WORKSPACE),
    ]


def report(cfg: Config, gpu_gb: float, shapes: Shapes | None = None) -> tuple[str, bool, float]:
    """(table text, fits, peak GiB)."""
    s = shapes or model_shapes(cfg.model.name)
    rows = budget(cfg, s)
    peak = sum(v for _, _, v in rows) / GiB
    vllm = sum(v for p, _, v in rows if p == "vllm") / GiB
    lines = [f"{cfg.preset}: {cfg.model.name} ({s.params / 1e9:.2f}B params), "
             f"lora.mode={cfg.lora.mode}, G={cfg.rollout.group_size}, "
             f"gradient_checkpointing={cfg.model.gradient_checkpointing}", ""]
    lines += [f"  {p:<8} {name:<62} {v / GiB:6.2f} GiB" for p, name, v in rows]
    fits = peak <= gpu_gb
    lines += ["  " + "-" * 82,
              f"  {'peak':<71} {peak:6.2f} GiB of {gpu_gb:g}: "
              + ("fits" if fits else "DOES NOT FIT") + f" ({gpu_gb - peak:+.2f} GiB)",
              f"  vLLM share: gpu_memory_utilization >= {(vllm - CUDA_CONTEXT / GiB) / gpu_gb:.2f}",
              f"  all-NF4 model size (as the seed's budget counts it): "
              f"{s.params * NF4_BYTES / GiB:.2f} GiB"]
    if cfg.preset in PUBLISHED:
        pub = PUBLISHED[cfg.preset]
        lines.append(f"  published: model ~{pub['model_nf4_gb']} GB in NF4, peak ~{pub['peak_gb']}"
                     f" GB at G={pub['group_size']}")
    return "\n".join(lines), fits, peak


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launch.plan", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="gpu-8gb")
    ap.add_argument("--gpu-gb", type=float, default=8.0, help="GPU memory, GiB")
    ap.add_argument("--group-size", type=int, default=None, help="override rollout.group_size")
    ap.add_argument("--no-checkpointing", action="store_true",
                    help="plan without gradient checkpointing")
    args = ap.parse_args(argv)
    try:
        cfg = get_preset(args.preset)
        if args.group_size:
            cfg.rollout.group_size = args.group_size
        if args.no_checkpointing:
            cfg.model.gradient_checkpointing = False
        text, fits, _ = report(cfg, args.gpu_gb)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
