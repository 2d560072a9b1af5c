"""Greedy evaluation on held-out problems: accuracy, format rate, mean completion length.

    python -m launch.evaluate --model smollm2-135m-instruct --task arith --level 1 --n 200
    python -m launch.evaluate --model runs/<run>/final --task arith --level 1 --n 200
    python -m launch.evaluate --model runs/<run>/final --task gsm8k --data train.jsonl --n 100

`--model` takes an embedded name, a hub id, a local checkpoint, or a run's `final/` adapter.
With a Ray cluster up (RAY_ADDRESS set, e.g. under `ray job submit`) or `--workers N`, the
set is split across N `eval:<i>` actors (actors/eval_worker.py) that decode in parallel.
Prints one JSON object; `--out FILE.json` writes it too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import ray
import torch
from tqdm import tqdm

from actors.eval_worker import EvalWorker, completion_tokens, greedy_complete, load_for_eval
from common.models import ModelNotFoundError, cpu_supports_bf16, resolve_model
from launch.cli import OneLineParser
from rewards import DatasetError, VerifierPool, make_task

__all__ = ["evaluate", "evaluate_many", "heldout_sets", "load_for_eval", "score", "table"]


def score(samples: list[dict], texts: list[str], lengths: list[int], wall_s: float) -> dict:
    """Accuracy, strict accuracy, format rate, n and mean length of completions of `samples`.

    accuracy: right final number by any extraction rule; strict: right and in the asked
    `Answer: N` final-line format; format_rate: share in that format.
    """
    with VerifierPool() as pool:
        results = pool.score(texts, [s["answer"] for s in samples])
    n = len(samples)
    return {
        "accuracy": sum(r.score for r in results) / n,
        "strict_accuracy": sum(r.score * (r.format_score == 1.0) for r in results) / n,
        "format_rate": sum(r.format_score == 1.0 for r in results) / n,
        "n": n,
        "mean_completion_tokens": sum(lengths) / n,
        "errors": sum(r.error is not None for r in results),
        "wall_s": wall_s,
        "examples": [{"question": s["question"], "answer": s["answer"], "completion": t}
                     for s, t in list(zip(samples, texts))[:3]],
    }


def evaluate(model, tokenizer, samples: list[dict], max_new_tokens: int = 64,
             batch_size: int = 32, desc: str = "eval") -> dict:
    """Greedy completions of `samples` from an in-process model, scored (see `score`)."""
    t0 = time.perf_counter()
    texts = greedy_complete(model, tokenizer, [s["question"] for s in samples], max_new_tokens,
                            batch_size, desc)
    lengths = completion_tokens(tokenizer, texts)
    return score(samples, texts, lengths, time.perf_counter() - t0)


def evaluate_sharded(workers: list, samples: list[dict], max_new_tokens: int, batch_size: int,
                     desc: str = "eval") -> dict:
    """The same as `evaluate`, with `samples` split into contiguous shards over Ray workers."""
    t0 = time.perf_counter()
    n, k = len(samples), len(workers)
    bounds = [i * n // k for i in range(k + 1)]
    refs = [w.complete.remote([s["question"] for s in samples[lo:hi]], max_new_tokens, batch_size)
            for w, lo, hi in zip(workers, bounds, bounds[1:])]
    pending = list(refs)
    with tqdm(total=k, desc=desc, unit="shard", file=sys.stderr) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            bar.update(len(done))
    texts, lengths = [], []
    for shard_texts, shard_lengths in ray.get(refs):  # shard order = sample order
        texts += shard_texts
        lengths += shard_lengths
    result = score(samples, texts, lengths, time.perf_counter() - t0)
    return {**result, "workers": k}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="launch.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, action="append",
                   help="model name, local path, or a run's final/ (repeat for a table)")
    p.add_argument("--sets", default=None,
                   help="comma-separated held-out sets, e.g. arith-1,arith-2,arith-3,gsm8k "
                        "(overrides --task/--level; prints a models x sets table)")
    p.add_argument("--task", default="arith", choices=["arith", "gsm8k"], help="held-out task")
    p.add_argument("--level", type=int, default=1, choices=[1, 2, 3], help="arithmetic level")
    p.add_argument("--data", default=None, help="GSM8K-style JSONL for --task gsm8k")
    p.add_argument("--n", type=int, default=200, help="held-out problems to score")
    p.add_argument("--max-new-tokens", type=int, default=64, help="completion length limit")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per generate call")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0: all cores in process, 1 per Ray worker)")
    p.add_argument("--workers", type=int, default=None,
                   help="Ray eval workers (default: one per CPU when RAY_ADDRESS names a "
                        "cluster, else 0 = in this process)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                   help="auto: bf16 on CPUs with AMX/AVX512-bf16")
    p.add_argument("--out", default=None, help="also write the result to this JSON file")
    return p


def heldout_sets(spec: str, n: int, data: str | None) -> dict[str, list[dict]]:
    """Parse `arith-1,arith-2,gsm8k` into named held-out sets of up to n problems each."""
    sets = {}
    for name in [s.strip() for s in spec.split(",") if s.strip()]:
        task, _, level = name.partition("-")
        if task not in ("arith", "gsm8k") or (task == "arith" and level not in ("1", "2", "3")):
            raise ValueError(f"--sets: {name!r} must be arith-1, arith-2, arith-3 or gsm8k")
        sets[name] = make_task(task, int(level or 1), data).heldout(n)
    return sets


def table(results: list[dict], sets: list[str], key: str = "accuracy") -> str:
    """Rows: models; columns: held-out sets; cells: `key` in percent."""
    width = max(12, *(len(r["model"]) for r in results))
    lines = [f"{key:<{width}}" + "".join(f"{s:>10}" for s in sets)]
    for r in results:
        lines.append(f"{r['model']:<{width}}" + "".join(
            f"{r['sets'][s][key]:>10.1%}" for s in sets))
    return "\n".join(lines)


def evaluate_many(models: list[str], sets: dict[str, list[dict]], dtype, max_new_tokens: int,
                  batch_size: int, workers: int = 0, threads: int = 1) -> list[dict]:
    """Every model on every set: [{"model", "sets": {set: result}}].

    workers > 0: each model is loaded by that many `EvalWorker` actors (`threads` torch threads
    each) on the connected Ray cluster, and every set is split across them.
    """
    out = []
    for name in models:
        if workers:
            resolve_model_or_final(name)  # fail here, in one line, not inside an actor
            actors = [EvalWorker.options(name=f"eval:{i}", num_cpus=threads).remote(
                name, str(dtype).removeprefix("torch."), threads) for i in range(workers)]
            try:
                res = {s: evaluate_sharded(actors, samples, max_new_tokens, batch_size, s)
                       for s, samples in sets.items()}
            finally:
                for a in actors:
                    ray.kill(a)
        else:
            model, tok = load_for_eval(name, dtype)
            res = {s: evaluate(model, tok, samples, max_new_tokens, batch_size, desc=s)
                   for s, samples in sets.items()}
        out.append({"model": name, "sets": res})
    return out


def resolve_model_or_final(name: str) -> None:
    """Raise ModelNotFoundError now unless `name` is a run's final/ or a resolvable model."""
    if not os.path.exists(os.path.join(name, "homerl.json")):
        resolve_model(name)


