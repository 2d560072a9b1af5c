"""GPU memory planner: will a config's learner and rollout engine fit on one card?

    python -m launch.plan --preset gpu-8gb --gpu-memory-gb 8      # budget, "fits", exit 0
    python -m launch.plan --preset gpu-8gb --gpu-memory-gb 6      # "does not fit", exit 1
    python -m launch.plan --preset gpu-8gb --capability 7.5       # an fp16 card (no bf16)

`launch.train` asks it before any actor starts and refuses a GPU config that does not fit, in
one line naming the largest consumer and settings that would make it fit.

The learner and the rollout engine time-slice the card (common/device.py). Three phases:

* start: the learner holds its model, the engine starts (launch/start.py). vLLM measures the
  free memory after its CUDA context exists and asks for its share of the card then.
* rollout: the learner idle (resident state only), the engine awake.
* learn: the learner steps while the engine sleeps. vLLM's sleep moves its weights to host
  memory and frees the KV cache, but its CUDA context and CUDA-graph pool stay on the card
  (common/engine_budget.py); the HF engine moves its model to host memory.

The peak is the largest phase. Per process, the caps add up to `--gpu-memory-gb`: the learner
is capped to the card less the sleeping engine, and the engine gets the card less the idle
learner (its KV cache is the plan's, `kv_cache_memory_bytes`). Estimates (bytes):

* learner weights: NF4 (qlora) linear layers at 0.5 B/param + 3.2% bitsandbytes double-quant
  constants, embeddings and an untied LM head in the compute dtype; lora/full: 2 B/param.
* LoRA: r * (in + out) per adapted linear; fp32 params + grads + two AdamW moments = 16 B each
  (in any compute dtype). Full fine-tuning: fp32 master copy + grads + AdamW on every param.
* learner step: activations per micro-batch (b x S tokens, 2 B): with gradient checkpointing
  one hidden state per layer plus one layer's working set, without it every layer's; the LM
  head in fp32 (a V x H fp32 copy of its weight) at the top-rho tokens only: K x V x 16 B.
* engine: the policy's base in the compute dtype (vLLM 0.32 has no bitsandbytes 4-bit, so a
  QLoRA worker serves the dequantised NF4 base), one LoRA adapter slot, a KV cache for one
  call's sequences at full length (vLLM's max_num_seqs), 0.3 GiB workspace, vLLM's CUDA graphs
  (0.25 GiB, kept asleep); the HF engine (the harness of tools.gpu_smoke and tools.bench_gpu)
  also one layer's working set for a prefill of every prompt of a call at once. 0.5 GiB CUDA
  context per process.

The compute dtype: bf16 on cards of compute capability 8.0 and newer, fp16 on older ones (the
same bytes); the driver reads the card's capability in a subprocess (common/device.py).
"""

from __future__ import annotations

import argparse
import sys

from common.config import Config, ConfigError
from common.device import DeviceError, cuda_dtype
from common.engine_budget import (
    CUDA_CONTEXT,
    CUDA_GRAPHS,
    ENGINE_WORKSPACE,
    GiB,
    engine_batch,
    kv_bytes,
    lora_slot_bytes,
)
from common.shapes import KNOWN, Shapes, model_shapes
from launch.presets import PRESETS, get_preset

NF4_BYTES = 0.5 * 1.032
"""bytes per NF4 weight including bitsandbytes' double-quantised constants"""
PUBLISHED = {"gpu-8gb": {"model_nf4_gb": 0.85, "peak_gb": 6.5, "group_size": 8}}
"""the seed's published gpu-8gb budget (the tests compare against it)"""
SMALLER = {"Qwen/Qwen2-0.5B-Instruct": KNOWN["qwen/qwen2-0.5b-instruct"]}
"""models a refusal may suggest when no single setting makes a config fit"""
PHASES = ("start", "rollout", "learn")
KEPT, AWAKE = "engine always", "engine awake"
"""the engine's parts: kept on the card while it sleeps, and held only while awake"""


