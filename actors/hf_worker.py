"""Rollout worker on Hugging Face `generate`: behaviour log-probs, entropies, verified rewards.

A plain class; the launcher wraps it with `ray.remote(num_cpus=k)` and names the actor
(`rollout-0`, ...). Interface shared with the vLLM worker: `set_weights`, `generate`, `ping`.

On-policy by construction (docs/algorithm.md, "The on-policy invariant"): `generate` gets a complete
GenerationConfig built from `rollout.*` alone (actors/sampling.py), the behaviour log-probs are
recorded from the very scores that are sampled from, the LM head runs in fp32 even on a bf16
body, a QLoRA policy is sampled from the learner's dequantised NF4 base, and a bf16 worker keeps
LoRA unmerged (actors/weights.py), as does an fp32 worker on the machine's shared fp32
conversion of a bf16 checkpoint (`merges_lora`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import numpy as np
import torch

from actors.base import RolloutWorker
from actors.prompts import EncodedPrompts, encode_prompts
from actors.rollout_batch import Origin, Sampled, Scorer, verified_batch, worker_memory
from actors.sampling import (
    BehaviourRecorder,
    hf_generation_config,
    model_overrides,
    own_generation,
    read_generation_config,
)
from actors.weights import WeightApplier, check_version
from common.device import actor_device, torch_dtype
from common.lm_head import use_fp32_head
from common.memory import pin_mmap_threshold, release_free_memory
from common.models import load_model, load_tokenizer, resolve_model
from common.quant import dequantized_nf4_weights
from common.shared_weights import shared_checkpoint
from common.types import RolloutBatch, RolloutCall, Sampling, WeightUpdate
from rewards.fnbatch import RewardFns
from rewards.sandbox.pool import VerifierPool

log = logging.getLogger("homerl.rollout")


def worker_dtype(dtype: str, device: str = "cpu") -> torch.dtype:
    """The worker's model dtype on `device` (common.device.compute_dtype)."""
    return torch_dtype(dtype, device)


def kv_cache(choice: str, device: str) -> str:
    """`rollout.kv_cache` resolved: auto is static on a GPU (the call's cache allocated once,
    at the size the card's plan counts, with no regrowth per token) and dynamic on a CPU."""
    if choice != "auto":
        return choice
    return "static" if device == "cuda" else "dynamic"


@contextlib.contextmanager
def eval_mode(model):
    """`model` in eval mode (no dropout, no gradient checkpointing, a KV cache) for the block,
    then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def left_padded(prompt_ids: list[list[int]], copies: int, pad: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each prompt repeated `copies` times, left-padded to the longest: (input ids, attention
    mask), both (N, P) with N = prompts x copies."""
    rows = [ids for ids in prompt_ids for _ in range(copies)]
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])           # (N, P)
    attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])      # (N, P)
    return input_ids, attn


def load_base(cfg, path: str, dtype: torch.dtype, nf4: dict | None = None):
    """The worker's copy of the policy's base. With lora.mode=qlora the linear weights are
    the dequantised NF4 weights the learner's 4-bit base holds (common/quant.py), so both
    sample and score one policy; LoRA updates are merged on top of them. `nf4`: the learner's
    NF4 bytes (`Learner.nf4_state`); None quantises the checkpoint here, as the learner does."""
    model = load_model(path, dtype=dtype)
    if cfg.lora.mode == "qlora":
        modules = dict(model.named_modules())
        with torch.no_grad():
            # in the dequantised dtype unless fp32 is wanted: widening is exact, half the RAM
            for key, w in dequantized_nf4_weights(path, as_float=dtype == torch.float32,
                                                  state=nf4).items():
                modules[key.removesuffix(".weight")].weight.copy_(w.to(dtype))
    return model


