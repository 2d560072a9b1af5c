"""Turning what an engine sampled into a verified `RolloutBatch`, for both rollout workers.

    batch = verified_batch(prompts, encoded, G, sampled, scorer, origin)

The completions are decoded and scored in the worker's verifier process: by the sample's
verifier plus the format bonus (rewards/shaping.py), or with `reward.fn` by the reward
functions alone (rewards/fnbatch.py). The inputs are small types: `Sampled` (the engine's
rows), `Scorer` (how this worker rewards) and `Origin` (who sampled, when, at what cost).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from actors.prompts import EncodedPrompts
from common.memory import Footprint, footprint
from common.types import RolloutBatch
from rewards.fnbatch import FnScores, RewardFns, verify_samples
from rewards.sandbox.pool import VerifierPool
from rewards.shaping import combine, format_bonus
from rewards.userfns import TrainerState
from rewards.working import working_valid


@dataclass(frozen=True)
class Sampled:
    """What the engine sampled for one call: one row per completion, prompt-major (row r
    belongs to kept prompt r // G)."""

    completion_ids: list[list[int]]
    logprobs: list[np.ndarray]
    """behaviour log-probs of the sampled tokens"""
    entropy: list[np.ndarray]
    finish_reasons: list[str]
    """'stop' (an EOS) or 'length'"""


@dataclass(frozen=True)
class Scorer:
    """How a worker rewards its samples."""

    tokenizer: object
    """decodes the completions"""
    verifier: VerifierPool
    """its verifier process"""
    reward_fns: RewardFns | None
    """reward.fn's functions, None without reward.fn"""
    cfg: object
    """the run's Config (rollout timeouts and weights, reward settings, run.steps)"""
    version: int
    """the policy version the samples come from"""


@dataclass(frozen=True)
class Origin:
    """Where and when a batch was sampled."""

    worker: str
    started: float
    """time.perf_counter() when the call began"""
    load_s: float
    """the worker's weight loads since its last batch (reported with this one)"""
    memory: Footprint
    """the worker process's footprint"""
    verifier_memory: Footprint


def worker_memory(verifier: VerifierPool, own_process: bool = True
                  ) -> tuple[Footprint, Footprint]:
    """(this worker process's footprint with its children, its verifier process's). A worker
    in the learner's process (one-copy mode: `own_process` False) reports none of its own:
    the learner's footprint counts that process once."""
    pid = verifier.pid
    theirs = footprint(pid, children=False) if pid else Footprint()
    return (footprint() if own_process else Footprint()), theirs


def format_gated(reward_cfg, version: int) -> bool:
    """Does the format bonus count only for right answers for samples of this policy version?"""
    return reward_cfg.format_if_correct or version < reward_cfg.format_gate_steps


def verifier_rewards(scorer: Scorer, samples: list[dict], texts: list[str]
                     ) -> tuple[list, np.ndarray]:
    """(N,) each completion's verifier result and (N,) reward: correct + the format bonus."""
    cfg = scorer.cfg
    styles = [s.get("style") for s in samples]
    checks = [s.get("verifier") for s in samples]  # None: numeric
    results = scorer.verifier.score(texts, [s["answer"] for s in samples],
                                    timeout_s=cfg.rollout.reward_timeout_s, styles=styles,
                                    verifiers=checks)
    correct = np.array([r.score for r in results], dtype=np.float32)              # (N,)
    fmt = np.array([r.format_score for r in results], dtype=np.float32)           # (N,)
    bonus = format_bonus(fmt, texts, cfg.reward.format_needs_working,  # the metrics keep fmt
                         cfg.reward.other_tag_bonus, styles, checks,
                         [s.get("question") for s in samples])
    return results, combine(correct, bonus, cfg.rollout.format_weight,
                            format_gated(cfg.reward, scorer.version))


def fn_rewards(scorer: Scorer, samples: list[dict], texts: list[str],
               comps: list) -> tuple[list, FnScores]:
    """reward.fn: (N,) each completion's verifier result (for the metrics; none without a
    reference) and the reward functions' scores of the call."""
    timeout_s = scorer.cfg.rollout.reward_timeout_s
    results = verify_samples(scorer.verifier, samples, texts, timeout_s)
    state = TrainerState(global_step=scorer.version, max_steps=scorer.cfg.run.steps)
    return results, scorer.reward_fns.score(scorer.verifier, samples, texts, comps, results,
                                            state, timeout_s)


def verified_batch(prompts: list[dict], encoded: EncodedPrompts, group_size: int,
                   sampled: Sampled, scorer: Scorer, origin: Origin) -> RolloutBatch:
    """Decode and verify G completions per kept prompt of a call; the call's RolloutBatch."""
    comps = sampled.completion_ids
    texts = scorer.tokenizer.batch_decode(comps, skip_special_tokens=True) if comps else []
    index = [i for i in encoded.keep for _ in range(group_size)]
    samples = [prompts[i] for i in index]
    fns, t_score = None, time.perf_counter()
    if scorer.reward_fns is not None:
        results, fns = fn_rewards(scorer, samples, texts, comps)
        rewards = fns.rewards
    else:
        results, rewards = verifier_rewards(scorer, samples, texts)
    score_s = time.perf_counter() - t_score
    numeric = [s.get("verifier") in (None, "numeric") for s in samples]
    return RolloutBatch(
        prompt_ids=[encoded.ids[encoded.keep.index(i)] for i in index], completion_ids=comps,
        logprobs=sampled.logprobs, entropy=sampled.entropy,
        finish_reasons=sampled.finish_reasons, texts=texts, prompt_index=index,
        correct=np.array([r.score for r in results], dtype=np.float32),
        format_score=np.array([r.format_score for r in results], dtype=np.float32),
        rewards=rewards, reward_errors=[r.error for r in results],
        answers=[r.parsed for r in results], version=scorer.version,
        num_prompts=len(prompts), gen_time_s=time.perf_counter() - origin.started,
        score_s=score_s,
        load_s=origin.load_s, worker=origin.worker, memory=origin.memory,
        verifier_memory=origin.verifier_memory, skipped=encoded.skipped,
        fn_scores=fns.per_fn if fns else {}, fn_errors=fns.errors if fns else {},
        working_valid=[float(working_valid(t, s.get("question"))) if num else float("nan")
                       for t, s, num in zip(texts, samples, numeric)],
        fn_logged=fns.logged if fns else {})