def weight_bytes(s: Shapes, mode: str, nbytes: int = 2) -> float:
    if mode == "qlora":
        return s.linear_params() * NF4_BYTES + (s.params - s.linear_params()) * nbytes
    return s.params * float(nbytes)


def _lora_params(cfg: Config, s: Shapes) -> int:
    return s.layers * sum(cfg.lora.r * (i + o) for m, (i, o) in s.linear_sizes().items()
                          if m in cfg.lora.modules())


def _train_state(cfg: Config, s: Shapes) -> tuple[str, float]:
    if cfg.lora.mode == "full":
        return "full fine-tuning: fp32 params + grads + AdamW", s.params * 16.0
    lora = _lora_params(cfg, s)
    return f"LoRA r={cfg.lora.r}: {lora / 1e6:.1f}M params + grads + AdamW (fp32)", lora * 16.0


def _working_bytes(s: Shapes) -> int:
    """One layer's working set per token in 16 bits: hidden in and out, q/k/v, attention out,
    the MLP's gate, up and their product."""
    return (2 * s.hidden + (s.heads + 2 * s.kv_heads) * s.head_dim + s.heads * s.head_dim
            + 3 * s.intermediate) * 2


def _step_parts(cfg: Config, s: Shapes) -> list[tuple[str, float]]:
    ro, b = cfg.rollout, cfg.grpo.micro_batch
    seq = ro.max_prompt_tokens + ro.max_new_tokens
    tokens = b * seq
    working = tokens * _working_bytes(s)
    if cfg.model.gradient_checkpointing:
        acts = ("activations, checkpointed", s.layers * tokens * s.hidden * 2 + working)
    else:
        acts = ("activations, no checkpointing", s.layers * working)
    k = max(1, round(cfg.grpo.entropy_rho * b * ro.max_new_tokens))
    return [(f"{acts[0]} ({b} x {seq} tokens)", acts[1]),
            (f"LM head in fp32: weight copy ({s.vocab} x {s.hidden})", s.vocab * s.hidden * 4.0),
            (f"LM-head logits at top-rho tokens ({k} x {s.vocab})", k * s.vocab * 16.0)]


def _engine_parts(cfg: Config, s: Shapes, dtype: str) -> list[tuple[str, str, float]]:
    ro, nbytes = cfg.rollout, 4 if dtype == "fp32" else 2
    batch = engine_batch(ro)
    base = f"dequantised NF4 base, {dtype}" if cfg.lora.mode == "qlora" else dtype
    rows = [(KEPT, "CUDA context", CUDA_CONTEXT)]
    if ro.engine == "vllm":
        rows.append((KEPT, "CUDA graphs (vLLM keeps them while asleep)", CUDA_GRAPHS))
    rows.append((AWAKE, f"{ro.engine} weights ({base})", s.params * float(nbytes)))
    if cfg.lora.mode != "full":
        if ro.engine == "vllm":
            rows.append((AWAKE, f"LoRA adapter slot (rank {cfg.lora.r}, {dtype})",
                         float(lora_slot_bytes(s, cfg.lora.r, cfg.lora.modules(), nbytes))))
        else:
            rows.append((AWAKE, "LoRA adapters (fp32)", _lora_params(cfg, s) * 4.0))
    rows += [(AWAKE, f"KV cache ({batch.seqs} seqs x {batch.max_model_len} tokens)",
              float(kv_bytes(s, batch, nbytes))),
             (AWAKE, "sampler/activation workspace", ENGINE_WORKSPACE)]
    if ro.engine == "hf":  # generate prefills every prompt of a call at once; vLLM chunks it
        tokens = batch.seqs * ro.max_prompt_tokens
        rows.append((AWAKE, f"prefill working set ({batch.seqs} x {ro.max_prompt_tokens} "
                            "tokens, one layer)", float(tokens * _working_bytes(s))))
    return rows


