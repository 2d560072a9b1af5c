"""Setting vLLM up for a rollout worker: CPU environment, dtype, LoRA rank, adapter files, model
checks (head size, EOS ids, context), and a tiny vLLM-compatible test model.

Split from `actors/vllm_worker.py` (the worker itself); everything here runs before or beside
the engine and imports vLLM nowhere.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import numpy as np

from common.core_lease import split_cores
from common.device import compute_dtype
from common.engine_budget import CUDA_CONTEXT, GiB, engine_batch, kv_bytes
from common.model_cache import cache_dir
from common.shapes import kv_cache_bytes, model_shapes

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""the values vLLM accepts for max_lora_rank"""
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""head sizes vLLM's CPU attention backend supports"""
PEFT_PREFIX = "base_model.model."


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - any torch import problem means no CUDA
        return False


def worker_index(name: str) -> int:
    """`rollout-3` / `rollout-3-r1` -> 3 (0 when the name carries no index)."""
    m = re.match(r"\D*(\d+)", name)
    return int(m.group(1)) if m else 0


@dataclass(frozen=True)
class ThreadPlan:
    """A CPU worker's compute threads: `own` always, `own + lent` while the learner on its node
    waits (common/core_lease.py); lent = 0 on a GPU, with rollout.share_cores off, with no core
    left over for the learner, or when the user bound the threads (VLLM_CPU_OMP_THREADS_BIND)."""

    own: int = 0
    lent: int = 0


def configure_env(cfg, name: str) -> ThreadPlan:
    """vLLM CPU settings; each only when the user has not set it (vLLM reads them at start)."""
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir() / "vllm"))
    # One process: the engine core and its model worker run inside this (actor) process. vLLM
    # would otherwise spawn two more processes, each re-importing vLLM (~20 s apiece on 2
    # cores), and a SIGKILLed actor would leave them behind.
    in_process = os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0") == "0"
    # vLLM logs INFO lines every step (a prefix-cache reset per weight load) and its whole
    # engine config at start; they would bury the run's progress bar and warnings
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if cuda_available():
        return ThreadPlan()
    r = cfg.rollout
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
        range(os.cpu_count() or 1))
    own, lent = split_cores(cores, r.threads_per_worker, worker_index(name), r.num_workers,
                            r.learner_threads)
    user = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    if user in ("auto", "nobind"):
        return ThreadPlan()
    if user or not (r.share_cores and in_process):
        lent = []  # the step hook that lends runs in this process only
    plan = ThreadPlan(count_cores(user) if user else len(own), len(lent))
    if not in_process:  # vLLM binds its engine process's threads to these cores
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, own)))
    # In-process engine: torch's thread pool must be sized before vLLM starts (it refuses
    # set_num_threads afterwards), and at its largest: oneDNN sizes each GEMM for the threads
    # there are when it first runs that shape. 2 OpenMP threads on 1 core ran 3-5x slower.
    import torch

    os.environ["OMP_NUM_THREADS"] = str(plan.own + plan.lent)
    torch.set_num_threads(plan.own + plan.lent)
    return plan


DEFAULT_ENGINE_GB = 4.0
"""GiB the engine's share of a card when the driver's plan did not set rollout.engine_memory_gb
(tests and direct use)"""
KV_HEADROOM = 2.0
"""KV cache space on a CPU = this x the keys and values of one call's sequences at full length
(room for prefix-cache blocks and block rounding)"""
KV_MIN_BYTES = 256 * 2**20


