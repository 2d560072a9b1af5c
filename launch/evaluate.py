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
verifier and split given as flags (launch/eval_sets.py).

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
import os
import sys
import time

import ray
import torch
from tqdm import tqdm

from actors.eval_worker import (
    EvalWorker,
    completion_tokens,
    greedy_complete,
    load_for_eval,
    sample_complete,
)
from common.models import ModelNotFoundError, cpu_supports_bf16, resolve_model
from launch.cli import OneLineParser
from launch.eval_sets import SET_NAMES, add_file_flags, heldout_sets, requested_sets
from launch.placement import start_local_cluster
from launch.scoring import pass_at_k, score
from rewards import DatasetError

__all__ = ["SET_NAMES", "evaluate", "evaluate_many", "heldout_sets", "load_for_eval",
           "pass_at_k", "score", "table"]


def evaluate(model, tokenizer, samples: list[dict], max_new_tokens: int = 64,
             batch_size: int = 32, desc: str = "eval", k: int = 0,
             sample_n: int | None = None) -> dict:
    """Greedy completions of `samples` from an in-process model (and, when k > 0, k sampled
    ones for each of the first `sample_n` samples, all by default), scored (see `score`)."""
    t0 = time.perf_counter()  # prompts as training builds them (rewards.prompt_text)
    texts = greedy_complete(model, tokenizer, samples, max_new_tokens, batch_size, desc)
    sampled = (sample_complete(model, tokenizer, samples[:sample_n], max_new_tokens, k,
                               batch_size=batch_size, desc=f"{desc} x{k}") if k else None)
    lengths = completion_tokens(tokenizer, texts)
    return score(samples, texts, lengths, time.perf_counter() - t0, sampled)


def score_saved(model_path: str, sets: dict[str, list[dict]], max_new_tokens: int,
                keys: tuple[str, ...]) -> dict[str, dict]:
    """{set: {key: figure}} of a saved policy, greedy, in this process on every core (the
    experiments in tools/experiments score their policies so between stages)."""
    torch.set_num_threads(os.cpu_count() or 1)
    model, tok = load_for_eval(model_path, torch.float32)
    out = {}
    for name, samples in sets.items():
        res = evaluate(model, tok, samples, max_new_tokens=max_new_tokens, desc=name)
        out[name] = {k: res[k] for k in keys if k in res}  # by_fact: level-1 sets only
    return out


def evaluate_sharded(workers: list, samples: list[dict], max_new_tokens: int, batch_size: int,
                     desc: str = "eval", k: int = 0) -> dict:
    """The same as `evaluate`, with `samples` split into contiguous shards over Ray workers."""
    t0 = time.perf_counter()
    n, w = len(samples), len(workers)
    bounds = [i * n // w for i in range(w + 1)]
    shards = [samples[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
    refs = [a.complete.remote(q, max_new_tokens, batch_size) for a, q in zip(workers, shards)]
    sample_refs = ([a.sample.remote(q, max_new_tokens, k, lo, batch_size)
                    for a, q, lo in zip(workers, shards, bounds)] if k else [])
    pending = refs + sample_refs
    with tqdm(total=len(pending), desc=desc, unit="shard", file=sys.stderr) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            bar.update(len(done))
    texts, lengths = [], []
    for shard_texts, shard_lengths in ray.get(refs):  # shard order = sample order
        texts += shard_texts
        lengths += shard_lengths
    sampled = [g for shard in ray.get(sample_refs) for g in shard] if k else None
    result = score(samples, texts, lengths, time.perf_counter() - t0, sampled)
    return {**result, "workers": w}


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
                   help="auto: bf16 on CPUs with AMX/AVX512-bf16")
    p.add_argument("--out", default=None, help="also write the result to this JSON file")
    add_file_flags(p)
    return p


def table(results: list[dict], sets: list[str], key: str = "accuracy") -> str:
    """Rows: models; columns: held-out sets; cells: `key` in percent."""
    width = max(12, *(len(r["model"]) for r in results))
    cols = [max(10, len(s) + 2) for s in sets]
    lines = [f"{key:<{width}}" + "".join(f"{s:>{c}}" for s, c in zip(sets, cols))]
    for r in results:
        lines.append(f"{r['model']:<{width}}" + "".join(
            f"{r['sets'][s][key]:>{c}.1%}" for s, c in zip(sets, cols)))
    return "\n".join(lines)


def facts_table(results: list[dict], sets: list[str]) -> str | None:
    """Accuracy by templates (the set) x facts (level-1 arithmetic: asked in training in other
    words, or never); None when no set carries facts."""
    cols = [(s, f) for s in sets for f in ("seen", "unseen")
            if all(f in r["sets"][s].get("by_fact", {}) for r in results)]
    if not cols:
        return None
    names = [f"{s} templates/{f} facts" for s, f in cols]
    flat = [{"model": r["model"], "sets": {name: r["sets"][s]["by_fact"][f]
                                           for name, (s, f) in zip(names, cols)}}
            for r in results]
    return table(flat, names)


def evaluate_many(models: list[str], sets: dict[str, list[dict]], dtype, max_new_tokens: int,
                  batch_size: int, workers: int = 0, threads: int = 1, k: int = 0
                  ) -> list[dict]:
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
                res = {s: evaluate_sharded(actors, samples, max_new_tokens, batch_size, s, k)
                       for s, samples in sets.items()}
            finally:
                for a in actors:
                    ray.kill(a)
        else:
            model, tok = load_for_eval(name, dtype)
            res = {s: evaluate(model, tok, samples, max_new_tokens, batch_size, desc=s, k=k)
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
            start_local_cluster(workers * threads)
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
    if args.samples < 0 or args.samples == 1:
        print("launch.evaluate: error: --samples: must be 0 (greedy only) or >= 2",
              file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    bf16 = args.dtype == "bf16" or (args.dtype == "auto" and cpu_supports_bf16())
    try:
        sets = requested_sets(args)
        threads = args.threads or 1
        for name in args.model:
            resolve_model_or_final(name)  # a missing model fails before Ray starts
        workers = connect_for_eval(args.workers, threads)
        results = evaluate_many(args.model, sets, torch.bfloat16 if bf16 else torch.float32,
                                args.max_new_tokens, args.batch_size, workers, threads,
                                args.samples)
    except (ModelNotFoundError, DatasetError, ValueError) as e:
        print(f"launch.evaluate: error: {e}", file=sys.stderr)
        return 2
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
