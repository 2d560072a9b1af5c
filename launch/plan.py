"""GPU memory planner: will a config's learner and rollout engine fit on one card?

    python -m launch.plan --preset gpu-8gb --gpu-memory-gb 8      # budget, "fits", exit 0
    python -m launch.plan --preset gpu-8gb --gpu-memory-gb 4      # "does not fit", exit 1

`launch.train` asks it before any actor starts and refuses a GPU config that does not fit, in
one line naming the largest consumer and settings that would make it fit.

The learner and the rollout engine time-slice the card (common/device.py): during a rollout the
learner holds only its resident state and the engine is awake; during a learner step the engine
sleeps (vLLM's sleep mode: KV cache freed, weights in host memory; the HF engine's model in host
memory) and the learner adds its activations. The peak is the larger phase. Estimates (bytes):

* learner weights: NF4 (qlora) linear layers at 0.5 B/param + 3.2% bitsandbytes double-quant
  constants, embeddings and an untied LM head in bf16; lora/full: bf16.
* LoRA: r * (in + out) per adapted linear; fp32 params + grads + two AdamW moments = 16 B each.
  Full fine-tuning: fp32 master copy + grads + AdamW on every parameter.
* learner step: activations per micro-batch (b x S tokens, bf16): with gradient checkpointing
  one hidden state per layer plus one layer's working set, without it every layer's; the LM
  head in fp32 (a V x H fp32 copy of its weight) at the top-rho tokens only: K x V x 16 B.
* rollout engine: the policy's base in bf16 (vLLM 0.32 has no bitsandbytes 4-bit, so a QLoRA
  worker serves the dequantised NF4 base in bf16), a KV cache for G x prompts sequences of
  prompt + response tokens (2 x layers x kv_heads x head_dim x 2 B per token), 0.3 GiB
  workspace; asleep it keeps its CUDA context. 0.5 GiB CUDA context per process.
"""

from __future__ import annotations

import argparse
import sys

from common.config import Config, ConfigError
from common.shapes import Shapes, model_shapes
from launch.presets import PRESETS, get_preset

GiB = 2**30
CUDA_CONTEXT = 0.5 * GiB
ENGINE_WORKSPACE = 0.3 * GiB
NF4_BYTES = 0.5 * 1.032
"""bytes per NF4 weight including bitsandbytes' double-quantised constants"""
PUBLISHED = {"gpu-8gb": {"model_nf4_gb": 0.85, "peak_gb": 6.5, "group_size": 8}}
"""the seed's published gpu-8gb budget (the tests compare against it)"""


def weight_bytes(s: Shapes, mode: str) -> float:
    if mode == "qlora":
        return s.linear_params() * NF4_BYTES + (s.params - s.linear_params()) * 2
    return s.params * 2


def _train_state(cfg: Config, s: Shapes) -> tuple[str, float]:
    r = cfg.lora
    if r.mode == "full":
        return "full fine-tuning: fp32 params + grads + AdamW", s.params * 16.0
    lora = s.layers * sum(r.r * (i + o) for m, (i, o) in s.linear_sizes().items()
                          if m in r.modules())
    return f"LoRA r={r.r}: {lora / 1e6:.1f}M params + grads + AdamW (fp32)", lora * 16.0


def _step_parts(cfg: Config, s: Shapes) -> list[tuple[str, float]]:
    ro, b = cfg.rollout, cfg.grpo.micro_batch
    seq = ro.max_prompt_tokens + ro.max_new_tokens
    tokens = b * seq
    working = tokens * (2 * s.hidden + (s.heads + 2 * s.kv_heads) * s.head_dim
                        + s.heads * s.head_dim + 3 * s.intermediate) * 2
    if cfg.model.gradient_checkpointing:
        acts = ("activations, checkpointed", s.layers * tokens * s.hidden * 2 + working)
    else:
        acts = ("activations, no checkpointing", s.layers * working)
    k = max(1, round(cfg.grpo.entropy_rho * b * ro.max_new_tokens))
    return [(f"{acts[0]} ({b} x {seq} tokens)", acts[1]),
            (f"LM head in fp32: weight copy ({s.vocab} x {s.hidden})", s.vocab * s.hidden * 4.0),
            (f"LM-head logits at top-rho tokens ({k} x {s.vocab})", k * s.vocab * 16.0)]


def budget(cfg: Config, shapes: Shapes | None = None) -> list[tuple[str, str, float]]:
    """[(part, component, bytes)]: part is learner (always resident), learner step (only
    while it trains), engine (only while it rolls out)."""
    s = shapes or model_shapes(cfg.model.name)
    ro = cfg.rollout
    seq = ro.max_prompt_tokens + ro.max_new_tokens
    seqs = ro.group_size * ro.prompts_per_step
    kv = seqs * seq * 2 * s.layers * s.kv_heads * s.head_dim * 2.0
    fmt = "NF4 linears, bf16 embeddings" if cfg.lora.mode == "qlora" else "bf16"
    rows = [("learner", "CUDA context", CUDA_CONTEXT),
            ("learner", f"base weights ({fmt})", weight_bytes(s, cfg.lora.mode)),
            ("learner", *_train_state(cfg, s))]
    rows += [("learner step", name, v) for name, v in _step_parts(cfg, s)]
    base = "dequantised NF4 base, bf16" if cfg.lora.mode == "qlora" else "bf16"
    rows += [("engine", "CUDA context (kept while asleep)", CUDA_CONTEXT),
             ("engine", f"{ro.engine} weights ({base})", s.params * 2.0),
             ("engine", f"KV cache ({seqs} seqs x {seq} tokens)", kv),
             ("engine", "sampler/activation workspace", ENGINE_WORKSPACE)]
    return rows


