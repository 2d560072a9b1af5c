"""Ours' learner in TRL's loop: does ours' update learn as fast as TRL's when fed as TRL feeds it?

    python -m tools.compare.plain_loop                    # seeds 0 1 2, scored after 1, 2, 4 steps
    python -m tools.compare.plain_loop --order trl        # TRL's prompt order

One process, no Ray, no rollout actor, no weight push: each step the learner's own model
samples 2 prompts x G completions with transformers' `generate` (the cpu-demo preset's
temperature and length, on-policy), our reward scores them, ours' group advantages are taken
and ours' `Learner.train_on` (the cpu-demo preset) takes one update. That is TRL's
GRPOTrainer loop with generate, with ours' update in place of TRL's (the two are the same:
tools.compare.one_update). Prompts walk the training stream as ours' driver does
(`train_sample(0, 1, 2, ...)`) or, with `--order trl`, its first 4,000 in the order TRL's
sampler draws them for the same seed (tools.compare.time_to_accuracy gives TRL those 4,000).
After the steps in `--score-at` the policy is scored greedily on time_to_accuracy's held-out
set (arith-1-unseen, `--n` problems), so the gains per update compare with the
time_to_accuracy runs of both systems. Zero-spread steps are counted in the printout.
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
import torch

from common.models import load_tokenizer, resolve_model
from common.presets import get_preset
from common.types import TrainBatch
from launch.evaluate.saved_models import evaluate
from launch.evaluate.sets import heldout_sets
from learner.learner import Learner
from tasks.registry import make_task
from tools.compare.one_update import behaviour_logp, sample
from tools.compare.settings import machine_line
from tools.compare.time_to_accuracy import keep_rng
from tools.compare.tta_report import SET


def problem_order(seed: int, order: str, pool: int = 4000) -> list[int]:
    """Training-sample indices in the order a run takes them: ours' driver walks the stream,
    TRL's sampler shuffles the dataset (`pool` samples) with the run's seed."""
    if order == "trl":  # trl.trainer.utils.RepeatSampler's draw, seeded with the run's seed
        return torch.randperm(pool, generator=torch.Generator().manual_seed(seed)).tolist()
    return list(range(pool))


def score(model, tok, samples: list[dict], max_new_tokens: int, step: int) -> float:
    """Greedy accuracy of the live policy on `samples`; the training random streams untouched."""
    with keep_rng():
        model.eval()
        acc = evaluate(model, tok, samples, max_new_tokens, desc=f"eval@{step}")["accuracy"]
        model.train()
    return acc


def run(seed: int, order: str, steps: int, score_at: set[int], samples: list[dict],
        threads: int) -> dict:
    """One seed: per-step reward, reward spread and length, and the scores at `score_at`."""
    cfg = get_preset("cpu-demo")
    cfg.run.seed = seed
    tok = load_tokenizer(resolve_model(cfg.model.name))
    task = make_task("arith", 1, None, seed)
    idx = problem_order(seed, order)
    learner = Learner(cfg)  # seeds torch from cfg.run.seed (LoRA init, then sampling)
    torch.set_num_threads(threads)  # the preset's learner keeps to 1; this loop has the host
    b, out = cfg.rollout.prompts_per_step, {"steps": [], "acc": {}}
    for k in range(steps):
        problems = [task.train_sample(i) for i in idx[k * b: (k + 1) * b]]
        batch, rewards = sample(learner.model, tok, problems, cfg)
        old = behaviour_logp(learner.model, batch, cfg.rollout.temperature)
        ones = [np.ones(len(c), np.float32) for c in batch.completion_ids]  # rho 1: unused
        learner.train_on(TrainBatch(batch.prompt_ids, batch.completion_ids, old, ones,
                                    batch.advantages.astype(np.float32)))
        groups = rewards.reshape(b, -1)
        out["steps"].append((float(rewards.mean()), int((groups.std(1) > 0).sum()),
                             statistics.mean(map(len, batch.completion_ids))))
        if k + 1 in score_at:
            out["acc"][k + 1] = score(learner.model, tok, samples,
                                      cfg.rollout.max_new_tokens, k + 1)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--order", choices=("stream", "trl"), default="stream",
                    help="training prompts: ours' driver's walk (stream) or TRL's shuffle")
    ap.add_argument("--score-at", type=int, nargs="+", default=[1, 2, 4],
                    help="steps after which the policy is scored")
    ap.add_argument("--n", type=int, default=200, help="held-out problems")
    args = ap.parse_args(argv)
    threads = len(os.sched_getaffinity(0))
    print(machine_line(), flush=True)
    samples = heldout_sets(SET, args.n, None)[SET]
    for seed in args.seeds:
        res = run(seed, args.order, max(args.score_at), set(args.score_at), samples, threads)
        for k, (reward, spread, length) in enumerate(res["steps"], 1):
            acc = f"; accuracy {res['acc'][k]:.3f}" if k in res["acc"] else ""
            print(f"seed {seed} step {k}: mean reward {reward:.3f}, groups with spread "
                  f"{spread}, mean completion tokens {length:.1f}{acc}", flush=True)


if __name__ == "__main__":
    main()
