"""Time to a target accuracy: TRL's GRPOTrainer vs homerl, the same model, task and reward.

    python -m tools.compare.time_to_accuracy  # 3 seeds per system (make bench-tta)
    python -m tools.compare.time_to_accuracy --seeds 0 --budget-s 300  # a quick look
    python -m tools.compare.time_to_accuracy --out runs/bench-tta --n 100 --gain 0.08
    python -m tools.compare.time_to_accuracy --systems ours \
        --ours-flags "--max-staleness 3 --steps-per-call 2"
    python -m tools.compare.time_to_accuracy --join runs/a runs/b --out runs/ab  # more seeds

Both systems train the embedded SmolLM2-135M-Instruct (fp32) with GRPO on level-1 arithmetic
(`make_task("arith", 1, None, seed)`), with our reward (correct + 0.5 x format score, the bonus
only after a line of working: `reward.format_needs_working`), and are scored greedily on the
same held-out split: `arith-1-unseen` (question templates training never sees), `--n` problems.
The target is the base model's accuracy on it plus `--gain` (8 points).

Ours: the `cpu-demo` preset as a user gets it (`launch.train --preset cpu-demo --seed S`: 2
prompts x G=8, 40 new tokens, temperature 0.8, LoRA r=16, lr 3e-4, every completion token in
the loss, 1 vLLM (CPU wheel) rollout worker + 1 learner, 1 thread each, max_staleness 1). TRL: its
GRPOConfig defaults (DAPO loss on all tokens, clip 0.2, beta 0, one update per generation, all
cores as torch threads), with ours' completions per update (2 prompts x G=8 = 16, not TRL's
default 8: both systems update on equal terms), learning rate (constant), G, LoRA, max new
tokens, temperature, reward and training problems, in the same order (its dataset unshuffled:
the problems are i.i.d. draws, and the seed pairs the two systems); gradient checkpointing off
and fp32 (its defaults trade compute for memory and assume bf16 hardware; this CPU has no AMX:
fp32 is its fast dtype); it
generates with vLLM's CPU engine (`use_vllm=True, vllm_mode="colocate"`) when vLLM is
installed, as ours does (`--trl-engine hf`: transformers' generate).

Clock: training wall time from each system's first step (model load and actor start-up are
reported apart). At the marks `MARKS` (seconds on that clock) the run pauses its clock, saves
the policy and scores it; ours first waits for the rollouts already in flight (`Trainer.drain`,
on the clock), so no work is done while paused. A run stops at the first mark at or above the
target, or at `--budget-s`. The time to target is interpolated linearly between the last mark
below the target and the first at or above it. Prints a line per (system, seed), then the
median (range) per system and, last, the ratio TRL / ours of the median times to target; writes
OUT/results.json and OUT/tta.png (accuracy vs training wall time, one line per seed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import sys
import tempfile
import time

import numpy as np
import torch

from actors.eval_worker import load_for_eval
from common.models import load_tokenizer, resolve_model
from common.presets import get_preset
from launch.cli import OneLineParser, parse_config
from launch.driver.trainer import Trainer
from launch.evaluate.saved_models import evaluate
from launch.evaluate.sets import heldout_sets
from rewards.shaping import combine, format_bonus
from rewards.verifiers.reference import verify
from tasks.prompts import format_prompt
from tasks.registry import make_task
from tools.compare.settings import (
    add_trl_engine,
    log,
    release_memory,
    start_ray,
    trl_generation,
    trl_trainer,
)
from tools.compare.tta_report import SET, finish, join_results, load, reached, save

MARKS = (15, 30, 45, 60, 75, 90, 105, 120, 150, 180, 240, 300, 400, 500, 600, 800, 1000, 1200,
         1500, 1800)
"""training-clock seconds at which a run is scored: every 15 s up to 2 min, where both systems
reach +20 points on this host (marks 30 s apart were as coarse as the differences)"""


@contextlib.contextmanager
def keep_rng():
    """Torch's, numpy's and Python's global random states as they were before the block.
    Scoring loads an adapter (peft initialises its LoRA layers from torch's generator first):
    without this, TRL, which samples from that generator in this process, would follow another
    random stream after every mark, so its runs would depend on where the marks fall."""
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])


class Scorer:
    """Scores saved policies on the held-out set; keeps the curve and says when to stop."""

    def __init__(self, samples: list[dict], target: float, budget_s: float,
                 max_new_tokens: int):
        self.samples, self.target, self.budget_s = samples, target, budget_s
        self.max_new_tokens, self.curve, self.eval_s = max_new_tokens, [], 0.0
        self.marks = [m for m in MARKS if m < budget_s] + [budget_s]

    def due(self, clock_s: float) -> bool:
        return bool(self.marks) and clock_s >= self.marks[0]

    def score(self, path: str, clock_s: float, step: int) -> bool:
        """Score the policy saved at `path`; True when the run should stop."""
        t0 = time.perf_counter()
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        with keep_rng():
            model, tok = load_for_eval(path, torch.float32)
            acc = evaluate(model, tok, self.samples, self.max_new_tokens,
                           desc=f"eval@{step}")["accuracy"]
        del model
        self.eval_s += time.perf_counter() - t0
        log(f"  {clock_s:.0f} s, step {step}: accuracy {acc:.3f} (target {self.target:.3f})")
        return self.record(clock_s, step, acc)

    def record(self, clock_s: float, step: int, acc: float) -> bool:
        """Keep a point of the curve, use up the marks it passed; True when the run should
        stop (the target is reached, or no mark is left: the budget is spent)."""
        self.curve.append((clock_s, step, acc))
        while self.marks and clock_s >= self.marks[0]:
            self.marks.pop(0)
        return reached(acc, self.target) or not self.marks


# ---- ours -------------------------------------------------------------------------------------
def ours_config(flags: str):
    """The cpu-demo preset with `launch.train` flags applied (`--max-staleness 3`); a bad
    flag is launch.train's own one-line error (exit 2)."""
    return parse_config(["--preset", "cpu-demo", *shlex.split(flags)],
                        prog="tools.compare.time_to_accuracy --ours-flags")[0]


def run_ours(seed: int, scorer: Scorer, work: str, flags: str = "") -> dict:
    """The cpu-demo preset (with `flags`) on a local Ray cluster, its driver stepped here."""
    import ray

    cfg = ours_config(flags)
    cfg.run.seed, cfg.run.steps, cfg.run.checkpoint_every = seed, 10_000, 0
    run_dir = os.path.join(work, f"ours-{seed}")
    started = start_ray(cfg.rollout.learner_threads
                        + cfg.rollout.num_workers * cfg.rollout.threads_per_worker)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, run_dir)
    # the actors built (imports, model load): start-up is off the clock, like TRL's model load
    trainer.learner_alive(timeout_s=600.0)
    trainer.pool.worker_pids()
    setup_s, clock, k = time.perf_counter() - t0, 0.0, 0
    try:
        while True:
            t0 = time.perf_counter()
            trainer.step(k)
            k += 1
            if scorer.due(clock + time.perf_counter() - t0):
                trainer.drain()  # on the clock: the rollouts in flight finish first
                clock += time.perf_counter() - t0
                path = ray.get(trainer.learner.save_final.remote(
                    os.path.join(run_dir, f"step-{k}")))
                if scorer.score(path, clock, k):
                    break
            else:
                clock += time.perf_counter() - t0
    finally:
        trainer.shutdown()
        if started:
            ray.shutdown()
    return {"setup_s": setup_s, "steps": k, "clock_s": clock}