def phases(rows: list[tuple[str, str, float]]) -> dict[str, float]:
    """Bytes on the card in each phase: rollout (engine awake) and learn (engine asleep)."""
    part = {p: sum(v for q, _, v in rows if q == p) for p in ("learner", "learner step", "engine")}
    return {"rollout": part["learner"] + part["engine"],
            "learn": part["learner"] + part["learner step"] + CUDA_CONTEXT}


def engine_bytes(cfg: Config, shapes: Shapes | None = None) -> float:
    """Bytes the rollout engine holds on the card while awake (the plan's `engine` rows)."""
    return sum(v for p, _, v in budget(cfg, shapes) if p == "engine")


def engine_utilization(cfg: Config, gpu_gb: float, shapes: Shapes | None = None) -> float:
    """vLLM's gpu_memory_utilization (of the card's `gpu_gb`): its share while awake."""
    return min(0.95, engine_bytes(cfg, shapes) / (gpu_gb * GiB) + 0.02)


def suggestions(cfg: Config, gpu_gb: float, shapes: Shapes) -> list[str]:
    """Single changes that would make `cfg` fit, cheapest first."""
    tries = [("--model.gradient_checkpointing true", "model", "gradient_checkpointing", True),
             ("--grpo.micro_batch", "grpo", "micro_batch", max(1, cfg.grpo.micro_batch // 2)),
             ("--rollout.max_new_tokens", "rollout", "max_new_tokens",
              max(8, cfg.rollout.max_new_tokens // 2)),
             ("--rollout.group_size", "rollout", "group_size",
              max(2, cfg.rollout.group_size // 2)),
             ("--lora.mode qlora", "lora", "mode", "qlora")]
    out = []
    for flag, section, field, value in tries:
        trial = Config.from_dict(cfg.to_dict())
        if getattr(getattr(trial, section), field) == value:
            continue
        setattr(getattr(trial, section), field, value)
        if max(phases(budget(trial, shapes)).values()) / GiB <= gpu_gb:
            out.append(flag if isinstance(value, bool) or flag.endswith(str(value))
                       else f"{flag} {value}")
    return out


def report(cfg: Config, gpu_gb: float, shapes: Shapes | None = None) -> tuple[str, bool, float]:
    """(table text, fits, peak GiB)."""
    s = shapes or model_shapes(cfg.model.name)
    rows = budget(cfg, s)
    phase = phases(rows)
    peak = max(phase.values()) / GiB
    fits = peak <= gpu_gb
    lines = [f"{cfg.preset}: {cfg.model.name} ({s.params / 1e9:.2f}B params), "
             f"lora.mode={cfg.lora.mode}, engine={cfg.rollout.engine}, "
             f"G={cfg.rollout.group_size}, gradient_checkpointing="
             f"{cfg.model.gradient_checkpointing}; learner and engine time-slice the card", ""]
    lines += [f"  {p:<13} {name:<60} {v / GiB:6.2f} GiB" for p, name, v in rows]
    lines += ["  " + "-" * 84,
              f"  rollout phase (learner resident + engine awake) {phase['rollout'] / GiB:27.2f} "
              "GiB",
              f"  learn phase (learner + its step + engine asleep) {phase['learn'] / GiB:26.2f} "
              "GiB",
              f"  {'peak':<76} {peak:6.2f} GiB of {gpu_gb:g}: "
              + ("fits" if fits else "does not fit") + f" ({gpu_gb - peak:+.2f} GiB)",
              f"  vLLM gpu_memory_utilization (of {gpu_gb:g} GiB): "
              f"{engine_utilization(cfg, gpu_gb, s):.2f}"]
    if cfg.preset in PUBLISHED:
        pub = PUBLISHED[cfg.preset]
        lines.append(f"  published: model ~{pub['model_nf4_gb']} GB in NF4, peak ~{pub['peak_gb']}"
                     f" GB at G={pub['group_size']}")
    if not fits:
        lines.append("  " + refusal(cfg, gpu_gb, s))
    return "\n".join(lines), fits, peak


def refusal(cfg: Config, gpu_gb: float, shapes: Shapes | None = None) -> str:
    """One line: why `cfg` does not fit `gpu_gb` and what would make it fit."""
    s = shapes or model_shapes(cfg.model.name)
    rows = budget(cfg, s)
    phase = phases(rows)
    worst = max(phase, key=phase.get)
    keep = ("learner", "learner step") if worst == "learn" else ("learner", "engine")
    big = max((r for r in rows if r[0] in keep), key=lambda r: r[2])
    fixes = suggestions(cfg, gpu_gb, s)
    return (f"does not fit {gpu_gb:g} GiB: the {worst} phase needs {phase[worst] / GiB:.2f} GiB, "
            f"largest {big[0]} {big[1]} {big[2] / GiB:.2f} GiB; "
            + (f"would fit with {' or '.join(fixes)}" if fixes else
               "no single setting fixes it: use a smaller model or a bigger card"))


def check(cfg: Config, gpu_gb: float) -> None:
    """Raise ConfigError (one line) unless `cfg` fits a card of `gpu_gb` GiB."""
    _, fits, _ = report(cfg, gpu_gb)
    if not fits:
        raise ConfigError(f"{cfg.preset}: {refusal(cfg, gpu_gb)} "
                          "(python -m launch.plan shows the budget)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launch.plan", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="gpu-8gb", help=f"one of {', '.join(PRESETS)}")
    ap.add_argument("--gpu-memory-gb", "--gpu-gb", dest="gpu_gb", type=float, default=8.0,
                    help="GPU memory to plan for, GiB")
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
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