def merges_lora(cfg, path: str, dtype: torch.dtype) -> bool:
    """Whether LoRA updates are merged into the weights (actors/weights.py).

    fp32 on the checkpoint's own fp32 file: merged into new tensors, so decoding runs at base
    speed while W0 stays the file's shared pages. fp32 on the machine's shared conversion of a
    bf16/fp16 file (common/shared_weights.py): unmerged, since merging would give every worker
    a private fp32 copy of the adapted linears (1.3 GiB on Qwen2-0.5B, 70% of the model) and
    unmerged adapters cost that model's decode little (docs/performance.md, Memory). QLoRA's
    dequantised linears are private already: merged. bf16: unmerged, as rounding a merge to
    bf16 loses most of a small update."""
    if dtype != torch.float32:
        return False
    return cfg.lora.mode == "qlora" or shared_checkpoint(path, dtype) == path


class HFRolloutWorker(RolloutWorker):
    """Generates G completions per prompt with the current policy and scores them."""

    def __init__(self, cfg, name: str = "rollout-0", nf4: dict | None = None, policy=None,
                 fn_code: dict[str, bytes] | None = None):
        """`nf4`: QLoRA's base as the learner's NF4 bytes (see `load_base`). `policy`: the
        learner's own model to generate with (one-copy mode, rollout.engine=learner): nothing
        is loaded, no weights are ever pushed, and the process and its threads are the
        learner's (launch/driver/one_copy.py). `fn_code`: the packed `by-value:` reward
        functions of reward.fn (rewards/byvalue.py)."""
        # first, as the learner does: each decode step frees (rows x vocab) fp32 tensors of
        # several MiB; with glibc's dynamic threshold they then come from the heap and stay as
        # holes. Generate calls of 16 rows x 64 tokens on the Qwen2-0.5B shape (0.31 GiB of
        # anonymous memory before) peaked at 0.48-1.03 GiB unpinned, 0.45-0.51 pinned.
        pin_mmap_threshold()
        self.cfg, self.name, self.started_at = cfg, name, time.time()
        path = resolve_model(cfg.model.name)
        self.device = actor_device()  # the GPU share Ray gave this actor, else the CPU
        self.tokenizer = load_tokenizer(path)
        self.learners_process = policy is not None
        if policy is None:
            threads = cfg.rollout.threads_per_worker
            os.environ["OMP_NUM_THREADS"] = str(threads)
            torch.set_num_threads(threads)
            dtype = worker_dtype(cfg.model.dtype, self.device)
            self.model = load_base(cfg, path, dtype, nf4).to(self.device)
            self.model.eval()
            self.weights = WeightApplier(self.model, merge=merges_lora(cfg, path, dtype))
        else:
            self.model, self.weights = policy, None
        use_fp32_head(self.model)  # fp32 logits as the learner's (common/lm_head.py)
        self.version = 0
        self.load_s = 0.0
        """seconds of weight loads since the last generate call (common.types.RolloutBatch)"""
        self.verifier = VerifierPool(unsandboxed_code=cfg.reward.unsandboxed_code)
        self.reward_fns = RewardFns.of(cfg.reward, fn_code)  # reward.fn's functions, or None
        overridden = model_overrides(read_generation_config(path), cfg.rollout.temperature)
        if overridden:
            log.warning("%s: sampling ignores the model's generation_config: %s; rollout.* "
                        "decides what is sampled", name, ", ".join(overridden))
        # the model's own generation config made neutral too, for every caller of this model
        self.eos_ids = own_generation(self.model, self.tokenizer,
                                      cfg.rollout.max_new_tokens).eos_token_id

    def set_weights(self, update: WeightUpdate, version: int, rollback: bool = False) -> int:
        """Load the learner's `update` for `version` (Ray resolves its ObjectRef).

        An older version than the one held is refused unless `rollback` (the driver re-running
        a failed share with the weights that share was launched with).
        """
        check_version(self.name, update, version, self.version, rollback)
        t0 = time.perf_counter()
        self.weights.apply(update)
        release_free_memory()  # the update's temporaries go back to the OS, not the heap
        self.version = version
        self.load_s += time.perf_counter() - t0
        return version

    def _encode(self, prompts: list[dict]) -> EncodedPrompts:
        return encode_prompts(self.tokenizer, prompts, self.cfg.rollout.max_prompt_tokens)

    def _scorer(self) -> Scorer:
        """How this worker rewards what it samples now (actors/rollout_batch.py)."""
        return Scorer(self.tokenizer, self.verifier, self.reward_fns, self.cfg, self.version)

    def _origin(self, started: float) -> Origin:
        """This worker, its memory, and its weight loads since its last batch (reported once:
        the counter starts again)."""
        load_s, self.load_s = self.load_s, 0.0
        memory, verifier = worker_memory(self.verifier, own_process=not self.learners_process)
        return Origin(self.name, started, load_s, memory, verifier)

    @torch.no_grad()
    def _sample(self, prompt_ids: list[list[int]], group_size: int, sampling: Sampling):
        """Left-pad, repeat each prompt G times, sample. Returns (completions, logp, entropy).

        The behaviour log-probs and entropies come from the scores that were sampled from
        (`BehaviourRecorder`, the only logits processor), in fp32.
        """
        pad = self.tokenizer.pad_token_id
        input_ids, attn = left_padded(prompt_ids, group_size, pad)
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)           # (N, P)
        width = input_ids.shape[1]
        torch.manual_seed(sampling.seed)
        r = self.cfg.rollout
        temperature = r.temperature if sampling.temperature is None else sampling.temperature
        max_new = sampling.max_new_tokens or r.max_new_tokens
        config = hf_generation_config(max_new, self.eos_ids, pad, greedy=temperature == 0)
        config.return_dict_in_generate = True
        if kv_cache(r.kv_cache, self.device) == "static":
            config.cache_implementation = "static"  # the call's whole cache, allocated once
        recorder = BehaviourRecorder(temperature)
        with eval_mode(self.model):  # the learner's model (one-copy mode) is in train mode
            out = self.model.generate(input_ids=input_ids, attention_mask=attn,
                                      generation_config=config, logits_processor=[recorder])
        gen = out.sequences[:, width:]                                               # (N, T)
        logp, entropy = recorder.finish(gen)                                         # (N, T)
        gen, logp, entropy = gen.cpu(), logp.cpu(), entropy.cpu()
        del out, recorder
        if self.learners_process and self.device == "cuda":
            torch.cuda.empty_cache()  # the KV cache's blocks are free for the learner's step
        return gen, logp, entropy

    def _trim(self, gen, logp, entropy) -> Sampled:
        """Cut each row after its first EOS (kept: the model must learn to stop)."""
        eos_ids = set(self.eos_ids)
        comps, lps, ents, reasons = [], [], [], []
        for row, lp, ent in zip(gen.tolist(), logp, entropy):
            end = next((j + 1 for j, t in enumerate(row) if t in eos_ids), None)
            reasons.append("length" if end is None else "stop")
            end = end or len(row)
            comps.append(row[:end])
            lps.append(lp[:end].numpy().astype(np.float32))
            ents.append(ent[:end].numpy().astype(np.float32))
        return Sampled(comps, lps, ents, reasons)

    # ---- a shared GPU: make room for the learner's step, then come back --------------------
    def sleep(self, level: int = 1) -> None:
        """Move the model (and the LoRA base copies) to host memory and free the card."""
        self._move("cpu")

    def wake_up(self) -> None:
        self._move(self.device)

    def _move(self, device: str) -> None:
        if self.device == "cpu":
            return  # nothing to free on a CPU-only worker
        self.model.to(device)
        self.weights.to(device)
        if device == "cpu":
            torch.cuda.empty_cache()

    def generate(self, call: RolloutCall) -> RolloutBatch:
        """G completions for each prompt {'question', 'answer', ...} of `call`, verified."""
        t0 = time.perf_counter()
        encoded = self._encode(call.prompts)
        sampled = Sampled([], [], [], [])
        if encoded.keep:
            sampled = self._trim(*self._sample(encoded.ids, call.group_size, call.sampling))
        return verified_batch(call.prompts, encoded, call.group_size, sampled, self._scorer(),
                              self._origin(t0))

    def generate_steps(self, calls: list[RolloutCall]) -> list[RolloutBatch]:
        """One RolloutBatch per call, generated one after another."""
        return [self.generate(call) for call in calls]
