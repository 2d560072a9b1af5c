"""Run one example end to end: write its data, score the base model on the held-out prompts,
train, score the trained policy on the same prompts, print and save both.

    python examples/plurals/run.py --seed 0 --run-dir /tmp/plurals-0
    python examples/code/run.py --seed 0 --run-dir /tmp/code-0 --samples 8

Like `launch.demo`, but greedy only unless `--samples K` (on a busy 2-core host the demo's
40 x 8 sampled completions cost more than the greedy pass), and it writes
RUN_DIR/example.json. Both scores come from the run's own rollout worker (vLLM's CPU engine in
cpu-demo) with the held-out split and verifier the run trains with; `launch.evaluate --task
file` scores the same split with transformers (README.md of each example).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path

from launch.cli import parse_config
from launch.demo import demo_sets
from launch.driver.trainer import Trainer
from launch.evaluate.on_workers import evaluate_on_pool
from launch.rundir.writer import default_run_dir

KEYS = ("accuracy", "strict_accuracy", "format_rate", "mean_completion_tokens")


def _flags(parser) -> None:
    parser.add_argument("--samples", type=int, default=0,
                        help="also K completions per held-out prompt at temperature 1: "
                             "pass@1 and pass@K (0: greedy only)")
    parser.add_argument("--no-base", action="store_true",
                        help="skip scoring the base model (it is the same for every seed)")


def _score(trainer, sets: dict, cfg, k: int, tag: str) -> dict:
    return {name: evaluate_on_pool(trainer.pool, samples, cfg.rollout.max_new_tokens,
                                   f"{tag} {name}", k=k, seed=cfg.run.seed)
            for name, samples in sets.items()}


def _line(name: str, before: dict, after: dict) -> str:
    """One set's figures, base -> trained (trained -> trained with --no-base)."""
    cells = "  ".join(f"{key} {before[key]:.3f} -> {after[key]:.3f}" for key in KEYS
                      if key != "mean_completion_tokens")
    extra = "".join(f"  {key} {before[key]:.3f} -> {after[key]:.3f}" for key in before
                    if key.startswith("pass@"))
    return f"{name} (n={before['n']}): {cells}{extra}"


def run(flags: list[str], argv: list[str]) -> int:
    """Train with the example's `flags` plus the user's `argv`; the latter win."""
    t0 = time.perf_counter()
    cfg, args = parse_config(flags + argv, prog=os.path.basename(sys.argv[0]), extra=_flags)
    run_dir = cfg.run.run_dir or default_run_dir()
    sets = demo_sets(cfg)
    trainer = Trainer(cfg, run_dir)
    try:
        before = None if args.no_base else _score(trainer, sets, cfg, args.samples, "base")
        if before:  # shown now: the base score does not wait for training
            print("base: " + json.dumps({n: {k: r[k] for k in KEYS} for n, r in before.items()}),
                  flush=True)
        t_train = time.perf_counter()
        summary = trainer.run()
        train_s = time.perf_counter() - t_train
        after = _score(trainer, sets, cfg, args.samples, "trained")
    finally:
        trainer.shutdown()
    result = {"before": before, "after": after, "steps": summary["steps"],
              "train_min": train_s / 60, "s_per_step_median": summary["s_per_step_median"],
              "seed": cfg.run.seed, "wall_min": (time.perf_counter() - t0) / 60}
    with open(os.path.join(run_dir, "example.json"), "w") as f:
        json.dump(result, f, indent=2)
    for name in sets:
        print(_line(name, (before or after)[name], after[name]))
    print(f"training: {summary['steps']} steps in {train_s / 60:.1f} min; "
          f"run directory {run_dir} (example.json, metrics.jsonl, samples.jsonl, final/)")
    return 0


def example_main(here: Path, flags: list[str], argv: list[str]) -> int:
    """An example's command: write its data into `here`/data (its own make_data.py), then
    `run` from the repository root, where its reward module imports as
    examples.<name>.rewards, on its file task with the cpu-demo preset plus `flags`."""
    data = here / "data"
    os.chdir(here.parents[1])
    importlib.import_module(f"examples.{here.name}.make_data").main([str(data)])
    task = ["--preset", "cpu-demo", "--curriculum.task", "file",
            "--curriculum.data_path", str(data / "train.jsonl"),
            "--curriculum.heldout_path", str(data / "heldout.jsonl")]
    return run(task + flags, argv)
