"""`make demo`: evaluate the embedded model, train it with GRPO, evaluate again, compare.

    python -m launch.demo                       # cpu-demo preset, ~15-25 min on 2 cores
    python -m launch.demo --preset tiny --steps 4

Held-out level-1 arithmetic problems never appear in training (rewards/tasks.py). Accuracy is
the verifier's score (right final number, any extraction rule); `strict` also needs the asked
`Answer: N` final line; `format` is the share of completions in that format.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from common.models import resolve_model
from launch import run_io
from launch.cli import parse_config
from launch.evaluate import evaluate, load_for_eval
from launch.train import Trainer
from rewards import make_task


def _eval(model_path: str, samples: list[dict], cfg, desc: str) -> dict:
    model, tok = load_for_eval(model_path, torch.float32)
    return evaluate(model, tok, samples, max_new_tokens=cfg.rollout.max_new_tokens, desc=desc)


def _table(before: dict, after: dict) -> str:
    rows = [("accuracy", "accuracy"), ("strict accuracy", "strict_accuracy"),
            ("format rate", "format_rate"), ("mean tokens", "mean_completion_tokens")]
    lines = [f"{'held-out level-1 arithmetic':<28}{'base':>10}{'trained':>10}{'change':>10}"]
    for label, key in rows:
        b, a = before[key], after[key]
        if key == "mean_completion_tokens":
            lines.append(f"{label:<28}{b:>10.1f}{a:>10.1f}{a - b:>+10.1f}")
        else:
            lines.append(f"{label:<28}{b:>10.1%}{a:>10.1%}{(a - b) * 100:>+9.1f}p")
    lines.append(f"{'problems':<28}{before['n']:>10}{after['n']:>10}")
    return "\n".join(lines)


def main(argv=None) -> int:
    t0 = time.perf_counter()
    cfg, _ = parse_config(argv, prog="launch.demo")
    run_dir = cfg.run.run_dir or run_io.default_run_dir()
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"[1/4] model {cfg.model.name}: {resolve_model(cfg.model.name)}", flush=True)
    samples = make_task(cfg.curriculum.task, cfg.curriculum.level,
                        cfg.curriculum.data_path or None).heldout(cfg.run.eval_n)
    print(f"[2/4] evaluating the base model on {len(samples)} held-out problems", flush=True)
    before = _eval(resolve_model(cfg.model.name), samples, cfg, "eval base")
    print(f"      accuracy {before['accuracy']:.1%}, format {before['format_rate']:.1%}")
    print(f"[3/4] training preset {cfg.preset} for {cfg.run.steps} steps -> {run_dir}", flush=True)
    trainer = Trainer(cfg, run_dir)
    try:
        summary = trainer.run()
    finally:
        trainer.shutdown()
    torch.set_num_threads(os.cpu_count() or 1)
    print("[4/4] evaluating the trained model", flush=True)
    after = _eval(summary["final"], samples, cfg, "eval trained")
    result = {"before": before, "after": after, "train": summary,
              "wall_s": time.perf_counter() - t0}
    with open(os.path.join(run_dir, "demo.json"), "w") as f:
        json.dump(result, f, indent=2)
    print()
    print(_table(before, after))
    print(f"\ntraining: {summary['steps']} steps, median {summary['s_per_step_median']:.1f} s/step;"
          f" demo wall time {result['wall_s'] / 60:.1f} min")
    print(f"run directory: {run_dir}  (metrics.jsonl, samples.jsonl, curves.png, final/)")
    for ex in after["examples"][:2]:
        print(f"  Q: {ex['question']}\n  A: {ex['completion'].strip()!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
