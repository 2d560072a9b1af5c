"""Scoring saved models on held-out sets: greedy accuracy, strict accuracy, format rate,
pass@k; in this process or split over Ray `EvalWorker` actors (`python -m launch.evaluate` is
its command line, launch/evaluate/__main__.py).
"""

from __future__ import annotations

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
from common.models import resolve_model
from launch.driver.placement import start_local_cluster
from launch.evaluate.scoring import score
from rewards.verifiers.python_tests import require_isolation


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


def check_code_isolation(sets: dict[str, list[dict]]) -> None:
    """Where a set is checked by python-tests (it runs the models' code), raise
    `IsolationError` (one line) now, before any model loads, unless this machine can isolate
    that code (the evaluation's verifier never runs it unisolated)."""
    if any(s.get("verifier") == "python-tests" for samples in sets.values() for s in samples):
        require_isolation()


def evaluate_many(models: list[str], sets: dict[str, list[dict]], dtype, max_new_tokens: int,
                  batch_size: int, workers: int = 0, threads: int = 1, k: int = 0
                  ) -> list[dict]:
    """Every model on every set: [{"model", "sets": {set: result}}].

    workers > 0: each model is loaded by that many `EvalWorker` actors (`threads` torch threads
    each) on the connected Ray cluster, and every set is split across them. A python-tests set
    where code cannot be isolated raises `IsolationError` first (`check_code_isolation`).
    """
    check_code_isolation(sets)
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
