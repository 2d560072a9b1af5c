"""RAM planner for CPU runs: the predicted peak footprint of each of the run's processes.

    python -m launch.plan --preset cpu-demo                     # table, exit 0 when it fits
    python -m launch.plan --preset cpu-14core --ram-gb 8        # exit 1: does not fit 8 GiB

`launch.train` asks it before any actor starts and refuses a CPU config whose plan exceeds the
machine's available memory, in one line naming the largest consumer and what to change.

Figures are PSS (common/memory.py): pages shared between processes (libtorch, a model file two
processes map) count once in total. Per process (bytes):

* runtime: Python + torch + transformers + peft + Ray imported, the model built but no weight
  read: private memory (RUNTIME_PRIVATE, measured on this project's pinned versions) and the
  libraries' code (SHARED_LIBS) split among the learner and the rollout workers; the driver
  imports no torch (DRIVER_RUNTIME); each worker's verifier process VERIFIER.
* base weights W = params x bytes(model.dtype). When the stored file already has that dtype
  the learner and the HF workers map it and share its pages (W / sharers each). An fp32 run
  of a bf16/fp16 file maps the model cache's one fp32 conversion instead
  (common/shared_weights.py), shared the same way; with `HOMERL_SHARE_WEIGHTS=0` each
  process converts into a private copy (W each). A vLLM engine loads its own copy.
* HF worker with LoRA: on the model's own file, the merged copies of the adapted linears (the
  base stays the shared file); on the shared conversion, the unmerged fp32 adapters; on a
  private conversion, bf16 W0 of the adapted linears (merged in place).
* learner: LoRA params + grads + AdamW moments, fp32 (16 B each; full FT: every parameter,
  plus an fp32 master copy if the body is not fp32); the step's activations of one micro-batch
  (ACT_OVERHEAD x one layer's working set x tokens x layers, calibrated on cpu-demo); one chunk
  of LM-head logits.
* rollout: the HF worker's KV cache of its sequences in the model dtype, the prefill's values
  of one layer, and two (seqs x vocab) fp32 logit rows per decode step; vLLM's KV cache space
  as sized by the worker; a merging vLLM worker's fp32 merged linears of one layer
  (actors/lora_merge.py) and its share of W0 of the adapted linears (file pages it maps,
  shared with the learner's mapping when the file is stored in the run dtype).

Prompts are planned at PROMPT_TOKENS of the task (the chat template included), not at
rollout.max_prompt_tokens: the worst case would overstate a 60-token arithmetic prompt 4x.

A GPU run (`--gpu`, `gpu_rows`) keeps its models on the card; its host side is each process's
runtime with CUDA's libraries (CUDA_HOST, an estimate), the learner's exported adapter, and the
rollout worker's copy of the engine's weights: vLLM's sleep keeps them in pinned host memory
while the learner steps (the HF engine moves its model there), and a QLoRA worker's start-up
dequantises the NF4 base on the CPU (the NF4 model and the dequantised linears in their bf16,
freed once the engine holds them), the larger of the two counting. Adapter pushes are files in
/dev/shm, which is RAM: two at a time (actors/adapter_files.py).
"""

from __future__ import annotations

from actors.vllm_setup import KV_HEADROOM, KV_MIN_BYTES
from common.config import Config, ConfigError
from common.device import WSL_FIX, compute_dtype, wsl
from common.shapes import Shapes, kv_cache_bytes, model_shapes
from common.shared_weights import sharing_enabled
from launch.plan.units import NF4_BYTES, GiB

