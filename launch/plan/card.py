"""GPU memory planner: will a config's learner (and rollout engine) fit on one card?

    python -m launch.plan --preset gpu-8gb --gpu-memory-gb 8      # budget, "fits", exit 0
    python -m launch.plan --preset gpu-8gb --gpu-memory-gb 3      # "does not fit", exit 1
    python -m launch.plan --preset gpu-8gb --capability 7.5       # an fp16 card (no bf16)

`launch.train` asks it before any actor starts and refuses a GPU config that does not fit, in
one line naming the largest phase, its largest consumer and settings that would make it fit.

Two layouts (common/device.py):

* one-copy (rollout.engine=learner, the gpu-8gb default): one process holds the model; its
  phases are start (the model loaded), rollout (+ the KV cache and generate's working set) and
  learn (+ the step's activations); the peak is the larger of the last two.
* time-sliced (engine hf or vllm): a learner and an engine process take turns. start: the
  learner holds its model, the engine starts (launch/driver/roles.py; vLLM measures the free memory
  after its CUDA context exists). rollout: the learner idle, the engine awake. learn: the
  learner steps while the engine sleeps; vLLM's sleep moves its weights to host memory and
  frees the KV cache, but its CUDA context and CUDA-graph pool stay (common/engine_budget.py);
  the HF engine moves its model to host memory. Per process, the caps add up to
  `--gpu-memory-gb`: the learner the card less the sleeping engine, the engine the card less
  the idle learner.

Every row says where its figure comes from: `shape` (tensor bytes that follow from the model's
shape and the preset's lengths) or `estimate` (a constant or a model of a working set). No row
has been measured on a card yet (docs/gpu.md says what has run where). Bytes:

* weights: NF4 (qlora) linear layers at 0.5 B/param + 3.2% bitsandbytes double-quant
  constants, embeddings and an untied LM head in the compute dtype; lora/full: 2 B/param.
* LoRA: r * (in + out) per adapted linear; fp32 params + grads + two AdamW moments = 16 B each
  (in any compute dtype). Full fine-tuning: fp32 master copy + grads + AdamW on every param.
* learner step: a micro-batch of one prompt and its completions packed in one row (P + b x T
  tokens, learner/model.py); with gradient checkpointing one hidden state per layer plus one
  layer's working set (its values and their gradients), without it every layer's. A layer's
  working set in 16 bits, plus peft's fp32 adapter path: each adapted linear's input widened to
  fp32 and its fp32 delta. The LM head in fp32 a slice of HEAD_SLICE_ROWS vocabulary rows at a
  time (common/lm_head.py), its logits a chunk of LOGITS_CHUNK_BYTES at a time (learner/model.py).
* generation (one-copy, and the HF engine): the KV cache of one call's sequences at full
  length; the prefill of every sequence at once through one layer (its working set, plus the
  adapter path's fp32 input, delta and sum at the widest linear); one decode step's fp32
  logits, log-probs and sampling buffers.
* the vLLM engine: the policy's base in the compute dtype (vLLM 0.32 has no bitsandbytes 4-bit,
  so a QLoRA worker serves the dequantised NF4 base), one LoRA adapter slot, a KV cache for one
  call's sequences at full length (max_num_seqs), 0.3 GiB workspace, CUDA graphs (0.25 GiB,
  kept asleep). 0.5 GiB CUDA context per process.

The compute dtype: bf16 on cards of compute capability 8.0 and newer, fp16 on older ones (the
same bytes); the driver reads the card's capability in a subprocess (common/device.py).
"""

from __future__ import annotations

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
from launch.plan.units import NF4_BYTES

HEAD_SLICE_ROWS = 16384
"""vocabulary rows of a 16-bit LM head widened to fp32 at a time (common/lm_head.HEAD_ROWS;
a test checks they agree: the driver imports no torch)"""
LOGITS_CHUNK_BYTES = 64 * 2**20
"""fp32 logits per chunk of the learner's log-prob pass (learner/model.py, likewise checked)"""
ALLOCATOR_SLACK = 0.10
"""torch's caching allocator reserves more than its tensors hold (blocks rounded up, split
and cached): this share of a phase's tensors (estimate)"""
SMALLER = {"Qwen/Qwen2-0.5B-Instruct": KNOWN["qwen/qwen2-0.5b-instruct"]}
"""models a refusal may suggest when no single setting makes a config fit"""
PHASES = ("start", "rollout", "learn")
LEARNER, STEP, GEN = "learner", "learner step", "learner rollout"
"""the learner's parts: resident, held only while it trains, held only while it generates
(one-copy mode)"""
KEPT, AWAKE = "engine always", "engine awake"
"""the engine's parts: kept on the card while it sleeps, and held only while awake"""
ESTIMATED = ("CUDA", "sampler", "activations", "prefill", "allocator")
"""rows whose figure is an estimate (by the component's first word); the others follow from
the shape"""


