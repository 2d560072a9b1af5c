"""SENT ordering of a stage's training prompts, computed on the rollout workers and cached.

For each of the first `curriculum.sent_pool` training prompts of a stage the workers sample
M = `curriculum.sent_samples` completions at temperature 1; the prompt's difficulty is the
entropy of its answer clusters (rewards/sent.py). The order (easy -> hard) is cached under
`~/.cache/homerl/sent/` keyed by model, task, level, data file, seed, M and pool size (a file
stage's key also holds its path and the curriculum's field mapping, verifier and prompts).

    python -m launch.train --preset cpu-demo --curriculum.sent true
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from tqdm import tqdm

from common.models import cache_dir
from common.types import Sampling
from rewards.sent import answer_entropy, sent_order

CHUNK = 8
"""prompts per fan-out call (spread over the workers)"""


def cache_key(cfg, stage) -> str:
    c = cfg.curriculum
    parts = [cfg.model.name, stage.task, str(stage.level), c.data_path, str(cfg.run.seed),
             str(c.sent_samples), str(c.sent_pool)]
    if stage.task == "file":  # what the prompts are made of
        parts += [stage.data_path or c.data_path, c.prompt_field, c.answer_field, c.verifier,
                  c.system_prompt, c.instruction, c.heldout_path, str(c.heldout_size),
                  str(c.heldout_seed), stage.style]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def stage_order(pool, task, cfg, stage) -> tuple[list[int], bool]:
    """(training-sample indices sorted easy -> hard, whether it came from the cache)."""
    path = os.path.join(cache_dir(), "sent", f"{cache_key(cfg, stage)}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["order"], True
    n, m = cfg.curriculum.sent_pool, cfg.curriculum.sent_samples
    samples = [task.train_sample(i) for i in range(n)]
    entropies: list[float] = []
    desc = f"SENT {stage.task}-{stage.level}"
    for s in tqdm(range(0, n, CHUNK), desc=desc, unit="chunk", file=sys.stdout):
        chunk = samples[s: s + CHUNK]
        pending = pool.submit(-1, chunk, seed=cfg.run.seed * 7919 + s, group_size=m,
                              sampling=Sampling(temperature=1.0))
        summary = pool.collect(pending).summary  # the batches are never fetched
        by_prompt: dict[int, list] = {i: [] for i in range(len(chunk))}
        for i, ans in zip(summary.prompt_index, summary.answers):
            by_prompt[i].append(ans)
        # A prompt the worker refused (too long) is hardest: it never gets picked early.
        entropies += [answer_entropy(a) if a else float("inf") for a in by_prompt.values()]
    order = sent_order(entropies)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"order": order, "entropies": [entropies[i] for i in order]}, f)
    os.replace(tmp, path)
    return order, False
