"""vLLM rollout worker: same interface (actors/base.py) and `RolloutBatch` as the HF worker.

Everything that touches vLLM itself is in actors/vllm_engine.py (`VLLMEngine`); this module
holds what the worker decides:

* LoRA updates (only adapter tensors cross the object store) are served one of two ways,
  chosen by `lora_merge` (default: merge on CPU, adapter on CUDA):
  - adapter: written as a peft adapter directory and loaded as an engine adapter (the previous
    one is removed);
  - merge: W = W0 + scale * B @ A computed here (W0 read once from the checkpoint's
    safetensors, or the dequantised NF4 base) and loaded in place, for the merged modules and
    their packed siblings only (q/k/v, gate/up), made one at a time (actors/lora_merge.py).
    On CPU vLLM's LoRA kernels decode SmolLM2-135M ~3.5x slower than the base model; a merged
    model decodes at base speed.
  Either way the prefix cache is reset on every version change.
* Full updates are loaded in place (`VLLMEngine.load_weights`).

Sampling is ours alone (actors/sampling.py): the engine starts with `generation_config="vllm"`
and every `SamplingParams` field that changes the distribution is set from `rollout.*`, so a
model's own generation_config.json (a repetition penalty, top_k) cannot leak in; the worker
logs once which of the model's settings it overrode.

Behaviour log-probs: the engine runs with `logprobs_mode="processed_logprobs"`, so the returned
log-prob of the sampled token is log softmax(logits / temperature) of the distribution actually
sampled from - what the HF worker and the learner compute (truncation, top_p < 1 or top_k > 0,
is refused by the config). vLLM's sampler converts the logits to fp32 before the softmax; its
LM head itself runs in the model dtype (fp32 on CPU here, bf16 on a GPU), which is the part
that is not fp32 on a bf16 GPU. With temperature 0 (greedy) it is log softmax(logits).

QLoRA (`lora.mode=qlora`): the learner trains on an NF4 base, so the worker serves that base:
it loads the dequantised NF4 weights (common/quant.py) into the engine at start and applies
LoRA pushes on top of them (merged on CPU, `LoRARequest` adapters on CUDA). vLLM 0.32 no longer
offers bitsandbytes quantisation (`quantization="bitsandbytes"` is refused as an unknown
method), so the engine holds the dequantised base in the model dtype, not in 4 bits.

Entropy: vLLM returns only the top-k log-probs per position (k = `ENTROPY_TOP_K` = 20), so the
per-token entropy is that of the top-k distribution renormalised to sum 1,
H ~= -sum_i q_i log q_i with q_i = p_i / sum_topk p (the entropy of p conditioned on the top k).
It is close to the true entropy when the top k hold nearly all the mass and is capped at
log k = 3.0 nats, so it underestimates flat distributions. Measured on SmolLM2-135M (fp32, T=0.8,
16 completions): mean 1.39 vs exact 1.35 nats, worst token off by 2.3 nats, rank correlation
0.98 with the exact entropies; the learner uses entropies only to rank tokens (the top-rho
entropy mask). Models with a vocabulary of at most `FULL_VOCAB_MAX` tokens get every log-prob
and the exact entropy.

Seeds: prompt i of a call samples its G completions with `SamplingParams(n=G, seed=s + i*G)`;
vLLM gives child g the seed `s + i*G + g`, so completion row r of a share uses seed `s + r`
and a share regenerated on a replacement worker with the same weights repeats itself.

Process layout: the engine core and its model worker run inside the calling process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `distributed_executor_backend="uni"`): start-up drops from
~75 s to ~15-25 s on 2 cores (each extra process re-imports vLLM), a SIGKILLed actor takes its
engine with it, and `collective_rpc` is a plain call (no copy of the weights). The verifier pool
still spawns a process, so scripts construct this class under `if __name__ == "__main__":`.

CPU environment (set before the engine starts, each only when not already set):
`VLLM_CPU_OMP_THREADS_BIND` = the `threads_per_worker` cores this worker owns (worker i takes
cores i*k .. i*k+k-1 of the process's affinity set, wrapping), with torch's thread count set to
match; the KV cache space sized from a call's batch (`vllm_setup.cpu_kv_cache_bytes`; a
`VLLM_CPU_KVCACHE_SPACE` the user set wins); `VLLM_CACHE_ROOT` = $HOMERL_CACHE/vllm.

vLLM's CPU attention supports head sizes 32, 64, 80, 96, 112, 128, ... only, so the 16-dim
`tiny-random-llama` cannot load; `common.tiny_model.save_tiny_vllm_model` writes a
vLLM-compatible tiny model.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from actors.adapter_files import AdapterFiles
from actors.base import RolloutWorker
from actors.lora_merge import merged_weights
from actors.prompts import EncodedPrompts, encode_prompts
from actors.rollout_batch import Origin, Sampled, Scorer, verified_batch, worker_memory
from actors.sampling import model_overrides, read_generation_config
from actors.vllm_engine import VLLMEngine
from actors.vllm_setup import (
    check_head_size,
    configure_env,
    cpu_kv_cache_bytes,
    cuda_available,
    cuda_limits,
    eos_ids,
    lora_rank,
    max_positions,
    vllm_dtype,
    worker_index,
    write_peft_adapter,
)
from actors.weights import check_version
from common.core_lease import (
    LEARNER,
    Lease,
    NoLease,
    flag_path,
    lease_key,
    set_torch_threads,
)
from common.device import card_gb
from common.mmap_weights import mmap_tensors
from common.models import load_tokenizer, resolve_model
from common.quant import dequantized_nf4_weights
from common.shapes import model_shapes
from common.types import RolloutBatch, RolloutCall, WeightUpdate
from rewards.fnbatch import RewardFns
from rewards.sandbox.pool import VerifierPool

log = logging.getLogger("homerl.rollout")

PACKED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""HF modules vLLM fuses into one layer: a merged load must bring the whole group"""