def budget(cfg: Config, shapes: Shapes | None = None, dtype: str = "bf16"
           ) -> list[tuple[str, str, float]]:
    """[(part, component, bytes)]: part is `learner` (always resident), `learner step` (only
    while it trains), `engine always` (kept while it sleeps), `engine awake` (only while it
    rolls out). `dtype`: the compute dtype (`cuda_dtype`)."""
    s = shapes or model_shapes(cfg.model.name)
    nbytes = 4 if dtype == "fp32" else 2
    fmt = f"NF4 linears, {dtype} embeddings" if cfg.lora.mode == "qlora" else dtype
    rows = [("learner", "CUDA context", CUDA_CONTEXT),
            ("learner", f"base weights ({fmt})", weight_bytes(s, cfg.lora.mode, nbytes)),
            ("learner", *_train_state(cfg, s))]
    rows += [("learner step", name, v) for name, v in _step_parts(cfg, s)]
    return rows + _engine_parts(cfg, s, dtype)


def by_process(rows: list[tuple[str, str, float]]) -> dict[str, dict[str, float]]:
    """{phase: {process: bytes}} of the three phases (see the module docstring)."""
    part = {p: sum(v for q, _, v in rows if q == p)
            for p in ("learner", "learner step", KEPT, AWAKE)}
    return {"start": {"learner": part["learner"], "engine": CUDA_CONTEXT},
            "rollout": {"learner": part["learner"], "engine": part[KEPT] + part[AWAKE]},
            "learn": {"learner": part["learner"] + part["learner step"], "engine": part[KEPT]}}


def phases(rows: list[tuple[str, str, float]]) -> dict[str, float]:
    """Bytes on the card in each phase: start, rollout (engine awake), learn (engine asleep)."""
    return {ph: sum(procs.values()) for ph, procs in by_process(rows).items()}


def caps(rows: list[tuple[str, str, float]], gpu_gb: float) -> dict[str, float]:
    """Bytes each process may hold: the learner the card less the sleeping engine, the engine
    the card less the idle learner. Each phase then sums to at most `gpu_gb`."""
    pp = by_process(rows)
    return {"learner": gpu_gb * GiB - pp["learn"]["engine"],
            "engine": gpu_gb * GiB - pp["rollout"]["learner"]}


def engine_bytes(cfg: Config, shapes: Shapes | None = None) -> float:
    """Bytes the rollout engine holds on the card while awake (context included)."""
    return by_process(budget(cfg, shapes))["rollout"]["engine"]


def engine_utilization(cfg: Config, gpu_gb: float, shapes: Shapes | None = None) -> float:
    """vLLM's gpu_memory_utilization (of a card of `gpu_gb`): its share beyond its CUDA
    context, which it measures after the context exists."""
    return min(0.95, (engine_bytes(cfg, shapes) - CUDA_CONTEXT) / (gpu_gb * GiB))


def _peak(cfg: Config, shapes: Shapes, dtype: str) -> float:
    return max(phases(budget(cfg, shapes, dtype)).values()) / GiB


def suggestions(cfg: Config, gpu_gb: float, shapes: Shapes, dtype: str = "bf16") -> list[str]:
    """Single changes that would make `cfg` fit, cheapest first; else a smaller model."""
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
        if _peak(trial, shapes, dtype) <= gpu_gb:
            out.append(flag if isinstance(value, bool) or flag.endswith(str(value))
                       else f"{flag} {value}")
    if not out:
        out = [f"--model.name {name}" for name, small in SMALLER.items()
               if small.params < shapes.params and _peak(cfg, small, dtype) <= gpu_gb]
    return out