# ---- TRL --------------------------------------------------------------------------------------
def trl_reward(format_weight: float):
    """Our reward, as ours computes it for the cpu-demo preset (actors/rollout_batch.py)."""
    def homerl_reward(prompts, completions, answer, **kwargs):
        results = [verify(c, a) for c, a in zip(completions, answer)]
        bonus = format_bonus(np.array([r.format_score for r in results]), completions, True)
        return combine(np.array([r.score for r in results]), bonus, format_weight).tolist()
    return homerl_reward


def trl_args(demo, out_dir: str, seed: int, engine: str = "hf"):
    """TRL's GRPOConfig for the race: its defaults, with ours' completions per update, G,
    lengths, temperature and learning rate (the module docstring); `engine`: its generation
    (settings.trl_generation)."""
    import trl

    r, g = demo.rollout, demo.grpo
    return trl.GRPOConfig(
        **trl_generation(engine),
        output_dir=out_dir, use_cpu=True, bf16=False, gradient_checkpointing=False,
        num_generations=r.group_size, max_completion_length=r.max_new_tokens,
        # equal terms: TRL updates on ours' completions per update (prompts x G), not its 8
        per_device_train_batch_size=r.prompts_per_step * r.group_size,
        gradient_accumulation_steps=1,
        temperature=r.temperature, learning_rate=g.lr, lr_scheduler_type="constant",
        # ours' problem order (train_sample(0, 1, ...), i.i.d. draws): seed for seed both train
        # on the same problems, which sway a step's gain more than anything else measured
        shuffle_dataset=False, max_steps=100_000, save_strategy="no", report_to="none",
        seed=seed, disable_tqdm=True, logging_steps=10)


