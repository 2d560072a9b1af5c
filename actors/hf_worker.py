"""CPU rollout worker: Hugging Face `generate`, behaviour log-probs, entropies, verified rewards.

A plain class; the launcher wraps it with `ray.remote(num_cpus=k)` and names the actor
(`rollout-0`, ...). Interface shared with the vLLM worker: `set_weights`, `generate`, `ping`.
"""

from __future__ import annotations

import os
import time

import numpy as np
import psutil
import ray
import torch
import torch.nn.functional as F

from actors.prompts import encode_prompts, verified_batch
from actors.types import RolloutBatch
from actors.weights import WeightApplier, check_version
from launch.models import cpu_supports_bf16, load_model, load_tokenizer, resolve_model
from rewards import VerifierPool


def worker_dtype(dtype: str) -> torch.dtype:
    if dtype == "fp32" or (dtype == "auto" and not cpu_supports_bf16()):
        return torch.float32
    return torch.bfloat16


class HFRolloutWorker:
    """Generates G completions per prompt with the current policy and scores them."""

    def __init__(self, cfg, name: str = "rollout-0"):
        self.cfg, self.name = cfg, name
        threads = cfg.rollout.threads_per_worker
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
        path = resolve_model(cfg.model.name)
        self.tokenizer = load_tokenizer(path)
        self.model = load_model(path, dtype=worker_dtype(cfg.model.dtype))
        self.model.eval()
        self.weights = WeightApplier(self.model)
        self.version = 0
        self.verifier = VerifierPool()

    def ping(self) -> dict:
        """Liveness plus where it runs (`node_id`: which cluster node holds this actor)."""
        return {"name": self.name, "version": self.version, "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized()
                else None}  # None: used as a plain class, outside Ray

    def set_weights(self, payload: dict, version: int, rollback: bool = False) -> int:
        """Load the learner's export for `version` (Ray resolves the ObjectRef to the payload).

        An older version than the one held is refused unless `rollback` (the driver re-running
        a failed share with the weights that share was launched with).
        """
        check_version(self.name, payload, version, self.version, rollback)
        self.weights.apply(payload)
        self.version = version
        return version

    def _encode(self, prompts: list[dict]):
        return encode_prompts(self.tokenizer, prompts, self.cfg.rollout.max_prompt_tokens)

    @torch.no_grad()
    def _sample(self, prompt_ids: list[list[int]], group_size: int, sampling: dict):
        """Left-pad, repeat each prompt G times, sample. Returns (completions, logp, entropy)."""
        pad = self.tokenizer.pad_token_id
        rows = [ids for ids in prompt_ids for _ in range(group_size)]
        width = max(len(r) for r in rows)
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])       # (N, P)
        attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])    # (N, P)
        torch.manual_seed(int(sampling.get("seed", 0)))
        temperature = float(sampling.get("temperature", self.cfg.rollout.temperature))
        out = self.model.generate(
            input_ids=input_ids, attention_mask=attn, do_sample=True,
            temperature=temperature, top_p=float(sampling.get("top_p", self.cfg.rollout.top_p)),
            top_k=0, max_new_tokens=int(sampling.get("max_new_tokens",
                                                     self.cfg.rollout.max_new_tokens)),
            output_logits=True, return_dict_in_generate=True, pad_token_id=pad)
        gen = out.sequences[:, width:]                                               # (N, T)
        logits = torch.stack(out.logits, dim=1).float() / temperature                 # (N, T, V)
        logp_all = F.log_softmax(logits, dim=-1)                                      # (N, T, V)
        logp = logp_all.gather(-1, gen[..., None]).squeeze(-1)                        # (N, T)
        entropy = -(logp_all.exp() * logp_all).sum(-1)                                # (N, T)
        return gen, logp, entropy

    def _trim(self, gen, logp, entropy):
        """Cut each row after its first EOS (kept: the model must learn to stop)."""
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        comps, lps, ents, reasons = [], [], [], []
        for row, lp, ent in zip(gen.tolist(), logp, entropy):
            end = next((j + 1 for j, t in enumerate(row) if t in eos_ids), None)
            reasons.append("length" if end is None else "stop")
            end = end or len(row)
            comps.append(row[:end])
            lps.append(lp[:end].numpy().astype(np.float32))
            ents.append(ent[:end].numpy().astype(np.float32))
        return comps, lps, ents, reasons

    def generate(self, prompts: list[dict], group_size: int, sampling: dict) -> RolloutBatch:
        """G completions for each prompt {'question', 'answer', ...}, verified."""
        t0 = time.perf_counter()
        keep, skipped, prompt_ids = self._encode(prompts)
        comps, lps, ents, reasons = [], [], [], []
        if keep:
            gen, logp, entropy = self._sample(prompt_ids, group_size, sampling)
            comps, lps, ents, reasons = self._trim(gen, logp, entropy)
        return verified_batch(self, prompts, keep, prompt_ids, group_size,
                              (comps, lps, ents, reasons), skipped, t0,
                              psutil.Process().memory_info().rss / 2**30)

    def generate_steps(self, calls: list[tuple[list[dict], int, dict]]) -> list[RolloutBatch]:
        """One RolloutBatch per (prompts, G, sampling) call, generated one after another."""
        return [self.generate(*call) for call in calls]
