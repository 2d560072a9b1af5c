"""The rollout engine on a shared card: its batch limits and what it holds, awake and asleep.

One source for three readers: the planner (`launch/plan/card.py`) sizes the card with it, the vLLM
worker hands vLLM the same numbers (`max_num_seqs`, `max_num_batched_tokens`,
`kv_cache_memory_bytes`), and the learner caps itself to the card less what the sleeping engine
keeps. What vLLM 0.32 does on CUDA, read in its source:

* It sizes itself from the card's free memory, measured after its CUDA context exists (a
  snapshot when its worker starts) and again after a profiling run; the difference is counted
  as its own, and it asserts that free memory did not grow in between. A learner loading its
  model meanwhile would be counted as the engine's, so the learner loads first
  (launch/driver/roles.py). With `kv_cache_memory_bytes` the KV cache is that size, whatever the
  measurement says; vLLM still refuses to start unless the card's free memory covers
  `gpu_memory_utilization` x the card's size, so the worker passes the engine's share.
* Sleep (level 1) copies the weights to pinned host memory and frees them and the KV cache.
  Its CUDA context and the CUDA graphs' memory pool stay on the card (graphs are captured
  outside the pool that sleep offloads unless `sleep_mode_offload_cudagraph` is set).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.shapes import Shapes, kv_cache_bytes

GiB = 2**30
CUDA_CONTEXT = 0.5 * GiB
"""a process's CUDA context and library workspaces on the card (estimate)"""
CUDA_GRAPHS = 0.25 * GiB
"""vLLM's CUDA-graph memory pool for decode batches up to max_num_seqs (estimate; vLLM logs
the real figure at start as 'CUDA graph pool memory'); it stays on the card while asleep"""
ENGINE_WORKSPACE = 0.3 * GiB
"""the engine's activations and sampler buffers while it decodes (freed while asleep)"""
KV_BLOCK = 16
"""vLLM's KV-cache block on CUDA (tokens); a sequence takes whole blocks"""


@dataclass(frozen=True)
class EngineBatch:
    """What one rollout call brings one engine, and vLLM's batch limits from it."""

    seqs: int
    """sequences in one call: G x prompts per worker x steps_per_call (vLLM's max_num_seqs)"""
    prompts: int
    """distinct prompts in one call (their G samples share the prompt's prefill)"""
    max_model_len: int
    """prompt + new tokens"""
    batched_tokens: int
    """vLLM's max_num_batched_tokens: one call's prompts prefilled in one step beside a decode
    token of every sequence, and never below max_model_len"""


def engine_batch(rollout, max_model_len: int | None = None) -> EngineBatch:
    """Batch limits of one engine from `cfg.rollout` (as TRL's colocate mode sets max_num_seqs:
    the completions one generate call asks for). `max_model_len`: the engine's own when the
    model allows less than prompt + new tokens."""
    r = rollout
    per_worker = -(-r.prompts_per_step // r.num_workers) * r.steps_per_call
    seqs = -(-r.prompts_per_step * r.group_size // r.num_workers) * r.steps_per_call
    length = max_model_len or r.max_prompt_tokens + r.max_new_tokens
    tokens = max(length, per_worker * min(r.max_prompt_tokens, length) + seqs)
    return EngineBatch(seqs, per_worker, length, tokens)


def kv_bytes(s: Shapes, batch: EngineBatch, dtype_bytes: int = 2) -> int:
    """KV cache for every sequence of a call at full length, in whole blocks."""
    tokens = -(-batch.max_model_len // KV_BLOCK) * KV_BLOCK
    return kv_cache_bytes(s, batch.seqs, tokens, dtype_bytes)


def lora_slot_bytes(s: Shapes, rank: int, modules: list[str], dtype_bytes: int = 2) -> int:
    """vLLM's device buffers for one LoRA adapter (max_loras=1) of `rank` on `modules`."""
    return s.layers * sum(rank * (i + o) for m, (i, o) in s.linear_sizes().items()
                          if m in modules) * dtype_bytes


def asleep_bytes(engine: str) -> float:
    """What a sleeping engine keeps on the card: its CUDA context, and vLLM's CUDA graphs;
    nothing in one-copy mode (engine `learner`: no engine process)."""
    if engine == "learner":
        return 0.0
    return CUDA_CONTEXT + (CUDA_GRAPHS if engine == "vllm" else 0.0)


def learner_cap_gb(gpu_gb: float, engine: str) -> float:
    """The learner process's cap, its CUDA context included: the whole budget less what a
    sleeping engine keeps (the learner steps only while the engine sleeps); the whole budget
    in one-copy mode."""
    return gpu_gb - asleep_bytes(engine) / GiB