def run_trl(seed: int, scorer: Scorer, work: str, engine: str) -> dict:
    """TRL's GRPOTrainer in this process, paused by a callback at the marks."""
    from transformers import TrainerCallback

    demo = get_preset("cpu-demo")
    out_dir = os.path.join(work, f"trl-{seed}")
    path = resolve_model(demo.model.name)

    class Clock(TrainerCallback):
        def __init__(self):
            self.clock, self.t0, self.steps = 0.0, None, 0

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.clock += time.perf_counter() - self.t0
            self.steps = state.global_step
            if scorer.due(self.clock):
                ckpt = os.path.join(out_dir, f"step-{state.global_step}")
                model.save_pretrained(ckpt)
                with open(os.path.join(ckpt, "homerl.json"), "w") as f:
                    json.dump({"base_model": path, "kind": "adapter", "lora_mode": "lora"}, f)
                if scorer.score(ckpt, self.clock, state.global_step):
                    control.should_training_stop = True

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    t0 = time.perf_counter()
    tok = load_tokenizer(path)
    task = make_task("arith", 1, None, seed)
    rows = [{"prompt": format_prompt(tok, p["question"]), "answer": p["answer"]}
            for p in (task.train_sample(i) for i in range(4000))]
    clock = Clock()
    trainer = trl_trainer(path, tok, rows, trl_reward(demo.rollout.format_weight),
                          trl_args(demo, out_dir, seed, engine), demo.lora.r, demo.lora.alpha,
                          clock)
    setup_s = time.perf_counter() - t0
    trainer.train()
    del trainer
    return {"setup_s": setup_s, "steps": clock.steps, "clock_s": clock.clock}


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineParser(prog="tools.compare.time_to_accuracy", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--systems", default="ours,trl", choices=["ours,trl", "trl,ours", "ours",
                                                              "trl"])
    p.add_argument("--n", type=int, default=200, help="held-out problems")
    add_trl_engine(p)
    p.add_argument("--gain", type=float, default=0.08, help="target = base accuracy + gain")
    p.add_argument("--budget-s", type=float, default=600.0,
                   help="training seconds per run before it gives up")
    p.add_argument("--out", default="runs/bench-tta", help="results.json and tta.png")
    p.add_argument("--ours-flags", default="", metavar="FLAGS",
                   help="launch.train flags on top of the cpu-demo preset for ours, one string: "
                        "\"--grpo.entropy_rho 1.0\"")
    p.add_argument("--report", action="store_true",
                   help="no training: report and plot OUT/results.json again")
    p.add_argument("--join", nargs="+", default=None, metavar="DIR",
                   help="no training: the runs of several earlier OUTs (same settings, other "
                        "seeds) into OUT/results.json, then --report")
    args = p.parse_args(argv)
    if args.n < 1 or args.budget_s <= 0 or not 0 < args.gain < 1:
        p.error("--n must be >= 1, --budget-s > 0 and --gain in (0, 1)")
    ours_config(args.ours_flags)  # a bad flag fails here, before any training
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.join or args.report:
        try:
            saved = join_results([load(d) for d in args.join]) if args.join else load(args.out)
        except ValueError as e:
            sys.exit(f"tools.compare.time_to_accuracy: {e}")
        for key in ("seeds", "n", "gain", "budget_s", "ours_flags"):
            setattr(args, key, saved["args"].get(key, ""))
        args.trl_engine = saved["args"].get("trl_engine", "hf")
        # finish writes OUT/results.json: with --join, the joined runs
        print("\n".join(finish(args, saved["base"], saved["target"], saved["runs"])))
        return 0
    demo = get_preset("cpu-demo")
    samples = heldout_sets(SET, args.n, None)[SET]
    base = Scorer(samples, 0.0, 1.0, demo.rollout.max_new_tokens)
    base.score(demo.model.name, 0.0, 0)
    base_acc = base.curve[0][2]
    target = base_acc + args.gain
    runs = []
    with tempfile.TemporaryDirectory(prefix="homerl-tta-") as work:
        for seed in args.seeds:
            for system in args.systems.split(","):
                log(f"{system} seed {seed} ...")
                scorer = Scorer(samples, target, args.budget_s, demo.rollout.max_new_tokens)
                run = (run_ours(seed, scorer, work, args.ours_flags) if system == "ours"
                       else run_trl(seed, scorer, work, args.trl_engine))
                runs.append({"system": system, "seed": seed, **run, "curve": scorer.curve,
                             "eval_s": scorer.eval_s})
                release_memory()
                save(args, base_acc, target, runs)  # an interrupted bench keeps its runs
    lines = finish(args, base_acc, target, runs)
    sys.stderr.flush()
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
