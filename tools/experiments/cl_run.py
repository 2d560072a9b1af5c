"""One arm of the continual-learning experiment (`tools.experiments.forgetting`): train the
curriculum on the real driver, save the policy after each stage and score it greedily on every
stage's held-out set; a seed's arms can share one stage 1 (`Stem`)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time

import ray

from common import metrics as M
from launch.driver.trainer import Trainer
from launch.evaluate.saved_models import score_saved
from launch.rundir.checkpoints import list_checkpoints

METRICS = ("tagged_accuracy", "strict_accuracy", "accuracy")  # what `scores` keeps, with
SCORES = (*METRICS, "tag_rate", "format_rate")                     # the rates behind them


def scores(model_path: str, sets: dict, max_new_tokens: int) -> dict:
    """{set: {SCORES}} of a saved policy, greedy."""
    return score_saved(model_path, sets, max_new_tokens, SCORES)


@dataclasses.dataclass
class Stem:
    """A seed's stage 1, trained once by its first arm and shared by the others: every arm
    trains stage 1 alike (replay, EWC and anchor-KL act from stage 2 on), so the arms branch
    from one checkpoint at its end (paired: they differ only in what follows)."""

    method: str     # the arm that trained it
    run_dir: str    # holds its checkpoint at the end of stage 1 and the rows before it
    after: dict     # its scores after stage 1
    wall_s: float   # stage 1's training and scoring


def branch(stem: Stem, run_dir: str) -> None:
    """`run_dir` (empty) starts as the stem: its stage-1 checkpoint and its rows (those past
    the checkpoint are cut when the trainer resumes from it)."""
    os.makedirs(run_dir)
    ckpt = list_checkpoints(stem.run_dir)[0]
    shutil.copytree(ckpt, os.path.join(run_dir, os.path.basename(ckpt)))
    for name in ("metrics.jsonl", "samples.jsonl"):
        if os.path.exists(os.path.join(stem.run_dir, name)):
            shutil.copy(os.path.join(stem.run_dir, name), run_dir)


def run_method(cfg, run_dir: str, sets: dict, stem: Stem | None = None,
               save_stem: bool = False) -> dict:
    """Train the curriculum (from `stem`'s stage 1 when given); the scores after each stage,
    wall time (a branch's includes the stem's stage 1), peak memory. `save_stem`: checkpoint
    the end of stage 1 for the seed's other arms."""
    if stem is not None:
        branch(stem, run_dir)
    trainer, t0 = Trainer(cfg, run_dir, resume=stem is not None), time.perf_counter()
    after, stage1_s = ([stem.after] if stem else []), (stem.wall_s if stem else None)
    try:
        # the stem's rollout in flight drew its prompts with the stem's replay: this arm
        # draws and generates its own, from the stage-1 weights
        trainer.pending.clear()
        stages = trainer.curriculum.stages
        ends = [sum(s.steps for s in stages[: i + 1]) for i in range(len(stages))]
        for k in range(trainer.start, cfg.run.steps):
            trainer.step(k)
            if k + 1 in ends:
                path = ray.get(trainer.learner.save_final.remote(
                    os.path.join(run_dir, f"after-stage-{ends.index(k + 1) + 1}")))
                after.append(scores(path, sets, cfg.rollout.max_new_tokens))
            if k + 1 == ends[0] and save_stem:
                trainer.checkpoint(k + 1)
                stage1_s = time.perf_counter() - t0
        trainer.finish(time.perf_counter() - t0)
        rows = trainer.writer.metrics()
    finally:
        trainer.shutdown()
    own_s = time.perf_counter() - t0
    return {"after": after, "wall_s": own_s + (stem.wall_s if stem else 0.0),
            "stage1_s": stage1_s, "stage1_from": stem.method if stem else None,
            "peak_pss_gb": max((r.get(M.PEAK_PSS_GB, 0.0) for r in rows), default=0.0)}
