"""Held-out evaluation on a run's own rollout workers.

The demo scores the base model before training and the trained policy after it with the engine
that trains it (vLLM's CPU wheel in `cpu-demo`), already started and holding the weights: no
second engine, no model in the driver. Greedy completions are `RolloutCall`s at temperature 0,
pass@k samples calls of G = k at temperature 1, each split over the workers like a step's
prompts; the completions are scored by `launch.evaluate.scoring.score`, as `launch.evaluate`
scores its own. Between calls the learner is idle, so a CPU worker decodes on its cores too.

    before = evaluate_on_pool(trainer.pool, samples, max_new_tokens=40, k=8, sample_n=40)
"""

from __future__ import annotations

import sys
import time

import ray
from tqdm import tqdm

from common.types import RolloutBatch, Sampling
from launch.evaluate.scoring import score

CHUNK_ROWS = 64
"""completions per call: the progress bar moves once a call; bigger calls batch no better on a
CPU, where a prompt's prefill dominates"""
EVAL_STEP = -1
"""the step number eval calls carry (not a training step)"""


def complete_on_pool(pool, samples: list[dict], group: int, sampling: Sampling,
                     bar: tqdm | None = None) -> tuple[list[list[str]], list[list[int]]]:
    """(texts, token counts) of `group` completions per sample, in sample order. A prompt a
    worker refuses (empty, or over rollout.max_prompt_tokens) gets `group` empty completions,
    which score 0."""
    per_call = max(1, CHUNK_ROWS // group)
    chunks = [samples[s: s + per_call] for s in range(0, len(samples), per_call)]
    pending = [pool.submit(EVAL_STEP, chunk, seed=sampling.seed + i, group_size=group,
                           sampling=sampling) for i, chunk in enumerate(chunks)]
    texts: list[list[str]] = []
    lengths: list[list[int]] = []
    for chunk, work in zip(chunks, pending):
        batches: list[RolloutBatch] = ray.get(pool.collect(work).batches)  # shares in order
        for batch in batches:
            rows = _by_prompt(batch, group)
            texts += [[t for t, _ in row] for row in rows]
            lengths += [[n for _, n in row] for row in rows]
        if bar is not None:
            bar.update(len(chunk))
    return texts, lengths


def _by_prompt(batch: RolloutBatch, group: int) -> list[list[tuple[str, int]]]:
    """[(text, tokens without EOS)] x group for each prompt of the batch's call."""
    rows: list[list[tuple[str, int]]] = [[] for _ in range(batch.num_prompts)]
    for i, text, ids, why in zip(batch.prompt_index, batch.texts, batch.completion_ids,
                                 batch.finish_reasons):
        rows[i].append((text, len(ids) - (why == "stop")))
    return [row or [("", 0)] * group for row in rows]


def evaluate_on_pool(pool, samples: list[dict], max_new_tokens: int, desc: str = "eval",
                     k: int = 0, sample_n: int | None = None, seed: int = 0,
                     file=None) -> dict:
    """`launch.evaluate.evaluate`'s figures from the pool's workers at their current weights:
    greedy accuracy etc. over `samples`, and with k > 0 pass@1 / pass@k from k samples at
    temperature 1 for each of the first `sample_n` (all by default)."""
    t0 = time.perf_counter()
    sampled_set = samples[:sample_n] if k else []
    with tqdm(total=len(samples) + len(sampled_set), desc=desc, unit="q",
              file=file or sys.stderr) as bar:
        greedy = Sampling(seed=seed, temperature=0.0, max_new_tokens=max_new_tokens)
        texts, lengths = complete_on_pool(pool, samples, 1, greedy, bar)
        sampled = None
        if k:
            hot = Sampling(seed=seed + 1, temperature=1.0, max_new_tokens=max_new_tokens)
            sampled, _ = complete_on_pool(pool, sampled_set, k, hot, bar)
    return score(samples, [t[0] for t in texts], [n[0] for n in lengths],
                 time.perf_counter() - t0, sampled)