RUNTIME_PRIVATE = 0.30 * GiB
"""private memory of a learner or rollout-worker process with its model built but no weight
read yet (Python, torch, transformers, peft, Ray's core worker, the tokenizer, the modules):
0.29-0.31 GiB of anonymous memory in each of the 14-core split's seven such processes"""
SHARED_LIBS = 0.22 * GiB
"""resident code of the libraries such a process maps (libtorch 0.06-0.08 GiB, the others
0.15): PSS splits it among the processes that map it, the learner and every rollout worker
(the driver imports no torch)"""
DRIVER_RUNTIME = 0.095 * GiB
"""PSS of the driver: Ray's core worker, numpy, the run's bookkeeping (no torch); measured
0.09-0.10 GiB peak in cpu-demo (vLLM, 41 and 110 steps) and cpu-14core (6 HF workers) runs
(`tools.measure.memory_table`)"""
VERIFIER = 0.06 * GiB
"""PSS of a worker's verifier process (a spawned interpreter with the rewards package): 0.059 GiB
each in the 14-core split"""
VLLM_RUNTIME = 0.65 * GiB
"""extra PSS of vLLM's engine in a worker process, before weights and KV cache: a cpu-demo
worker held 1.86 GiB of anonymous memory once started, 0.65 beyond its private runtime, its
weights and its KV space"""
ACT_OVERHEAD = 3.5
"""learner activation bytes per token and layer, in units of one copy of a layer's working set
(2 hidden + q + k + v + attention out + 3 intermediate values): 3.4-4.2 measured on cpu-demo
(the step's peak above the resident model for micro-batches of 2, 4 and 8 sequences: the
saved tensors, their gradients, LoRA inputs and the allocator's slack)"""
CUDA_HOST = 1.0 * GiB
"""host memory of a process's CUDA runtime, cuBLAS and kernel images (estimate, not measured)"""
PROMPT_TOKENS = {"arith": 70, "gsm8k": 200}
"""typical chat-formatted prompt length of each task (tokens)"""
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


def run_dtype(cfg: Config) -> str:
    """fp32 or bf16: the dtype the workers and learner hold the model in on this CPU."""
    return compute_dtype(cfg.model.dtype, "cpu")


def shares_conversion(cfg: Config, s: Shapes) -> bool:
    """The learner and HF workers map one fp32 conversion of a bf16/fp16 file (LoRA: nothing
    writes into the base, so its pages stay shared)."""
    return (DTYPE_BYTES[run_dtype(cfg)] == 4 and DTYPE_BYTES.get(s.dtype, 4) == 2
            and cfg.lora.mode == "lora" and sharing_enabled())


def _prompt_tokens(cfg: Config) -> int:
    return min(cfg.rollout.max_prompt_tokens, PROMPT_TOKENS.get(cfg.curriculum.task, 200))


def _lora_params(cfg: Config, s: Shapes) -> int:
    return s.layers * sum(cfg.lora.r * (i + o) for m, (i, o) in s.linear_sizes().items()
                          if m in cfg.lora.modules())


def _adapted_linear_params(cfg: Config, s: Shapes) -> int:
    return s.layers * sum(i * o for m, (i, o) in s.linear_sizes().items()
                          if m in cfg.lora.modules())


def runtime(cfg: Config) -> float:
    """PSS of one learner or rollout-worker process before its model's weights."""
    return RUNTIME_PRIVATE + SHARED_LIBS / (1 + _workers(cfg))


def _workers(cfg: Config) -> int:
    """Rollout worker processes: none in one-copy mode (the learner generates)."""
    return 0 if cfg.rollout.one_copy else cfg.rollout.num_workers


def _layer_working(s: Shapes, nbytes: int) -> int:
    """Bytes of one token's values in one layer: 2 hidden + q + k + v + attention out + 3
    intermediate (gate, up, their product)."""
    return (2 * s.hidden + 2 * s.heads * s.head_dim + 2 * s.kv_heads * s.head_dim
            + 3 * s.intermediate) * nbytes


def learner_rows(cfg: Config, s: Shapes, weights_each: float) -> list[tuple[str, float]]:
    ro, g, nbytes = cfg.rollout, cfg.grpo, DTYPE_BYTES[run_dtype(cfg)]
    rows = [("runtime", runtime(cfg)), ("base weights", weights_each)]
    if cfg.lora.mode == "full":
        master = 0 if nbytes == 4 else s.params * 4
        rows.append(("full FT: params + grads + AdamW, fp32", s.params * 12.0 + master))
    else:
        rows.append((f"LoRA r={cfg.lora.r}: params + grads + AdamW, fp32",
                     _lora_params(cfg, s) * 16.0))
    tokens = g.micro_batch * ro.max_new_tokens + _prompt_tokens(cfg)  # prompt run once
    per_layer = ACT_OVERHEAD * _layer_working(s, nbytes)
    if cfg.model.gradient_checkpointing:
        acts = tokens * (s.layers * s.hidden * nbytes + per_layer)
    else:
        acts = tokens * s.layers * per_layer
    rows.append((f"step activations ({g.micro_batch} x {ro.max_new_tokens} + "
                 f"{_prompt_tokens(cfg)} tokens)", acts))
    rows.append(("LM-head logits, one chunk", 2 * 64 * 2**20))
    return rows