def _table(cfg: Config, gpu_gb: float, rows, dtype: str) -> list[str]:
    pp, cap = by_process(rows), caps(rows, gpu_gb)
    lines = [f"  {p:<13} {name:<60} {v / GiB:6.2f} GiB" for p, name, v in rows]
    lines += ["  " + "-" * 84, f"  {'phase':<58} {'learner':>8} {'engine':>8} {'card':>8}"]
    what = {"start": "start (learner loaded, engine starting)",
            "rollout": "rollout (learner idle, engine awake)",
            "learn": "learn (learner steps, engine asleep)"}
    for ph in PHASES:
        lr, en = pp[ph]["learner"] / GiB, pp[ph]["engine"] / GiB
        lines.append(f"  {what[ph]:<58} {lr:8.2f} {en:8.2f} {lr + en:8.2f}")
    free = gpu_gb - sum(pp["start"].values()) / GiB
    ask = (pp["rollout"]["engine"] - CUDA_CONTEXT) / GiB
    lines += [f"  at its start vLLM finds {free:.2f} GiB free and needs {ask:.2f} (its "
              f"gpu_memory_utilization {engine_utilization(cfg, gpu_gb):.3f} of {gpu_gb:g} "
              "GiB; the KV cache is the plan's kv_cache_memory_bytes)",
              f"  caps: learner {cap['learner'] / GiB:.2f} GiB ({gpu_gb:g} less the sleeping "
              f"engine), needs {pp['learn']['learner'] / GiB:.2f}; engine "
              f"{cap['engine'] / GiB:.2f} GiB ({gpu_gb:g} less the idle learner), needs "
              f"{pp['rollout']['engine'] / GiB:.2f}"]
    return lines


def report(cfg: Config, gpu_gb: float, shapes: Shapes | None = None,
           capability: tuple[int, int] | None = None) -> tuple[str, bool, float]:
    """(table text, fits, peak GiB). `capability`: the card's (None: not known here)."""
    s = shapes or model_shapes(cfg.model.name)
    dtype, why = cuda_dtype(cfg.model.dtype, capability)
    rows = budget(cfg, s, dtype)
    phase = phases(rows)
    peak = max(phase.values()) / GiB
    fits = peak <= gpu_gb
    batch = engine_batch(cfg.rollout)
    lines = [f"{cfg.preset}: {cfg.model.name} ({s.params / 1e9:.2f}B params), "
             f"lora.mode={cfg.lora.mode}, engine={cfg.rollout.engine}, "
             f"G={cfg.rollout.group_size}, gradient_checkpointing="
             f"{cfg.model.gradient_checkpointing}; learner and engine time-slice the card",
             f"dtype {dtype} ({why}); vLLM max_num_seqs {batch.seqs}, "
             f"max_num_batched_tokens {batch.batched_tokens}", ""]
    lines += _table(cfg, gpu_gb, rows, dtype)
    worst = max(phase, key=phase.get)
    lines.append(f"  {'peak':<76} {peak:6.2f} GiB of {gpu_gb:g}: "
                 + ("fits" if fits else "does not fit") + f" ({gpu_gb - peak:+.2f} GiB, the "
                 f"{worst} phase)")
    if cfg.preset in PUBLISHED:
        pub = PUBLISHED[cfg.preset]
        lines.append(f"  published: model ~{pub['model_nf4_gb']} GB in NF4, peak ~{pub['peak_gb']}"
                     f" GB at G={pub['group_size']}")
    if not fits:
        lines.append("  " + refusal(cfg, gpu_gb, s, capability))
    return "\n".join(lines), fits, peak