def cpu_kv_cache_bytes(cfg, path: str) -> int | None:
    """vLLM's CPU KV cache space sized from the batch a call brings: G x prompts / workers x
    steps_per_call sequences of max_prompt_tokens + max_new_tokens. None when the user set
    VLLM_CPU_KVCACHE_SPACE (vLLM then takes theirs) or on a GPU (the plan sizes it there).
    vLLM's own CPU default is 4 GiB whatever the batch; cpu-demo needs ~0.2 GiB of it."""
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE") or cuda_available():
        return None

    r = cfg.rollout
    seqs = -(-r.prompts_per_step * r.group_size // r.num_workers) * r.steps_per_call
    dtype_bytes = 2 if vllm_dtype(cfg.model.dtype) in ("bfloat16", "float16") else 4
    need = kv_cache_bytes(model_shapes(path), seqs, r.max_prompt_tokens + r.max_new_tokens,
                          dtype_bytes)
    return max(KV_MIN_BYTES, int(KV_HEADROOM * need))


def count_cores(spec: str) -> int:
    """Cores in a cpulist such as '0-3,6' (the first rank's part of 'a|b')."""
    n = 0
    for part in spec.split("|")[0].split(","):
        lo, _, hi = part.strip().partition("-")
        n += int(hi) - int(lo) + 1 if hi else 1
    return max(n, 1)


def vllm_dtype(dtype: str) -> str:
    """Config dtype -> vLLM dtype (common.device.compute_dtype). auto: on CUDA bf16 from compute
    capability 8.0, fp16 below; on a CPU fp32, as the HF worker and the learner (on a 2-core
    AVX512-bf16 host without AMX vLLM decoded SmolLM2-135M ~5% faster in fp32 than in bf16).
    """
    chosen = compute_dtype(dtype, "cuda" if cuda_available() else "cpu")
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[chosen]


@dataclass(frozen=True)
class CudaLimits:
    """What a vLLM engine on a shared card is told (common/engine_budget.py)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_memory_bytes: int
    """the plan's KV cache, instead of a share of the card's free memory"""
    gpu_memory_utilization: float
    """the engine's share of the card: vLLM still checks at start that this much is free"""


def cuda_limits(cfg, shapes, max_model_len: int, card_gb: float) -> CudaLimits:
    """The engine's batch limits and KV budget from the plan's figures; `card_gb`: the card's
    real size (the plan's share holds on a bigger card too)."""
    batch = engine_batch(cfg.rollout, max_model_len)
    share = (cfg.rollout.engine_memory_gb * GiB - CUDA_CONTEXT if cfg.rollout.engine_memory_gb
             else DEFAULT_ENGINE_GB * GiB)
    return CudaLimits(batch.seqs, batch.batched_tokens, kv_bytes(shapes, batch),
                      round(min(0.95, max(0.01, share / (card_gb * GiB))), 4))


def lora_rank(r: int) -> int:
    """Smallest max_lora_rank vLLM accepts that holds rank r."""
    for v in LORA_RANKS:
        if v >= r:
            return v
    raise ValueError(f"lora.r: vLLM supports ranks up to {LORA_RANKS[-1]}; got {r}")


def write_peft_adapter(update, out_dir: str, base_model: str) -> str:
    """Write a LoRA WeightUpdate as a peft adapter directory.

    The update's scale is folded into B (lora_alpha = r, so peft's scale alpha/r is 1); the
    adapter vLLM loads is then exactly W0 + scale * B @ A.
    """
    import torch
    from safetensors.torch import save_file

    tensors, scale = update.tensors, float(update.scale)
    state, modules, rank = {}, set(), None
    for key, value in tensors.items():
        module, kind = key.rsplit(".", 1)  # kind: lora_A or lora_B
        t = torch.tensor(np.asarray(value), dtype=torch.float32)
        if kind == "lora_B":
            t = t * scale
        else:
            rank = t.shape[0]
        state[f"{PEFT_PREFIX}{module}.{kind}.weight"] = t.contiguous()
        modules.add(module.rsplit(".", 1)[-1])
    if rank is None:
        raise ValueError("LoRA payload holds no lora_A tensors")
    os.makedirs(out_dir, exist_ok=True)
    save_file(state, os.path.join(out_dir, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank,
              "target_modules": sorted(modules), "lora_dropout": 0.0, "bias": "none",
              "fan_in_fan_out": False, "use_rslora": False, "modules_to_save": None,
              "base_model_name_or_path": base_model}
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return out_dir


def check_head_size(path: str) -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if not cuda_available() and head not in CPU_HEAD_SIZES:
        raise ValueError(
            f"model {path}: head size {head} is not supported by vLLM's CPU attention "
            f"(supported: {', '.join(map(str, CPU_HEAD_SIZES))}); use rollout.engine=hf or a "
            f"model such as common.tiny_model.save_tiny_vllm_model(DIR)")


def eos_ids(path: str, tokenizer) -> list[int]:
    from transformers import GenerationConfig

    ids = set()
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    except OSError:
        pass
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def max_positions(path: str) -> int | None:
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