def worker_rows(cfg: Config, s: Shapes, weights_each: float) -> list[tuple[str, float]]:
    ro, nbytes = cfg.rollout, DTYPE_BYTES[run_dtype(cfg)]
    seqs = -(-ro.prompts_per_step * ro.group_size // ro.num_workers) * ro.steps_per_call
    tokens = _prompt_tokens(cfg) + ro.max_new_tokens
    rows = [("runtime", runtime(cfg)), ("verifier process", VERIFIER)]
    if ro.engine == "vllm":
        kv = max(KV_MIN_BYTES, KV_HEADROOM * kv_cache_bytes(
            s, seqs, ro.max_prompt_tokens + ro.max_new_tokens, nbytes))  # as the worker sizes it
        rows += [("vLLM engine runtime", VLLM_RUNTIME),
                 ("vLLM weights (own copy)", s.params * float(nbytes)),
                 ("vLLM KV cache space", float(kv))]
        if cfg.lora.mode != "full":
            adapted = _adapted_linear_params(cfg, s)
            # made one at a time and freed once vLLM has copied their layer
            rows += [("merged adapted linears of one layer, fp32", adapted * 4.0 / s.layers),
                     ("W0 of the adapted linears (file pages)", _vllm_w0_each(cfg, s))]
        return rows
    if shares_conversion(cfg, s):
        return rows + [("base weights (the shared fp32 conversion)", weights_each),
                       ("LoRA adapters, unmerged, fp32", _lora_params(cfg, s) * 4.0),
                       *_decode_rows(cfg, s, seqs, tokens, nbytes, unmerged=True)]
    rows.append(("base weights", weights_each))
    if cfg.lora.mode != "full" and nbytes == 4 and s.dtype in ("bfloat16", "bf16"):
        # converted from a bf16 file: W0 kept as bf16, merged in place (actors/weights.py)
        rows.append(("bf16 W0 of the adapted linears", _adapted_linear_params(cfg, s) * 2.0))
    elif cfg.lora.mode != "full":
        rows.append(("merged LoRA linears", _adapted_linear_params(cfg, s) * float(nbytes)))
    return rows + _decode_rows(cfg, s, seqs, tokens, nbytes)


def _decode_rows(cfg: Config, s: Shapes, seqs: int, tokens: int, nbytes: int,
                 unmerged: bool = False) -> list:
    """An HF worker's KV cache, the prefill's values of one layer (no autograd: a layer's
    are freed before the next one's; an unmerged adapter's hook adds its delta and the sum
    beside a linear's output, the widest being the intermediate) and the decode step's logit
    rows."""
    prompt = _prompt_tokens(cfg)
    per_token = _layer_working(s, nbytes)
    if unmerged:  # LoRA kept unmerged (on the shared conversion)
        per_token += 2 * s.intermediate * nbytes
    return [(f"KV cache ({seqs} seqs x {tokens} tokens)",
             float(kv_cache_bytes(s, seqs, tokens, nbytes))),
            (f"prefill, one layer ({seqs} x {prompt} tokens)", float(seqs * prompt * per_token)),
            ("decode logits", seqs * s.vocab * 8.0)]


def _file_shared_with_learner(cfg: Config, s: Shapes) -> bool:
    """The learner maps the model file (stored in the run dtype, not quantised)."""
    stored_as_run = DTYPE_BYTES.get(s.dtype, 0) == DTYPE_BYTES[run_dtype(cfg)]
    return stored_as_run and cfg.lora.mode != "qlora"


def _vllm_w0_each(cfg: Config, s: Shapes) -> float:
    """A merging vLLM worker's share of the adapted linears' W0: pages of the file
    (`common.mmap_weights`) shared by every vLLM worker and, when it maps them, the learner."""
    stored = _adapted_linear_params(cfg, s) * float(DTYPE_BYTES.get(s.dtype, 4))
    return stored / (cfg.rollout.num_workers + _file_shared_with_learner(cfg, s))


def gpu_rows(cfg: Config, s: Shapes) -> list[tuple[str, str, float]]:
    """[(process, component, bytes)] of host memory in a GPU run (see the module docstring)."""
    ro, lora = cfg.rollout, cfg.lora.mode != "full"
    adapter = (_lora_params(cfg, s) if lora else s.params) * 4.0
    weights = s.params * 2.0  # bf16 or fp16 on a card
    rows = [("driver", "runtime (imports)", DRIVER_RUNTIME),
            ("learner", "runtime", runtime(cfg)),
            ("learner", "CUDA runtime, host side", CUDA_HOST)]
    if ro.one_copy:  # no engine process, nothing exported: its verifier is the learner's
        return rows + [("learner", "verifier process", VERIFIER)]
    rows.append(("learner", "exported update (fp32, for the object store)", adapter))
    w = [("runtime", runtime(cfg)), ("verifier process", VERIFIER)]
    if ro.engine == "vllm":
        w.append(("vLLM engine runtime", VLLM_RUNTIME))
    w += [("CUDA runtime, host side", CUDA_HOST),
          ("engine weights in host memory while asleep" + (
              " (pinned)" if ro.engine == "vllm" else ""), weights)]
    if cfg.lora.mode == "qlora":
        nf4 = s.linear_params() * NF4_BYTES + (s.params - s.linear_params()) * 2.0
        start = nf4 + s.linear_params() * 2.0  # the NF4 model + its dequantised linears
        w.append(("start-up: NF4 base dequantised on the CPU, beyond that",
                  max(0.0, start - weights)))
    if ro.engine == "vllm" and lora:
        w.append(("adapter files in /dev/shm (two during a push)", 2 * adapter))
    for i in range(ro.num_workers):
        rows += [(f"rollout-{i}", name, v) for name, v in w]
    return rows


def budget(cfg: Config, shapes: Shapes | None = None,
           gpu: bool = False) -> list[tuple[str, str, float]]:
    """[(process, component, bytes)] of a CPU run (`gpu`: of a GPU run's host side): driver,
    learner, each rollout worker."""
    s = shapes or model_shapes(cfg.model.name)
    if gpu:
        return gpu_rows(cfg, s)
    ro = cfg.rollout
    dtype = run_dtype(cfg)
    weights = s.params * float(DTYPE_BYTES[dtype])
    # stored as run, or the shared conversion: file pages
    mapped = DTYPE_BYTES.get(s.dtype, 0) == DTYPE_BYTES[dtype] or shares_conversion(cfg, s)
    if ro.one_copy:
        return one_copy_rows(cfg, s, weights)
    sharers = 1 + (ro.num_workers if ro.engine == "hf" else 0)
    each = weights / sharers if mapped and cfg.lora.mode != "qlora" else weights
    learner_each = each
    if ro.engine == "vllm" and cfg.lora.mode == "lora" and _file_shared_with_learner(cfg, s):
        # the vLLM workers map the adapted linears' pages too: the learner's share shrinks
        adapted = _adapted_linear_params(cfg, s) * float(DTYPE_BYTES[dtype])
        learner_each = each - adapted + adapted / (1 + ro.num_workers)
    rows = [("driver", "runtime (imports)", DRIVER_RUNTIME)]
    rows += [("learner", name, v) for name, v in learner_rows(cfg, s, learner_each)]
    for i in range(ro.num_workers):
        rows += [(f"rollout-{i}", name, v) for name, v in worker_rows(cfg, s, each)]
    return rows


def one_copy_rows(cfg: Config, s: Shapes, weights: float) -> list[tuple[str, str, float]]:
    """One-copy mode on a CPU: the learner's process also generates, with peft's adapters
    unmerged; generation and the step take turns, so the larger of the two counts."""
    ro, nbytes = cfg.rollout, DTYPE_BYTES[run_dtype(cfg)]
    rows = learner_rows(cfg, s, weights)
    step = sum(v for name, v in rows if name.startswith(("step activations", "LM-head")))
    seqs = ro.prompts_per_step * ro.group_size * ro.steps_per_call
    gen = _decode_rows(cfg, s, seqs, _prompt_tokens(cfg) + ro.max_new_tokens, nbytes,
                       unmerged=cfg.lora.mode != "full")
    extra = sum(v for _, v in gen) - step
    what = ", ".join(name.split(" (")[0] for name, _ in gen)
    return ([("driver", "runtime (imports)", DRIVER_RUNTIME)]
            + [("learner", name, v) for name, v in rows]
            + [("learner", "verifier process", VERIFIER),
               ("learner", f"generation ({what}) beyond the step's working set", max(0.0, extra))])


def per_process(rows: list[tuple[str, str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for proc, _, v in rows:
        out[proc] = out.get(proc, 0.0) + v
    return out


def report(cfg: Config, ram_gb: float, shapes: Shapes | None = None,
           gpu: bool = False) -> tuple[str, bool, float]:
    """(table text, fits, total GiB); `gpu`: the host side of a GPU run."""
    s = shapes or model_shapes(cfg.model.name)
    rows = budget(cfg, s, gpu)
    procs = per_process(rows)
    total = sum(procs.values()) / GiB
    run = "models on the GPU" if gpu else f"run {run_dtype(cfg)}"
    lines = [f"{cfg.preset}: {cfg.model.name} ({s.params / 1e6:.0f}M params, stored "
             f"{s.dtype}, {run}), engine={cfg.rollout.engine}, "
             f"{_workers(cfg)} rollout worker(s), micro_batch={cfg.grpo.micro_batch}", ""]
    lines += [f"  {p:<10} {name:<56} {v / GiB:6.2f} GiB" for p, name, v in rows]
    lines += ["  " + "-" * 76]
    lines += [f"  {p:<67} {v / GiB:6.2f} GiB" for p, v in procs.items()]
    lines.append(f"  {'peak total (PSS, Ray daemons not included)':<67} {total:6.2f} GiB of "
                 f"{ram_gb:.1f} GiB: " + ("fits" if total <= ram_gb else "does not fit"))
    return "\n".join(lines), total <= ram_gb, total


def refusal(cfg: Config, ram_gb: float, shapes: Shapes | None = None, gpu: bool = False) -> str:
    """One line: the plan's total, its largest consumer, and what to change."""
    s = shapes or model_shapes(cfg.model.name)
    rows = budget(cfg, s, gpu)
    total = sum(v for _, _, v in rows) / GiB
    n = cfg.rollout.num_workers
    groups: dict[tuple[str, str], float] = {}  # a component summed over the rollout workers
    for proc, name, v in rows:
        key = (f"{n} rollout worker(s)" if proc.startswith("rollout-") else proc, name)
        groups[key] = groups.get(key, 0.0) + v
    (proc, name), big = max(groups.items(), key=lambda kv: kv[1])
    fix = {"step activations": "--grpo.micro_batch or --model.gradient_checkpointing true",
           "base weights": "a smaller model or --model.dtype bf16",
           "vLLM": "--rollout.engine hf", "KV cache": "--rollout.group_size or max_new_tokens"}
    hint = next((v for k, v in fix.items() if name.startswith(k)), "a smaller model")
    if proc.endswith("worker(s)") and n > 1:
        hint = "--rollout.num_workers " + str(max(1, n // 2))
    extra = f"; {WSL_FIX}" if wsl() else ""
    return (f"the plan needs {total:.2f} GiB of RAM and {ram_gb:.2f} GiB is available: largest "
            f"{proc}: {name} {big / GiB:.2f} GiB; try {hint} (python -m launch.plan){extra}")


def check(cfg: Config, available_gb: float, gpu: bool = False) -> None:
    """Raise ConfigError (one line) when a config's RAM plan exceeds `available_gb`."""
    s = model_shapes(cfg.model.name)  # once: it reads the model's config
    _, fits, _ = report(cfg, available_gb, s, gpu)
    if not fits:
        raise ConfigError(f"{cfg.preset}: {refusal(cfg, available_gb, s, gpu)}")