def refusal(cfg: Config, gpu_gb: float, shapes: Shapes | None = None,
            capability: tuple[int, int] | None = None) -> str:
    """One line: why `cfg` does not fit `gpu_gb` and what would make it fit."""
    s = shapes or model_shapes(cfg.model.name)
    dtype, _ = cuda_dtype(cfg.model.dtype, capability)
    rows = budget(cfg, s, dtype)
    phase = phases(rows)
    worst = max(phase, key=phase.get)
    keep = ("learner", "learner step") if worst == "learn" else ("learner", KEPT, AWAKE)
    big = max((r for r in rows if r[0] in keep), key=lambda r: r[2])
    who = "engine" if big[0] in (KEPT, AWAKE) else big[0]
    fixes = suggestions(cfg, gpu_gb, s, dtype)
    return (f"does not fit {gpu_gb:g} GiB: the {worst} phase needs {phase[worst] / GiB:.2f} GiB, "
            f"largest {who} {big[1]} {big[2] / GiB:.2f} GiB; "
            + (f"would fit with {' or '.join(fixes)}" if fixes else
               "no single setting fixes it: use a smaller model or a bigger card"))


def check(cfg: Config, gpu_gb: float, capability: tuple[int, int] | None = None) -> None:
    """Raise ConfigError (one line) unless `cfg` fits a card of `gpu_gb` GiB."""
    try:
        _, fits, _ = report(cfg, gpu_gb, capability=capability)
    except DeviceError as err:  # bf16 asked of a card without it
        raise ConfigError(f"{cfg.preset}: {err}") from None
    if not fits:
        raise ConfigError(f"{cfg.preset}: {refusal(cfg, gpu_gb, capability=capability)} "
                          "(python -m launch.plan shows the budget)")


def _capability(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launch.plan", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="gpu-8gb", help=f"one of {', '.join(PRESETS)}")
    ap.add_argument("--gpu-memory-gb", "--gpu-gb", dest="gpu_gb", type=float, default=8.0,
                    help="GPU memory to plan for, GiB")
    ap.add_argument("--capability", default=None,
                    help="the card's CUDA compute capability, e.g. 7.5 (picks fp16) or 8.6")
    ap.add_argument("--group-size", type=int, default=None, help="override rollout.group_size")
    ap.add_argument("--no-checkpointing", action="store_true",
                    help="plan without gradient checkpointing")
    ap.add_argument("--ram-gb", type=float, default=None,
                    help="host RAM to plan for, GiB (default: available now)")
    ap.add_argument("--cores", type=int, default=None,
                    help="size a CPU run for N cores (-1: this machine's; launch/sizing.py); "
                         "default: the preset's run.cores")
    args = ap.parse_args(argv)
    try:
        cfg = get_preset(args.preset)
        if args.group_size:
            cfg.rollout.group_size = args.group_size
        if args.no_checkpointing:
            cfg.model.gradient_checkpointing = False
        text, fits = _device_plans(cfg, args)
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0 if fits else 1


def _device_plans(cfg: Config, args) -> tuple[str, bool]:
    """The plans that bind `cfg`: a GPU preset's host side (RAM), then its card plan, whose
    verdict stays the last line; a CPU preset's RAM plan alone (it uses no card, so a card
    plan would only mislead)."""
    import psutil

    from launch import ram_plan

    ram_gb = args.ram_gb if args.ram_gb is not None else psutil.virtual_memory().available / GiB
    gpu = cfg.model.device == "cuda"
    if not gpu:
        try:
            cfg, why = ram_plan.sized(cfg, args.cores, ram_gb)
        except ConfigError as err:  # no split fits this machine: the verdict, not a bad flag
            return f"does not fit: {err}", False
        ram_text, ram_fits, _ = ram_plan.report(cfg, ram_gb)
        sized = f"sized: {why}\n" if why else ""
        return (f"{cfg.preset} runs on the CPU (model.device={cfg.model.device}): its plan is "
                f"the machine's RAM (python -m launch.ram_plan); no card is used\n{sized}"
                f"{ram_text}", ram_fits)
    ram_text, ram_fits, _ = ram_plan.report(cfg, ram_gb, gpu=gpu)
    text, fits, _ = report(cfg, args.gpu_gb, capability=_capability(args.capability))
    return (f"host memory (python -m launch.ram_plan --gpu):\n{ram_text}\n\n"
            f"the card:\n{text}", fits and ram_fits)


if __name__ == "__main__":
    sys.exit(main())