def source(component: str) -> str:
    """Where a row's figure comes from: 'estimate' or 'shape' (see the module docstring)."""
    return "estimate" if component.split()[0].rstrip(",:") in ESTIMATED else "shape"


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


def _adapted(cfg: Config, s: Shapes) -> list[tuple[int, int]]:
    return [io for m, io in s.linear_sizes().items() if m in cfg.lora.modules()]


def _adapter_path_bytes(cfg: Config, s: Shapes) -> int:
    """Per token and layer, what peft's fp32 adapter path of a 16-bit body keeps for the
    backward: each adapted linear's input widened to fp32, and its fp32 delta."""
    if cfg.lora.mode == "full":
        return 0
    return sum((i + o) * 4 for i, o in _adapted(cfg, s))


def _step_parts(cfg: Config, s: Shapes, nbytes: int) -> list[tuple[str, float]]:
    ro, b = cfg.rollout, cfg.grpo.micro_batch
    tokens = ro.max_prompt_tokens + b * ro.max_new_tokens  # one prompt, b completions packed
    layer = _working_bytes(s) + _adapter_path_bytes(cfg, s)
    what = f"{ro.max_prompt_tokens} + {b} x {ro.max_new_tokens} tokens packed"
    if cfg.model.gradient_checkpointing:
        acts = ("activations, checkpointed", s.layers * tokens * s.hidden * 2 + 2 * tokens * layer)
    else:
        acts = ("activations, no checkpointing", s.layers * tokens * layer)
    k = max(1, round(cfg.grpo.entropy_rho * b * ro.max_new_tokens))
    rows = min(k, max(1, LOGITS_CHUNK_BYTES // (4 * s.vocab)))
    out = [(f"{acts[0]} ({what})", acts[1])]
    if nbytes != 4:  # a 16-bit head is widened a slice at a time
        out.append((f"LM head in fp32, one slice ({min(HEAD_SLICE_ROWS, s.vocab)} x {s.hidden})",
                    min(HEAD_SLICE_ROWS, s.vocab) * s.hidden * 4.0))
    return out + [(f"LM-head logits, {rows} of the {k} selected tokens at a time (x {s.vocab})",
                   rows * s.vocab * 16.0)]


def _generate_parts(cfg: Config, s: Shapes, nbytes: int, peft: bool) -> list[tuple[str, float]]:
    """transformers' generate (one-copy mode, the HF engine): the call's KV cache, the prefill
    of every sequence through one layer, a decode step's logits. `peft`: the learner's model
    (peft's fp32 adapter path: input, delta and sum at the widest adapted linear); else the HF
    engine's hook (one fp32 tensor of the output's width, the input widened in slices)."""
    ro, batch = cfg.rollout, engine_batch(cfg.rollout)
    tokens = batch.seqs * ro.max_prompt_tokens
    extra = 0
    if cfg.lora.mode != "full":
        extra = max((i + 2 * o) * 4 if peft else o * 4 for i, o in _adapted(cfg, s))
    return [(f"KV cache ({batch.seqs} seqs x {batch.max_model_len} tokens)",
             float(kv_bytes(s, batch, nbytes))),
            (f"prefill working set ({batch.seqs} x {ro.max_prompt_tokens} tokens, one layer)",
             float(tokens * (_working_bytes(s) + extra))),
            (f"sampler: a decode step's fp32 logits ({batch.seqs} x {s.vocab}, 4 buffers)",
             batch.seqs * s.vocab * 16.0)]


def _engine_parts(cfg: Config, s: Shapes, dtype: str) -> list[tuple[str, str, float]]:
    ro, nbytes = cfg.rollout, 4 if dtype == "fp32" else 2
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
    if ro.engine == "hf":
        return rows + [(AWAKE, name, v) for name, v in _generate_parts(cfg, s, nbytes, False)]
    batch = engine_batch(ro)
    return rows + [(AWAKE, f"KV cache ({batch.seqs} seqs x {batch.max_model_len} tokens)",
                    float(kv_bytes(s, batch, nbytes))),
                   (AWAKE, "sampler/activation workspace (vLLM)", ENGINE_WORKSPACE)]


def budget(cfg: Config, shapes: Shapes | None = None, dtype: str = "bf16"
           ) -> list[tuple[str, str, float]]:
    """[(part, component, bytes)]: part is `learner` (always resident), `learner step` (only
    while it trains), `learner rollout` (one-copy mode: only while it generates), `engine
    always` (kept while it sleeps), `engine awake` (only while it rolls out). `dtype`: the
    compute dtype (`cuda_dtype`)."""
    s = shapes or model_shapes(cfg.model.name)
    nbytes = 4 if dtype == "fp32" else 2
    fmt = f"NF4 linears, {dtype} embeddings" if cfg.lora.mode == "qlora" else dtype
    rows = [(LEARNER, "CUDA context", CUDA_CONTEXT),
            (LEARNER, f"base weights ({fmt})", weight_bytes(s, cfg.lora.mode, nbytes)),
            (LEARNER, *_train_state(cfg, s))]
    rows += [(STEP, name, v) for name, v in _step_parts(cfg, s, nbytes)]
    if cfg.rollout.one_copy:
        return rows + [(GEN, name, v) for name, v in _generate_parts(cfg, s, nbytes, True)]
    return rows + _engine_parts(cfg, s, dtype)


def by_process(rows: list[tuple[str, str, float]]) -> dict[str, dict[str, float]]:
    """{phase: {process: bytes}} of the three phases (see the module docstring), each with
    the allocator's slack on its tensors (not on a CUDA context)."""
    part = {p: sum(v for q, _, v in rows if q == p) for p in (LEARNER, STEP, GEN, KEPT, AWAKE)}

    def slack(v: float, contexts: int = 1) -> float:
        return v + ALLOCATOR_SLACK * max(0.0, v - contexts * CUDA_CONTEXT)

    if not part[KEPT] and not part[AWAKE]:  # one-copy: one process
        return {"start": {"learner": slack(part[LEARNER])},
                "rollout": {"learner": slack(part[LEARNER] + part[GEN])},
                "learn": {"learner": slack(part[LEARNER] + part[STEP])}}
    return {"start": {"learner": slack(part[LEARNER]), "engine": CUDA_CONTEXT},
            "rollout": {"learner": slack(part[LEARNER]),
                        "engine": slack(part[KEPT] + part[AWAKE])},
            "learn": {"learner": slack(part[LEARNER] + part[STEP]), "engine": part[KEPT]}}


def phases(rows: list[tuple[str, str, float]]) -> dict[str, float]:
    """Bytes on the card in each phase: start, rollout, learn."""
    return {ph: sum(procs.values()) for ph, procs in by_process(rows).items()}


def caps(rows: list[tuple[str, str, float]], gpu_gb: float) -> dict[str, float]:
    """Bytes each process may hold: one-copy's one process the card; time-sliced, the
    learner the card less the sleeping engine, the engine the card less the idle learner.
    Each phase then sums to at most `gpu_gb`."""
    pp = by_process(rows)
    if "engine" not in pp["learn"]:
        return {"learner": gpu_gb * GiB}
    return {"learner": gpu_gb * GiB - pp["learn"]["engine"],
            "engine": gpu_gb * GiB - pp["rollout"]["learner"]}


def engine_bytes(cfg: Config, shapes: Shapes | None = None) -> float:
    """Bytes the rollout engine holds on the card while awake (context included); 0 in
    one-copy mode."""
    return by_process(budget(cfg, shapes))["rollout"].get("engine", 0.0)


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
             ("--lora.mode qlora", "lora", "mode", "qlora"),
             ("--rollout.engine learner", "rollout", "engine", "learner")]
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


WHAT = {"start": "start (model loaded)", "rollout": "rollout (generating)",
        "learn": "learn (the learner's step)"}
WHAT_SLICED = {"start": "start (learner loaded, engine starting)",
               "rollout": "rollout (learner idle, engine awake)",
               "learn": "learn (learner steps, engine asleep)"}


def _table(cfg: Config, gpu_gb: float, rows) -> list[str]:
    pp, cap = by_process(rows), caps(rows, gpu_gb)
    lines = [f"  {p:<15} {name:<70} {v / GiB:6.2f} GiB  {source(name)}" for p, name, v in rows]
    lines.append("  " + "-" * 104)
    if cfg.rollout.one_copy:
        lines.append(f"  {'phase (one process), tensors + ' + f'{ALLOCATOR_SLACK:.0%}':<86} "
                     f"{'card':>8}")
        lines += [f"  {WHAT[ph]:<86} {pp[ph]['learner'] / GiB:8.2f}" for ph in PHASES]
        return lines + [f"  cap: {cap['learner'] / GiB:.2f} GiB for the one process (its CUDA "
                        "context outside torch's allocator cap)"]
    lines.append(f"  {'phase, tensors + ' + f'{ALLOCATOR_SLACK:.0%}':<68} {'learner':>8} "
                 f"{'engine':>8} {'card':>8}")
    for ph in PHASES:
        lr, en = pp[ph]["learner"] / GiB, pp[ph]["engine"] / GiB
        lines.append(f"  {WHAT_SLICED[ph]:<68} {lr:8.2f} {en:8.2f} {lr + en:8.2f}")
    free = gpu_gb - sum(pp["start"].values()) / GiB
    ask = (pp["rollout"]["engine"] - CUDA_CONTEXT) / GiB
    return lines + [
        f"  at its start the engine finds {free:.2f} GiB free and needs {ask:.2f} (vLLM's "
        f"gpu_memory_utilization {engine_utilization(cfg, gpu_gb):.3f} of {gpu_gb:g} GiB; the "
        "KV cache is the plan's kv_cache_memory_bytes)",
        f"  caps: learner {cap['learner'] / GiB:.2f} GiB ({gpu_gb:g} less the sleeping "
        f"engine), needs {pp['learn']['learner'] / GiB:.2f}; engine {cap['engine'] / GiB:.2f} "
        f"GiB ({gpu_gb:g} less the idle learner), needs {pp['rollout']['engine'] / GiB:.2f}"]


def _layout(cfg: Config) -> str:
    if cfg.rollout.one_copy:
        return "one copy of the weights: the learner's model generates, in one process"
    return f"the learner and a {cfg.rollout.engine} engine process take turns on the card"


def report(cfg: Config, gpu_gb: float, shapes: Shapes | None = None,
           capability: tuple[int, int] | None = None) -> tuple[str, bool, float]:
    """(table text, fits, peak GiB). `capability`: the card's (None: not known here)."""
    s = shapes or model_shapes(cfg.model.name)
    dtype, why = cuda_dtype(cfg.model.dtype, capability)
    rows = budget(cfg, s, dtype)
    phase = phases(rows)
    peak = max(phase.values()) / GiB
    fits = peak <= gpu_gb
    r = cfg.rollout
    lines = [f"{cfg.preset}: {cfg.model.name} ({s.params / 1e9:.2f}B params), "
             f"lora.mode={cfg.lora.mode}, engine={r.engine}, G={r.group_size} x "
             f"{r.prompts_per_step} prompts, {r.max_prompt_tokens} + {r.max_new_tokens} tokens, "
             f"micro_batch={cfg.grpo.micro_batch}, gradient_checkpointing="
             f"{cfg.model.gradient_checkpointing}",
             f"layout: {_layout(cfg)}", f"dtype {dtype} ({why})"]
    if r.engine == "vllm":
        batch = engine_batch(r)
        lines.append(f"vLLM max_num_seqs {batch.seqs}, max_num_batched_tokens "
                     f"{batch.batched_tokens}")
    lines += ["rows: shape = tensor bytes from the model's shape; estimate = a constant or a "
              "working-set model; none measured on a card yet (docs/gpu.md)", ""]
    lines += _table(cfg, gpu_gb, rows)
    worst = max(phase, key=phase.get)
    lines.append(f"  {'peak':<86} {peak:6.2f} GiB of {gpu_gb:g} GiB: "
                 + ("fits" if fits else "does not fit") + f" ({gpu_gb - peak:+.2f} GiB, the "
                 f"{worst} phase)")
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
    keep = {"learn": (LEARNER, STEP), "rollout": (LEARNER, GEN, KEPT, AWAKE),
            "start": (LEARNER,)}[worst]
    big = max((r for r in rows if r[0] in keep), key=lambda r: r[2])
    who = "engine" if big[0] in (KEPT, AWAKE) else "learner"
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
