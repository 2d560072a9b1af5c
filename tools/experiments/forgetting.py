"""Does EWC stop a 3-stage curriculum from forgetting? Train with EWC off and on, same seeds.

    python -m tools.experiments.forgetting                       # cpu-demo, 3 x 15 steps
    python -m tools.experiments.forgetting --stage-steps 20 --lam 1000,10000 --n 40
    python -m tools.experiments.forgetting --preset tiny --stage-steps 1 --n 4   # smoke test

Curriculum arith:1 -> arith:2 -> arith:3. After each stage the current policy is saved and
scored (greedy) on the held-out sets of all three stages, so forgetting of earlier stages shows
as a falling number in an earlier column. Prints one table per arm and writes results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import ray
import torch

from common.config import Config
from launch.evaluate import evaluate_many, heldout_sets, table
from launch.presets import get_preset
from launch.train import Trainer

SETS = "arith-1,arith-2,arith-3"


def run_arm(base_cfg, lam: float, out_dir: str, sets: dict, max_new_tokens: int) -> list[dict]:
    """Train the curriculum with EWC strength `lam`; evaluate after every stage."""
    cfg = Config.from_dict(base_cfg.to_dict())  # a deep copy per arm
    cfg.ewc.lam = lam
    trainer = Trainer(cfg, out_dir)
    rows = []
    try:
        stages = trainer.curriculum.stages
        ends = [sum(s.steps for s in stages[: i + 1]) for i in range(len(stages))]
        for k in range(cfg.run.steps):
            trainer.step(k)
            if k + 1 in ends:
                stage = ends.index(k + 1)
                path = ray.get(trainer.learner.save_final.remote(
                    os.path.join(out_dir, f"after-stage-{stage + 1}")))
                torch.set_num_threads(os.cpu_count() or 1)
                res = evaluate_many([path], sets, torch.float32, max_new_tokens, 32)[0]
                res["model"] = f"ewc={lam:g} after stage {stage + 1}"
                rows.append(res)
                print(table(rows[-1:], list(sets)), flush=True)
        trainer.finish(0.0)
    finally:
        trainer.shutdown()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.experiments.forgetting",
                                description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu-demo", help="base preset")
    p.add_argument("--stage-steps", type=int, default=15, help="training steps per stage")
    p.add_argument("--lam", default="1e4,1e5", help="EWC lambda(s) of the EWC arm(s), "
                   "comma-separated")
    p.add_argument("--fisher-batches", type=int, default=4, help="batches in the Fisher estimate")
    p.add_argument("--n", type=int, default=30, help="held-out problems per stage set")
    p.add_argument("--max-new-tokens", type=int, default=64, help="completion length limit")
    p.add_argument("--out", default="runs/forgetting", help="output directory")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="rollout engine")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the EWC-off arm (e.g. to rerun only the EWC arms)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    cfg = get_preset(args.preset)
    cfg.run.steps = 3 * args.stage_steps
    cfg.curriculum.stages = ",".join(f"arith:{lv}:{args.stage_steps}" for lv in (1, 2, 3))
    cfg.rollout.max_new_tokens = args.max_new_tokens
    cfg.ewc.fisher_batches = args.fisher_batches
    cfg.run.checkpoint_every = 0
    cfg.rollout.engine = args.engine
    sets = heldout_sets(SETS, args.n, None)
    results = {}
    lams = [float(x) for x in args.lam.split(",")]
    for lam in lams if args.no_baseline else [0.0, *lams]:
        arm_dir = os.path.join(args.out, f"ewc-{lam:g}")
        results[f"ewc={lam:g}"] = run_arm(cfg, lam, arm_dir, sets, args.max_new_tokens)
    wall = time.perf_counter() - t0
    print(f"\nforgetting experiment: {args.preset} ({args.engine}), 3 x {args.stage_steps} steps, "
          f"{args.n} held-out problems per set, wall {wall / 60:.1f} min")
    print(table([r for rows in results.values() for r in rows], list(sets)))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"results-{'-'.join(map(str, results))}.json"), "w") as f:
        json.dump({"args": vars(args), "wall_s": wall, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
