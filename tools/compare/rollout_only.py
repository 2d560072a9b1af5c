"""Rollout-only microbenchmark of `tools.compare.bench --rollout-only`: generated tokens/s of one
rollout worker (in process) vs plain HF `model.generate` on the same 16 sequences, and of 1, 2, ...
Ray workers through `WorkerPool`.

    python -m tools.compare.bench --rollout-only --workers 1,2
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict

import torch

from actors.hf_worker import HFRolloutWorker
from actors.vllm_worker import VLLMRolloutWorker
from common.types import RolloutCall, Sampling
from launch.driver.pool import WorkerPool
from launch.driver.roles import rollout_worker_class
from tasks.prompts import format_prompt
from tools.compare.settings import (
    Settings,
    bench_prompts,
    fmt3,
    machine_line,
    ours_config,
    release_memory,
    start_ray,
)


def _timed(fn, reps: int) -> list[tuple[int, float]]:
    """(tokens, seconds) of `reps` calls fn(i) after one warm-up call."""
    fn(-1)
    out = []
    for i in range(reps):
        t0 = time.perf_counter()
        n = fn(i)
        out.append((n, time.perf_counter() - t0))
    return out


def _rate(samples: list[tuple[int, float]]) -> float:
    return statistics.median(n / t for n, t in samples)


def plain_generate(model, tok, prompts: list[dict], s: Settings, seed: int) -> int:
    """Plain `model.generate` on the same 16 rows; tokens up to and including the first EOS."""
    texts = [format_prompt(tok, p["question"]) for p in prompts for _ in range(s.group)]
    enc = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=s.temperature, top_p=1.0,
                             top_k=0, max_new_tokens=s.max_new_tokens,
                             pad_token_id=tok.pad_token_id)
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    total = 0
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        end = next((j + 1 for j, t in enumerate(row) if t in eos_ids), len(row))
        total += end
    return total


def rollout_inprocess(s: Settings, reps: int, threads: int) -> list[tuple[str, float]]:
    cfg = ours_config(s)
    cfg.rollout.threads_per_worker = threads
    worker = HFRolloutWorker(cfg)
    prompts = bench_prompts(s, 1)
    try:
        ours = _timed(lambda i: worker.generate(
            RolloutCall(prompts, s.group, Sampling(seed=1000 + i))).num_tokens, reps)
        plain = _timed(lambda i: plain_generate(worker.model, worker.tokenizer, prompts, s,
                                                2000 + i), reps)
    finally:
        worker.verifier.close()
    tag = f"in-process, {threads} thread{'s' if threads > 1 else ''}"
    rows = [(f"HFRolloutWorker.generate ({tag}, logits + entropies + verify)", _rate(ours)),
            (f"plain HF model.generate ({tag})", _rate(plain))]
    if s.engine == "vllm":
        rows.insert(0, (f"VLLMRolloutWorker.generate ({tag}, log-probs + entropies + verify)",
                        _rate(rollout_vllm(cfg, prompts, s, reps))))
    return rows


def rollout_vllm(cfg, prompts: list[dict], s: Settings, reps: int) -> list[tuple[int, float]]:
    release_memory()
    worker = VLLMRolloutWorker(cfg)
    try:
        return _timed(lambda i: worker.generate(
            RolloutCall(prompts, s.group, Sampling(seed=1000 + i))).num_tokens, reps)
    finally:
        worker.shutdown()


def rollout_ray(s: Settings, n_workers: int, reps: int) -> float:
    cfg = ours_config(s)
    cfg.rollout.num_workers, cfg.rollout.threads_per_worker = n_workers, 1
    pool = WorkerPool(cfg, rollout_worker_class(cfg))
    prompts = bench_prompts(s, 1)
    try:
        samples = _timed(lambda i: pool.collect(
            pool.submit(0, prompts, seed=3000 + i)).summary.num_tokens, reps)
    finally:
        pool.shutdown()
    return sum(n for n, _ in samples) / sum(t for _, t in samples)


def rollout_only(s: Settings, reps: int, threads: int, workers: list[int]) -> tuple[list, dict]:
    import ray

    torch.set_num_threads(threads)
    rows = rollout_inprocess(s, reps, threads)
    release_memory()
    started = start_ray(max(workers))
    try:
        ray_rates = {n: rollout_ray(s, n, reps) for n in workers}
    finally:
        if started:
            ray.shutdown()
    lines = [machine_line(), f"rollout: {s.model} fp32, {s.completions} sequences "
             f"({s.prompts} prompts x G={s.group}), max {s.max_new_tokens} new tokens, "
             f"temperature {s.temperature}, 1 warm-up + {reps} timed calls each"]
    lines += [f"{name}: {fmt3(rate)} tokens/s" for name, rate in rows]
    base = ray_rates[workers[0]]
    for n, rate in ray_rates.items():
        lines.append(f"Ray WorkerPool {n} {s.engine} worker{'s' if n > 1 else ''} x 1 thread: "
                     f"{fmt3(rate)} tokens/s total ({rate / base:.2f}x {workers[0]} worker)")
    return lines, {"settings": asdict(s), "in_process_tokens_per_s": dict(rows),
                   "ray_tokens_per_s": ray_rates, "machine": lines[0]}
