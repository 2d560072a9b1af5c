"""Learner step time on the cpu-demo model: full / LoRA / QLoRA, entropy mask rho = 0.2 vs 1.0.

    python -m tools.measure.learner_step                 # 1 warm-up + 5 timed steps per setting
    python -m tools.measure.learner_step --steps 3 --modes lora --rhos 0.2,1.0
    python -m tools.measure.learner_step --modes lora --rhos 0.2 --micro-batch 4
        # one setting: its memory peak too
    python -m tools.measure.learner_step --preset cpu-14core --model runs/models/qwen2-0.5b-shape \
        --modes lora --rhos 0.2 --seqs 8 --completion-len 64 --micro-batch 8 --json l.json

A fixed synthetic batch (--seqs sequences, default 16: real chat-formatted arithmetic prompts +
--completion-len sampled-like completion tokens, default 32, all advantages non-zero so every
sequence is trained) so the settings do the same work; prints the median fwd+bwd+optimizer time
per step, the completion tokens trained per second, and the exported update size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from common.device import cpu_line
from common.memory import footprint
from common.models import load_tokenizer, resolve_model
from common.presets import get_preset
from common.types import TrainBatch
from learner.learner import Learner
from tasks.prompts import format_prompt
from tasks.registry import make_task


def make_batch(cfg, n: int = 16, completion_len: int = 32, seed: int = 0) -> TrainBatch:
    tok = load_tokenizer(resolve_model(cfg.model.name))
    task = make_task("arith", 1, None, seed)
    rng = np.random.default_rng(seed)
    prompts = [tok(format_prompt(tok, task.train_sample(i // 8)["question"]),
                   add_special_tokens=False)["input_ids"] for i in range(n)]
    comps = [list(rng.integers(100, len(tok) - 1, completion_len)) for _ in range(n)]
    adv = rng.normal(size=n).astype(np.float32)
    adv[adv == 0] = 0.1
    return TrainBatch(prompts, comps,
                      [rng.uniform(-3, -0.1, completion_len).astype(np.float32) for _ in comps],
                      [rng.uniform(0, 4, completion_len).astype(np.float32) for _ in comps], adv)


def bench(mode: str, rho: float, steps: int, threads: int, micro_batch: int = 16,
          preset: str = "cpu-demo", model: str = "", seqs: int = 16,
          completion_len: int = 32) -> dict:
    cfg = get_preset(preset)
    cfg.model.name = model or cfg.model.name
    cfg.lora.mode, cfg.grpo.entropy_rho = mode, rho
    cfg.rollout.learner_threads = threads
    cfg.grpo.micro_batch = micro_batch
    learner = Learner(cfg)
    batch = make_batch(cfg, seqs, completion_len)
    with torch.no_grad():  # page the file-mapped weights in, so the peak below is the step's
        for p in learner.model.parameters():
            p.sum()
    resident = footprint(children=False).rss_gb
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        learner.train_on(batch)
        if i:  # the first step is warm-up (allocator, oneDNN primitive caches)
            times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    payload = learner.export()
    export_s = time.perf_counter() - t0
    return {"mode": mode, "rho": rho, "median_s": statistics.median(times),
            "tokens_per_s": seqs * completion_len / statistics.median(times),
            "step_peak_gb": footprint(children=False).peak_gb - resident,
            "steps": [round(t, 2) for t in times], "export_mb": payload.nbytes / 2**20,
            "export_s": export_s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.measure.learner_step",
                                description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="full,lora,qlora", help="comma-separated lora.mode values")
    p.add_argument("--rhos", default="0.2,1.0", help="comma-separated entropy_rho values")
    p.add_argument("--steps", type=int, default=5, help="timed steps per setting")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads")
    p.add_argument("--micro-batch", type=int, default=16, help="grpo.micro_batch")
    p.add_argument("--preset", default="cpu-demo", help="the settings' preset")
    p.add_argument("--model", default="", help="model name or path (default: the preset's)")
    p.add_argument("--seqs", type=int, default=16, help="sequences in the batch")
    p.add_argument("--completion-len", type=int, default=32, help="completion tokens each")
    p.add_argument("--json", default="", help="also write the rows here")
    args = p.parse_args(argv)
    print(cpu_line(), flush=True)  # hosts with and without AMX give different figures
    if min(args.seqs, args.completion_len, args.micro_batch, args.steps, args.threads) < 1:
        p.error("--seqs, --completion-len, --micro-batch, --steps and --threads must be >= 1")
    rows = [bench(m, float(r), args.steps, args.threads, args.micro_batch, args.preset,
                  args.model, args.seqs, args.completion_len)
            for m in args.modes.split(",") for r in args.rhos.split(",")]
    print(f"learner step, {args.model or args.preset + ' model'}, {args.seqs} seqs x (~60 prompt "
          f"+ {args.completion_len} completion) tokens, micro-batch {args.micro_batch}, "
          f"{args.threads} threads, fp32")
    if len(rows) == 1:  # the high-water mark is the process's: one setting per process
        print(f"step peak above the resident model: {rows[0]['step_peak_gb']:.2f} GiB")
    for r in rows:
        print(f"{r['mode']:>6} rho={r['rho']:<4} median {r['median_s']:6.2f} s/step  "
              f"{r['tokens_per_s']:7.1f} completion tokens/s  (steps {r['steps']})  "
              f"export {r['export_mb']:7.1f} MB in {r['export_s']:.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "seqs": args.seqs,
                       "completion_len": args.completion_len, "rows": rows}, f, indent=2)
    by = {(r["mode"], r["rho"]): r["median_s"] for r in rows}
    for m in args.modes.split(","):
        if (m, 0.2) in by and (m, 1.0) in by:
            saving = 1 - by[(m, 0.2)] / by[(m, 1.0)]
            print(f"{m}: rho=0.2 saves {saving:.0%} of the step time vs rho=1.0")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