def connect_for_eval(workers: int | None, threads: int) -> int:
    """How many eval workers to use, connecting to Ray when there are any.

    None (the default): the cluster named by RAY_ADDRESS, one worker per `threads` of its CPUs,
    or in-process evaluation when no cluster is named. N > 0 with no cluster: a local one.
    """
    address = os.environ.get("RAY_ADDRESS")
    if workers == 0 or (workers is None and not address):
        return 0
    if not ray.is_initialized():
        if address:
            ray.init(address=address)
        else:
            ray.init(num_cpus=workers * threads, include_dashboard=False)
    if workers is None:
        workers = max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
    return workers


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.n < 1:
        print("launch.evaluate: error: --n: must be >= 1", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 0:
        print("launch.evaluate: error: --workers: must be >= 0", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    bf16 = args.dtype == "bf16" or (args.dtype == "auto" and cpu_supports_bf16())
    spec = args.sets or (f"arith-{args.level}" if args.task == "arith" else "gsm8k")
    try:
        sets = heldout_sets(spec, args.n, args.data)
        threads = args.threads or 1
        for name in args.model:
            resolve_model_or_final(name)  # a missing model fails before Ray starts
        workers = connect_for_eval(args.workers, threads)
        results = evaluate_many(args.model, sets, torch.bfloat16 if bf16 else torch.float32,
                                args.max_new_tokens, args.batch_size, workers, threads)
    except (ModelNotFoundError, DatasetError, ValueError) as e:
        print(f"launch.evaluate: error: {e}", file=sys.stderr)
        return 2
    if len(results) == 1 and len(sets) == 1:
        (name, res), = results[0]["sets"].items()
        result = {"model": results[0]["model"], "set": name, **res}
    else:
        result = results
        print(table(results, list(sets)))
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
