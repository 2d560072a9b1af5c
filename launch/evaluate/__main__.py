"""Evaluation on held-out problems: greedy accuracy, strict accuracy, format rate, pass@k.

    python -m launch.evaluate --model smollm2-135m-instruct --task arith --level 1 --n 200
    python -m launch.evaluate --model smollm2-135m-instruct --model runs/<run>/final \
        --sets arith-1,arith-1-unseen --samples 8
    python -m launch.evaluate --model runs/<run>/final --data my_problems.jsonl
    python -m launch.evaluate --model runs/<run>/final --task gsm8k --data train.jsonl --n 100
    python -m launch.evaluate --model runs/<run>/final --task file --data mine.csv \
        --prompt-field problem --answer-field solution --verifier exact

Sets: `arith-L` (level L's held-out questions in the templates training uses), `arith-L-unseen`
(held-out templates: phrasings never trained on), `gsm8k` (the held-out part of `--data`), each
with an optional answer style (`arith-2-boxed`: the prompts ask for `\boxed{N}`, and strict
accuracy checks it; `rewards.styles`), or
`--data FILE` alone: every line of a user's JSONL file (`question`, `answer`: a number or
GSM8K's `#### N`; a malformed line is a one-line error naming the line and the field), or
`--task file --data DATASET`: the held-out split of a user's dataset (JSONL, CSV, Parquet, a
`save_to_disk` folder) made as training makes it, with the training run's field mapping,
verifier and split given as flags (launch/evaluate/sets.py).

Metrics per set: `accuracy` (greedy; the right final number by any rule the lenient parser
accepts), `strict_accuracy` (right and in the asked `Answer: N` final line), `format_rate`,
and with `--samples K`, pass@1 and pass@K from K completions per question at temperature 1
(the unbiased estimator 1 - C(K-c, k)/C(K, k), c of K correct).

`--model` takes an embedded name, a hub id, a local checkpoint, or a run's `final/` adapter.
With a Ray cluster up (RAY_ADDRESS set, e.g. under `ray job submit`) or `--workers N`, the
set is split across N `eval:<i>` actors (actors/eval_worker.py) that decode in parallel.
Prints one JSON object; `--out FILE.json` writes it too.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from common.device import compute_dtype
from common.models import ModelNotFoundError
from launch.cli import OneLineParser, in_a_jobs_copy
from launch.driver.placement import RayConnection
from launch.evaluate.saved_models import (
    check_code_isolation,
    connect_for_eval,
    evaluate_many,
    facts_table,
    resolve_model_or_final,
    table,
)
from launch.evaluate.sets import add_file_flags, requested_sets
from rewards.verifiers.python_tests import IsolationError
from tasks import DatasetError


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="launch.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, action="append",
                   help="model name, local path, or a run's final/ (repeat for a table)")
    p.add_argument("--sets", default=None,
                   help="comma-separated held-out sets: arith-1..3, arith-1-unseen..arith-3-"
                        "unseen, gsm8k (overrides --task/--level; prints a models x sets table)")
    p.add_argument("--task", default=None, choices=["arith", "gsm8k", "file"],
                   help="held-out task (default arith, or your --data file when given alone); "
                        "file: the held-out split of your --data dataset")
    p.add_argument("--level", type=int, default=1, choices=[1, 2, 3], help="arithmetic level")
    p.add_argument("--data", default=None,
                   help="JSONL: alone, every line is scored ({question, answer}); with --task "
                        "gsm8k or a gsm8k set, the GSM8K file whose held-out part is scored; "
                        "with --task file, your dataset (JSONL, CSV, Parquet, save_to_disk)")
    p.add_argument("--samples", type=int, default=0,
                   help="also sample K completions per question at temperature 1: pass@1 and "
                        "pass@K (0: greedy only)")
    p.add_argument("--n", type=int, default=200, help="held-out problems to score")
    p.add_argument("--max-new-tokens", type=int, default=64, help="completion length limit")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per generate call")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0: all cores in process, 1 per Ray worker)")
    p.add_argument("--workers", type=int, default=None,
                   help="Ray eval workers (default: one per CPU when RAY_ADDRESS names a "
                        "cluster, else 0 = in this process)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                   help="auto: fp32 on a CPU (see common.device.CPU_AUTO_DTYPE)")
    p.add_argument("--out", default=None, help="also write the result to this JSON file")
    add_file_flags(p)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.n < 1:
        print("launch.evaluate: error: --n: must be >= 1", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 0:
        print("launch.evaluate: error: --workers: must be >= 0", file=sys.stderr)
        return 2
    if args.samples < 0 or args.samples == 1:
        print("launch.evaluate: error: --samples: must be 0 (greedy only) or >= 2",
              file=sys.stderr)
        return 2
    if args.out and (why := in_a_jobs_copy(args.out)) is not None:
        print(f"launch.evaluate: error: --out {args.out}: {why}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    bf16 = compute_dtype(args.dtype, "cpu") == "bf16"
    try:
        sets = requested_sets(args)
        check_code_isolation(sets)  # before any model loads or Ray starts
        threads = args.threads or 1
        for name in args.model:
            resolve_model_or_final(name)  # a missing model fails before Ray starts
        # a cluster this command starts (--workers N, no RAY_ADDRESS) is left when it ends, before
        # an error line is printed (an actor's traceback arriving later cannot bury it); a
        # caller's own connection (main() called after ray.init) is kept
        with RayConnection():
            workers = connect_for_eval(args.workers, threads)
            results = evaluate_many(args.model, sets, torch.bfloat16 if bf16 else torch.float32,
                                    args.max_new_tokens, args.batch_size, workers, threads,
                                    args.samples)
    except (ModelNotFoundError, DatasetError, ValueError, IsolationError) as e:
        print(f"launch.evaluate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: nothing to keep, no traceback
        print("launch.evaluate: interrupted", file=sys.stderr)
        return 130
    if len(results) == 1 and len(sets) == 1:
        (name, res), = results[0]["sets"].items()
        result = {"model": results[0]["model"], "set": name, **res}
    else:
        result = results
        print(table(results, list(sets)))
    if (facts := facts_table(results, list(sets))) is not None:
        print(facts)
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
