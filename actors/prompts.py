"""What the rollout workers share around their engines: prompt encoding (chat format, tokenize,
refuse, never truncate) and turning sampled tokens into a verified `RolloutBatch`: rewarded by
the sample's verifier and the format bonus, or with `reward.fn` by the reward functions alone
(`rewards.fnbatch`)."""

from __future__ import annotations

import time

import numpy as np

from common.memory import Footprint, footprint
from common.types import RolloutBatch
from rewards import prompt_text
from rewards.fnbatch import FnScores, verify_samples
from rewards.shaping import combine, format_bonus
from rewards.userfns import TrainerState
from rewards.working import working_valid


def encode_prompts(tokenizer, prompts: list[dict], limit: int):
    """(kept indices, skipped [{index, id, reason}], token ids of the kept prompts).

    Empty questions and prompts longer than `limit` tokens are refused with a counted reason:
    a truncated prompt would be a different question with the same reference answer.
    """
    keep, skipped, ids = [], [], []
    for i, p in enumerate(prompts):
        text = prompt_text(tokenizer, p)  # chat template, system message, instruction
        toks = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not p["question"].strip():
            skipped.append({"index": i, "id": p.get("id"), "reason": "empty_prompt"})
        elif len(toks) > limit:
            skipped.append({"index": i, "id": p.get("id"), "reason": "prompt_too_long",
                            "tokens": len(toks)})
        else:
            keep.append(i)
            ids.append(toks)
    return keep, skipped, ids


def worker_memory(worker) -> tuple[Footprint, Footprint]:
    """(the worker process's footprint with its children, its verifier process's footprint).
    A worker in the learner's process (one-copy mode) reports none of its own: the learner's
    footprint counts that process once."""
    pid = worker.verifier.pid
    verifier = footprint(pid, children=False) if pid else Footprint()
    if getattr(worker, "learners_process", False):
        return Footprint(), verifier
    return footprint(), verifier


def format_gated(reward_cfg, version: int) -> bool:
    """Does the format bonus count only for right answers for samples of this policy version?"""
    return reward_cfg.format_if_correct or version < reward_cfg.format_gate_steps


def verifier_rewards(worker, samples: list[dict], texts: list[str]) -> tuple[list, np.ndarray]:
    """(N,) each completion's verifier result and (N,) reward: correct + the format bonus."""
    styles = [s.get("style") for s in samples]
    checks = [s.get("verifier") for s in samples]  # None: numeric
    results = worker.verifier.score(texts, [s["answer"] for s in samples],
                                    timeout_s=worker.cfg.rollout.reward_timeout_s, styles=styles,
                                    verifiers=checks)
    correct = np.array([r.score for r in results], dtype=np.float32)              # (N,)
    fmt = np.array([r.format_score for r in results], dtype=np.float32)           # (N,)
    bonus = format_bonus(fmt, texts, worker.cfg.reward.format_needs_working,  # metrics keep
                         worker.cfg.reward.other_tag_bonus, styles, checks,     # fmt
                         [s.get("question") for s in samples])
    return results, combine(correct, bonus, worker.cfg.rollout.format_weight,
                            format_gated(worker.cfg.reward, worker.version))


def fn_rewards(worker, samples: list[dict], texts: list[str],
               comps: list) -> tuple[list, FnScores]:
    """reward.fn: (N,) each completion's verifier result (for the metrics; none without a
    reference) and the reward functions' scores of the call."""
    timeout_s = worker.cfg.rollout.reward_timeout_s
    results = verify_samples(worker.verifier, samples, texts, timeout_s)
    state = TrainerState(global_step=worker.version, max_steps=worker.cfg.run.steps)
    return results, worker.reward_fns.score(worker.verifier, samples, texts, comps, results,
                                            state, timeout_s)


def verified_batch(worker, prompts: list[dict], keep: list[int], prompt_ids: list[list[int]],
                   group_size: int, sampled: tuple, skipped: list[dict], t0: float,
                   memory: tuple[Footprint, Footprint]) -> RolloutBatch:
    """Decode and verify G completions per kept prompt; the worker's RolloutBatch.

    worker: the calling rollout worker (its tokenizer, verifier, cfg, version, name, and
    `load_s`: its weight load since the last batch, reported here once and reset;
    `reward_fns`: its `rewards.fnbatch.RewardFns`, None without reward.fn).
    sampled: (completion ids, behaviour log-probs, entropies, finish reasons), one row per
    completion, prompt-major (row r belongs to kept prompt r // G).
    memory: (the worker's footprint, its verifier's), from `worker_memory`.
    """
    comps, lps, ents, reasons = sampled
    load_s, worker.load_s = worker.load_s, 0.0  # the first batch after a load reports it
    texts = worker.tokenizer.batch_decode(comps, skip_special_tokens=True) if comps else []
    index = [i for i in keep for _ in range(group_size)]
    samples = [prompts[i] for i in index]
    fns = None
    if getattr(worker, "reward_fns", None) is not None:
        results, fns = fn_rewards(worker, samples, texts, comps)
        rewards = fns.rewards
    else:
        results, rewards = verifier_rewards(worker, samples, texts)
    numeric = [s.get("verifier") in (None, "numeric") for s in samples]
    return RolloutBatch(
        prompt_ids=[prompt_ids[keep.index(i)] for i in index], completion_ids=comps,
        logprobs=lps, entropy=ents, finish_reasons=reasons, texts=texts, prompt_index=index,
        correct=np.array([r.score for r in results], dtype=np.float32),
        format_score=np.array([r.format_score for r in results], dtype=np.float32),
        rewards=rewards, reward_errors=[r.error for r in results],
        answers=[r.parsed for r in results], version=worker.version, num_prompts=len(prompts),
        gen_time_s=time.perf_counter() - t0, load_s=load_s, worker=worker.name, memory=memory[0],
        verifier_memory=memory[1], skipped=skipped,
        fn_scores=fns.per_fn if fns else {}, fn_errors=fns.errors if fns else {},
        working_valid=[float(working_valid(t, s.get("question"))) if num else float("nan")
                       for t, s, num in zip(texts, samples, numeric)],
        fn_logged=fns.logged if fns else {})