@dataclass(frozen=True)
class EngineRequests:
    """One call as vLLM gets it: its kept prompts, one engine prompt per request and each
    request's SamplingParams (n=G samples a request; greedy: G requests of n=1)."""

    encoded: EncodedPrompts
    inputs: list[list[int]]
    params: list


class VLLMRolloutWorker(RolloutWorker):
    """Generates G completions per prompt with vLLM and scores them (see module docstring)."""

    def __init__(self, cfg, name: str = "rollout-0", lora_merge: bool | None = None,
                 nf4: dict | None = None, fn_code: dict[str, bytes] | None = None):
        """`lora_merge`: serve LoRA updates merged into the weights (True) or as vLLM adapters
        (False); None: $HOMERL_VLLM_LORA (merge/adapter) if set, else merge on CPU only.
        `nf4`: QLoRA's base as the learner's NF4 bytes (`Learner.nf4_state`); None quantises
        the checkpoint here, as the learner does. `fn_code`: the packed `by-value:` reward
        functions of reward.fn (rewards/byvalue.py)."""
        self.cfg, self.name, self.started_at = cfg, name, time.time()
        if lora_merge is None:
            env = os.environ.get("HOMERL_VLLM_LORA", "")
            lora_merge = env == "merge" if env in ("merge", "adapter") else not cuda_available()
        self.lora_merge = lora_merge
        self.base: dict = {}  # HF name -> W0 of merged modules (merge mode): file pages
        self.base_override: dict | None = None  # the last full update, W0 for later merges
        self.threads = configure_env(cfg, name)
        self.path = resolve_model(cfg.model.name)
        check_head_size(self.path)
        self.tokenizer = load_tokenizer(self.path)
        self.eos_ids = eos_ids(self.path, self.tokenizer)
        self.use_lora = cfg.lora.mode in ("lora", "qlora")
        max_len = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
        max_len = min(max_len, max_positions(self.path) or max_len)
        cuda = cuda_available()
        self.engine = VLLMEngine(
            self.path, dtype=vllm_dtype(cfg.model.dtype), seed=cfg.run.seed,
            # CPU: eager starts ~90 s sooner, at every (re)start, for a decode step 7-10%
            # slower than compiled (docs/performance.md); CUDA: graphs
            eager=not cuda, max_model_len=max_len,
            lora_rank=lora_rank(cfg.lora.r) if self.use_lora and not lora_merge else None,
            cuda=cuda_limits(cfg, model_shapes(self.path), max_len, card_gb()) if cuda else None,
            kv_cache_bytes=cpu_kv_cache_bytes(cfg, self.path), cpu=not cuda)
        self.lease = self._lease()
        if cfg.lora.mode == "qlora":
            self._load_nf4_base(nf4)
        overridden = model_overrides(read_generation_config(self.path), cfg.rollout.temperature)
        if overridden:
            log.warning("%s: sampling ignores the model's generation_config: %s; rollout.* "
                        "decides what is sampled", name, ", ".join(overridden))
        self.adapter_files = AdapterFiles(name)  # adapter mode: where pushes are written
        self.adapter = None
        self.version = 0
        self.verifier = VerifierPool(unsandboxed_code=cfg.reward.unsandboxed_code)
        self.reward_fns = RewardFns.of(cfg.reward, fn_code)  # reward.fn's functions, or None
        self.load_s = 0.0

    def _lease(self) -> Lease | NoLease:
        """Core sharing with the learner of this node (common/core_lease.py): every decode
        batch size first runs on all the threads (oneDNN keeps the threading a GEMM shape first
        ran with), then this worker runs on its own cores, and on the learner's too while it
        waits; the learner borrows this worker's while it waits."""
        plan = self.threads
        if not plan.lent:
            return NoLease()
        r = self.cfg.rollout
        self.engine.warm_up(-(-r.prompts_per_step * r.group_size // r.num_workers)
                            * r.steps_per_call)
        key = lease_key()
        lease = Lease(flag_path(key) if key else None, 1 + worker_index(self.name), plan.own,
                      {LEARNER: plan.lent}, set_threads=set_torch_threads)
        self.engine.before_step = lease.before_step
        return lease

    # ---- weights -------------------------------------------------------------------------
    def set_weights(self, update: WeightUpdate, version: int, rollback: bool = False) -> int:
        """Load the learner's update for `version`; same checks as the HF worker."""
        check_version(self.name, update, version, self.version, rollback)
        with self.lease.busy():  # the learner keeps off this worker's cores
            self.lease.pick()  # a load runs beside the learner's update: own cores then
            return self._set_weights(update, version)

    def _set_weights(self, update: WeightUpdate, version: int) -> int:
        t0 = time.perf_counter()
        if update.kind == "lora":
            self._load_lora(update, version)
        elif update.kind == "full":
            self._drop_adapter()
            self.engine.load_weights(dict(update.tensors))
            self.base, self.base_override = {}, update.tensors  # later merges start here
        else:
            raise ValueError(f"weights update kind must be lora or full; got {update.kind!r}")
        self.engine.reset_prefix_cache()
        self.version = version
        self.load_s += time.perf_counter() - t0
        return version

    def _load_nf4_base(self, nf4: dict | None) -> None:
        """QLoRA: serve the dequantised NF4 base the learner trains on (vLLM 0.32 has no
        bitsandbytes quantisation); LoRA updates are merged into it or served as adapters.

        Only a merging worker reads the base again (W0 of every merge, in fp32). Served as
        adapters (the CUDA default) it is dropped once the engine holds it, and it is built in
        the dtype bitsandbytes dequantises to (the checkpoint's, bf16 for the 1.5B: 2.4 GiB of
        host memory while loading, not 4.9 in fp32, and none after)."""
        base = dequantized_nf4_weights(self.path, as_float=self.lora_merge, state=nf4)
        self.engine.load_weights(base)
        self.engine.reset_prefix_cache()
        self.base_override = base if self.lora_merge else None

    def _load_lora(self, update: WeightUpdate, version: int) -> None:
        if not self.use_lora:
            raise ValueError(f"{self.name}: LoRA update but lora.mode is {self.cfg.lora.mode!r}")
        if self.lora_merge:
            self._merge_lora(update)
            return
        # /dev/shm first (RAM, no disk), where there is room (actors/adapter_files.py)
        out = self.adapter_files.write(
            update, lambda path: write_peft_adapter(update, path, self.path), self._drop_adapter)
        seq = self.adapter_files.seq
        self.adapter = self.engine.add_adapter(f"v{version}-{seq}", seq, out)

    def _merge_lora(self, update: WeightUpdate) -> None:
        """Load W0 + scale * B @ A for every adapted module (and its packed siblings)."""
        names = set()
        for module in {k.rsplit(".", 1)[0] for k in update.tensors}:
            parent, leaf = module.rsplit(".", 1)
            group = next((g for g in PACKED if leaf in g), (leaf,))
            names.update(f"{parent}.{x}.weight" for x in group)
        self._ensure_base(names)
        order = sorted(names, key=_natural_key)  # layer by layer: vLLM reloads per layer
        # made as vLLM takes them: a layer's merged tensors are freed once it is copied
        self.engine.load_weights(merged_weights(order, self.base, update.tensors,
                                                float(update.scale)))

    def _ensure_base(self, names: set[str]) -> None:
        """The W0 tensors `names`: fp32 from the last full update, else the checkpoint's as
        copy-on-write maps of its files (`common.mmap_weights`), in the stored dtype: pages
        the learner's loaded model shares, not a private fp32 copy."""
        import torch

        missing = set(names) - set(self.base)
        if self.base_override is not None:
            for k in [k for k in missing if k in self.base_override]:
                self.base[k] = torch.tensor(np.asarray(self.base_override[k]), dtype=torch.float32)
                missing.discard(k)
        if not missing:
            return
        root = Path(self.path)
        if not root.is_dir():  # a hub id: its cached snapshot
            from huggingface_hub import snapshot_download

            root = Path(snapshot_download(self.path, allow_patterns=["*.safetensors"]))
        for f in sorted(root.glob("*.safetensors")):
            self.base.update(mmap_tensors(str(f), missing))
        missing -= set(self.base)
        if missing:
            raise ValueError(f"LoRA update names {sorted(missing)[0]}, which {self.path} lacks")

    def _drop_adapter(self) -> None:
        """Remove the served adapter from the engine and its files (a no-op without one)."""
        if self.adapter is not None:
            self.engine.remove_adapter(self.adapter)
            self.adapter = None
        self.adapter_files.remove_current()

    # ---- rollouts ------------------------------------------------------------------------
    def _encode(self, prompts: list[dict]) -> EncodedPrompts:
        return encode_prompts(self.tokenizer, prompts, self.cfg.rollout.max_prompt_tokens)

    def generate_steps(self, calls: list[RolloutCall]) -> list[RolloutBatch]:
        """One RolloutBatch per call, all decoded in one engine batch.

        A CPU decode step costs about the same for 16 rows as for 32 (weight streaming and
        small-M GEMM overhead dominate), so several steps' rollouts together cost little more
        than one. Each call keeps its own seeds: its completions do not depend on its company
        (up to float reassociation in the batched GEMMs). gen_time_s is the engine call's time
        split evenly over the calls.
        """
        with self.lease.busy():  # verification included: the learner keeps off this core
            return self._generate_steps(calls)

    def _generate_steps(self, calls: list[RolloutCall]) -> list[RolloutBatch]:
        t0 = time.perf_counter()
        requests = [self._requests(call) for call in calls]
        outs = self.engine.generate([x for req in requests for x in req.inputs],
                                    [p for req in requests for p in req.params], self.adapter)
        load_s, self.load_s = self.load_s, 0.0  # the first batch after a load reports it
        origin = Origin(self.name, t0, load_s, *worker_memory(self.verifier))
        scorer = Scorer(self.tokenizer, self.verifier, self.reward_fns, self.cfg, self.version)
        batches, start = [], 0
        for call, req in zip(calls, requests):
            rows = [c for out in outs[start: start + len(req.inputs)] for c in out]
            start += len(req.inputs)
            sampled = Sampled([c.token_ids for c in rows], [c.logprobs for c in rows],
                              [c.entropy for c in rows], [c.finish_reason for c in rows])
            batches.append(verified_batch(call.prompts, req.encoded, call.group_size, sampled,
                                          scorer, origin))
            origin = replace(origin, load_s=0.0)  # reported with the first call only
        elapsed = time.perf_counter() - t0
        lent = self.lease.stats()
        share = lent["lent_steps"] / lent["steps"] if lent["steps"] else 0.0
        return [replace(b, gen_time_s=elapsed / len(batches), lent_share=share)
                for b in batches]

    def _requests(self, call: RolloutCall) -> EngineRequests:
        """A call's kept prompts and its engine requests (prompts and SamplingParams)."""
        encoded = self._encode(call.prompts)
        r, s, g = self.cfg.rollout, call.sampling, call.group_size
        temperature = r.temperature if s.temperature is None else s.temperature
        max_new = s.max_new_tokens or r.max_new_tokens

        def params(n, seed):
            return self.engine.params(n, seed, temperature, max_new, self.eos_ids)

        if temperature == 0.0:
            # greedy: vLLM refuses n > 1, so G requests of n=1 (identical completions)
            return EngineRequests(encoded, [x for x in encoded.ids for _ in range(g)],
                                  [params(1, s.seed) for _ in encoded.keep for _ in range(g)])
        # n=G: vLLM seeds child j with seed + j, so row r of the call gets seed + r
        return EngineRequests(encoded, encoded.ids, [params(g, s.seed + i * g)
                                                     for i in range(len(encoded.keep))])

    # ---- GPU memory sharing (CUDA only) --------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Free the GPU for the learner: level 1 offloads weights to CPU, drops the KV cache."""
        if not cuda_available():
            raise RuntimeError("sleep mode needs a CUDA GPU")
        self.engine.sleep(level)

    def wake_up(self) -> None:
        if not cuda_available():
            raise RuntimeError("sleep mode needs a CUDA GPU")
        self.engine.wake_up()

    def shutdown(self) -> None:
        """Stop the engine and remove adapter files."""
        self.adapter_files.close()
        self.verifier.close()
        self.lease.close()
        engine = self.__dict__.pop("engine", None)
        if engine is not None:
            engine.shutdown()


def _natural_key(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]

