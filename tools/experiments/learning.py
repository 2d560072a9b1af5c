"""Does a recipe teach arithmetic that transfers to new phrasings? Train it on several seeds.

    python -m tools.experiments.learning --seeds 0 1 2                     # the cpu-demo recipe
    python -m tools.experiments.learning --seeds 0 --tag lr1e-3 -- --grpo.lr 1e-3 --steps 120
    python -m tools.experiments.learning --preset tiny --seeds 0 --eval-n 4 -- --steps 2  # smoke
    python -m tools.experiments.learning --tag l2 --also arith-1-unseen,arith-3 \
        -- --curriculum.level 2                                            # a level-2 recipe

Everything after `--` is a `launch.train` flag applied to the preset. For every seed: train
(a local Ray cluster, the real driver), then score the final adapter greedily on the held-out
level splits `seen` (training's templates, other questions) and `unseen` (templates never
trained on), and on the `--also` sets (`launch.evaluate`'s names: is level 1 kept, is level 3
no worse?). Arithmetic scores break down by operation and carry, level 1's also by fact. The
base model is scored once (greedy is seed-free). Prints one table, mean and range over seeds
of the change against the base, and writes `OUT/<tag>/results.json`. A seed already in that
file from the same preset, flags and sets is kept, not trained again, so `--seeds 0 1 2`
after `--seeds 0` trains seeds 1 and 2 and reports all three.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time

from common.config import ConfigError
from launch.cli import parse_config
from launch.driver.trainer import Trainer
from launch.evaluate.saved_models import score_saved
from launch.evaluate.sets import heldout_sets
from tasks.registry import make_task
from tools.experiments.forgetting import read_saved

METRICS = ("accuracy", "strict_accuracy", "format_rate")
BREAKDOWNS = ("by_fact", "by_op", "by_carry")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="tools.experiments.learning",
                                description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--preset", default="cpu-demo")
    p.add_argument("--eval-n", type=int, default=200, help="held-out questions per split")
    p.add_argument("--tag", default="recipe", help="name of this arm (results sub-directory)")
    p.add_argument("--out", default="runs/learning", help="results directory")
    p.add_argument("--also", default="",
                   help="more held-out sets to score, comma-separated launch.evaluate names "
                        "(arith-1, arith-1-unseen, arith-3, ...), --eval-n problems each")
    p.add_argument("train_flags", nargs=argparse.REMAINDER,
                   help="-- then launch.train flags for every seed")
    args = p.parse_args(argv)
    if args.train_flags[:1] == ["--"]:
        args.train_flags = args.train_flags[1:]
    return args


def scores(model_path: str, sets: dict, max_new_tokens: int) -> dict:
    return score_saved(model_path, sets, max_new_tokens, (*METRICS, "n", *BREAKDOWNS))


def base_scores(out: str, model: str, sets: dict, max_new_tokens: int) -> dict:
    """The base model's scores on `sets`, from `OUT/base.json` where an earlier arm scored the
    same set (name, questions, length limit) of the same model (greedy: seed-free), else
    scored now and added there."""
    path = os.path.join(out, "base.json")
    cache = read_saved(path) or {}
    key = {name: hashlib.sha256(json.dumps([model, max_new_tokens, [s["question"] for s in
                                                                    samples]]).encode()
                                ).hexdigest() for name, samples in sets.items()}
    todo = {name: samples for name, samples in sets.items() if key[name] not in cache}
    if todo:
        for name, result in scores(model, todo, max_new_tokens).items():
            cache[key[name]] = result
        with open(path, "w") as f:
            json.dump(cache, f)
    return {name: cache[key[name]] for name in sets}


def finished_runs(path: str, preset: str, flags: list[str], eval_n: int,
                  engine: str, sets: tuple[str, ...] = ("seen", "unseen")) -> dict[int, dict]:
    """{seed: run} from an earlier results.json of the same preset, flags, eval size, sets and
    rollout engine (files without one are from the HF engine, cpu-demo's before vLLM), else {}."""
    old = read_saved(path) or {}  # missing or torn by a kill mid-write: nothing to keep
    same_n = all(split["n"] == eval_n for split in old.get("base", {}).values())
    same = (old.get("preset") == preset and old.get("flags") == flags
            and set(old.get("base", {})) in ({*sets}, set()))
    if not (same and same_n and old.get("engine", "hf") == engine):
        return {}
    return {r["seed"]: r for r in old.get("runs", [])}


def summarize(base: dict, runs: list[dict]) -> dict:
    """{split: {metric: {base, mean, min, max, change}}} over the seeds' final scores."""
    out = {}
    for split in base:
        out[split] = {}
        for m in METRICS:
            vals = [r["scores"][split][m] for r in runs]
            out[split][m] = {"base": base[split][m], "mean": statistics.mean(vals),
                             "min": min(vals), "max": max(vals),
                             "change": statistics.mean(vals) - base[split][m]}
    return out


def report(tag: str, summary: dict, runs: list[dict], base: dict | None = None) -> str:
    lines = [f"{tag}: {len(runs)} seed(s), train "
             f"{statistics.mean(r['train_min'] for r in runs):.1f} min mean"]
    width = max(map(len, summary), default=0) + 1
    for split, metrics in summary.items():
        for m, s in metrics.items():
            lines.append(f"  {split:<{width}}{m:<16} base {s['base']:6.1%}  trained "
                         f"{s['mean']:6.1%} (range {s['min']:.1%}-{s['max']:.1%})  change "
                         f"{s['change'] * 100:+5.1f}p")
    return "\n".join(lines + facts_lines(base or {}, runs))


def facts_lines(base: dict, runs: list[dict]) -> list[str]:
    """Accuracy by templates (split) x facts (trained in other words, or never), where the
    splits carry facts (level 1), then by operation and by carry/borrow: base and the seeds'
    mean and range."""
    out = []
    for key in BREAKDOWNS:
        for split, b in base.items():
            for value, cell in sorted(b.get(key, {}).items()):
                vals = [r["scores"][split][key][value]["accuracy"] for r in runs
                        if value in r["scores"][split].get(key, {})]
                if not vals:
                    continue
                what = (f"{split} templates, {value} facts" if key == "by_fact"
                        else f"{split} {value}")
                out.append(f"  {what} (n={cell['n']}): base "
                           f"{cell['accuracy']:.1%}  trained {statistics.mean(vals):.1%} "
                           f"(range {min(vals):.1%}-{max(vals):.1%})")
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg0, _ = parse_config(["--preset", args.preset, *args.train_flags],
                               prog="tools.experiments.learning")
    except ConfigError as e:
        print(f"tools.experiments.learning: error: {e}", file=sys.stderr)
        return 2
    out_dir = os.path.join(args.out, args.tag)
    os.makedirs(out_dir, exist_ok=True)
    c = cfg0.curriculum
    task = make_task(c.task, c.level, c.data_path or None)
    sets = {s: task.heldout(args.eval_n, s) for s in ("seen", "unseen")}
    try:
        sets |= heldout_sets(args.also, args.eval_n, c.data_path or None) if args.also else {}
    except ValueError as e:
        why = str(e).removeprefix("--sets: ")
        print(f"tools.experiments.learning: error: --also: {why}", file=sys.stderr)
        return 2
    base = base_scores(args.out, cfg0.model.name, sets, cfg0.rollout.max_new_tokens)
    results_path = os.path.join(out_dir, "results.json")
    done = finished_runs(results_path, args.preset, args.train_flags, args.eval_n,
                         cfg0.rollout.engine, tuple(sets))
    runs = []
    for seed in args.seeds:
        if seed in done:
            print(f"seed {seed}: kept from {results_path}", flush=True)
            runs.append(done[seed])
            continue
        cfg, _ = parse_config(["--preset", args.preset, *args.train_flags, "--seed", str(seed)],
                              prog="tools.experiments.learning")
        run_dir = os.path.join(out_dir, f"seed{seed}")
        t0 = time.perf_counter()
        trainer = Trainer(cfg, run_dir)
        try:
            summary = trainer.run()
        finally:
            trainer.shutdown()
        runs.append({"seed": seed, "train_min": (time.perf_counter() - t0) / 60,
                     "s_per_step": summary["s_per_step_median"],
                     "scores": scores(summary["final"], sets, cfg.rollout.max_new_tokens)})
        print(report(args.tag, summarize(base, runs), runs, base), flush=True)
        # Written after every seed: an interrupted experiment keeps the seeds it finished.
        result = {"tag": args.tag, "preset": args.preset, "flags": args.train_flags,
                  "engine": cfg0.rollout.engine, "base": base, "runs": runs,
                  "summary": summarize(base, runs)}
        with open(results_path, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
