"""Decode speed per batch size against the roofline bound (`tools.measure.roofline`), per engine.

    python -m tools.measure.decode_profile  # vLLM and HF, B = 1 4 8 16 32, 1 thread
    python -m tools.measure.decode_profile --engines hf --batches 16 --new-tokens 64 \
        --json prof.json
    python -m tools.measure.decode_profile --engines vllm --batches 16 --new-tokens 40 \
        --block-size 128
    python -m tools.measure.decode_profile --engines vllm --batches 16 --ops 12

For each engine and batch size B, rows as a rollout call brings them (B/8 prompts x G=8; B < 8:
B prompts x 1), every row generates exactly N new tokens (EOS ignored): once with N = 1 and once
with N = --new-tokens. Per decode step = (t_N - t_1) / (N - 1), so prefill is out of it; decode
tokens/s = B / step; the bound is the lower of the memory bound, B * bandwidth / (weight bytes
+ B * KV bytes at the mean context), and the compute bound, GEMM FLOP/s / (2 * weights), both
rates measured here on the engine's threads (`tools.measure.roofline.read_bandwidth`, `gemm_rate`).
The call's tokens/s (prefill included) is B * N / t_N. Sampling at temperature 1 with the behaviour
log-probs each engine records for the learner (HF: `BehaviourRecorder`; vLLM: top-20
log-probs), as a rollout does; fp32 (--dtype bf16: the weights in bf16), --threads threads
(1: the presets' rollout worker); the best of --repeats calls. vLLM runs eager, as the rollout
worker does on a CPU (--compiled: with torch.compile; the start time is printed).

--ops K: then one more call per batch size under torch's profiler, and the K torch operators
(vLLM's kernels among them) that took the most of it, each as ms per decode step and share of
the call; what no operator holds is Python (the engine's scheduling, ours). The profiler slows
the call a little; the shares are what to read.

What it leaves out, and a real rollout pays: rows that stop early (the rows left pay nearly the
whole step), verification, and the weight loads between calls.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from actors.hf_worker import left_padded
from actors.sampling import BehaviourRecorder, hf_generation_config
from actors.vllm_engine import VLLMEngine
from actors.vllm_setup import configure_env
from common.device import cpu_line
from common.models import load_model, load_tokenizer, resolve_model
from common.presets import get_preset
from tasks.prompts import format_prompt
from tasks.registry import make_task
from tools.measure.roofline import (
    GB,
    compute_bound,
    decode_bound,
    decode_bytes,
    gemm_rate,
    read_bandwidth,
)

GROUP = 8


def prompt_ids(tok, batch: int) -> tuple[list[list[int]], int]:
    """(token ids of the distinct prompts, copies of each) for a batch of `batch` rows."""
    n, copies = (batch // GROUP, GROUP) if batch >= GROUP else (batch, 1)
    task = make_task("arith", 1, None, 0)
    texts = [format_prompt(tok, task.train_sample(i)["question"]) for i in range(n)]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts], copies


def best_time(runner, prompts: list[list[int]], copies: int, new_tokens: int,
              repeats: int) -> float:
    """The fastest of `repeats` calls, after one warm-up call. A call in which a row did not
    run all `new_tokens` steps is an error: the step time would be wrong."""
    want = len(prompts) * copies * new_tokens
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        got = runner.run(prompts, copies, new_tokens)
        if i:
            times.append(time.perf_counter() - t0)
        if got != want:
            raise RuntimeError(f"{want} tokens asked for ({len(prompts) * copies} rows x "
                               f"{new_tokens}), {got} generated: a row stopped early")
    return min(times)


class HFEngine:
    """transformers `generate` as `actors.hf_worker` calls it (left padding, the recorder)."""

    def __init__(self, path: str, threads: int, dtype: torch.dtype = torch.float32):
        torch.set_num_threads(threads)
        self.tok = load_tokenizer(path)
        self.model = load_model(path, dtype=dtype).eval()

    @torch.no_grad()
    def run(self, prompts: list[list[int]], copies: int, new_tokens: int) -> int:
        """Tokens generated (every row's new tokens)."""
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        ids, attn = left_padded(prompts, copies, pad)                                # (B, P)
        config = hf_generation_config(new_tokens, [self.tok.eos_token_id], pad)
        config.min_new_tokens = new_tokens  # EOS masked until N: every row runs N steps
        config.min_length = None  # (0 beside min_new_tokens draws a warning per call)
        out = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=config,
                                  logits_processor=[BehaviourRecorder(1.0)])
        return out.numel() - ids.numel()


class VLLMRunner:
    """`actors.vllm_engine.VLLMEngine` in this process, set up as the rollout worker sets it."""

    def __init__(self, path: str, max_len: int, threads: int,
                 dtype: torch.dtype = torch.float32, block_size: int | None = None,
                 compiled: bool = False):
        cfg = get_preset("cpu-demo")
        cfg.rollout.threads_per_worker = threads  # bound to this process's first cores
        cfg.rollout.share_cores = False  # exactly `threads`: no learner to borrow from
        configure_env(cfg, "rollout-0")
        self.tok = load_tokenizer(path)
        t0 = time.perf_counter()
        self.engine = VLLMEngine(path, dtype=str(dtype).removeprefix("torch."), seed=0,
                                 eager=not compiled, max_model_len=max_len,
                                 kv_cache_bytes=2**30, cpu=True, block_size=block_size)
        print(f"vllm ({'compiled' if compiled else 'eager'}): engine started in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)

    def run(self, prompts: list[list[int]], copies: int, new_tokens: int) -> int:
        """Tokens generated (every completion's)."""
        params = [self.engine.params(copies, 0, 1.0, new_tokens, [], fixed_length=True)
                  for _ in prompts]
        return sum(len(c.token_ids) for row in self.engine.generate(prompts, params)
                   for c in row)


def op_shares(runner, batch: int, new_tokens: int, top: int) -> list[dict]:
    """The `top` operators by self CPU time in one call of `batch` rows under torch's profiler:
    name, calls, ms per step (the call's time over its `new_tokens` steps, prefill included),
    share of the call's wall time; last, what no operator holds ("python": the engines' code)."""
    from torch.profiler import ProfilerActivity, profile

    prompts, copies = prompt_ids(runner.tok, batch)
    runner.run(prompts, copies, new_tokens)  # warm: the profiled call is a steady one
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.run(prompts, copies, new_tokens)
    wall = time.perf_counter() - t0
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    rest = max(0.0, wall - sum(e.self_cpu_time_total for e in events) / 1e6)  # s in no op
    rows = [{"op": e.key, "calls": e.count, "ms_per_step": e.self_cpu_time_total / 1e3 / new_tokens,
             "share": e.self_cpu_time_total / 1e6 / wall} for e in events[:top]]
    rows.append({"op": "python", "calls": 0, "ms_per_step": 1e3 * rest / new_tokens,
                 "share": rest / wall})
    return rows


def print_ops(name: str, batch: int, rows: list[dict]) -> None:
    print(f"{name} B={batch}: where a call's time goes (torch profiler, self time)")
    for r in rows:
        print(f"  {r['op']:40s} {r['calls']:6d} calls {r['ms_per_step']:8.2f} ms/step "
              f"{r['share']:6.1%}", flush=True)


def decode_step(runner, batch: int, new_tokens: int, repeats: int
                ) -> tuple[float, float, float, list[list[int]]]:
    """(decode step, t_1, t_N, the prompts) at `batch` rows, seconds; the step is
    (t_N - t_1) / (N - 1)."""
    prompts, copies = prompt_ids(runner.tok, batch)
    t1 = best_time(runner, prompts, copies, 1, repeats)
    tn = best_time(runner, prompts, copies, new_tokens, repeats)
    return (tn - t1) / (new_tokens - 1), t1, tn, prompts


def profile(runner, batches: list[int], new_tokens: int, repeats: int, bandwidth: float,
            weights: int, kv_per_token: float, name: str,
            compute_tok_s: float = float("inf")) -> list[dict]:
    """One row per batch size; `weights` in bytes, `compute_tok_s` the compute bound (none by
    default: the memory bound alone)."""
    rows = []
    for b in batches:
        step, t1, tn, prompts = decode_step(runner, b, new_tokens, repeats)
        context = sum(map(len, prompts)) / len(prompts) + new_tokens / 2
        memory = decode_bound(b, bandwidth, weights, kv_per_token * context)
        bound = min(memory, compute_tok_s)
        row = {"engine": name, "batch": b, "step_ms": 1e3 * step, "decode_tok_s": b / step,
               "call_tok_s": b * new_tokens / tn, "memory_bound_tok_s": memory,
               "compute_bound_tok_s": compute_tok_s, "bound_tok_s": bound,
               "of_bound": b / step / bound, "prefill_s": t1}
        rows.append(row)
        roof = "memory" if memory <= compute_tok_s else "compute"
        print(f"{name:5s} B={b:3d}: decode step {row['step_ms']:6.1f} ms, "
              f"{row['decode_tok_s']:6.1f} tokens/s = {row['of_bound']:4.0%} of the bound "
              f"({bound:.0f}, {roof}); call with prefill {row['call_tok_s']:6.1f} tokens/s",
              flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.measure.decode_profile",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="model name or path")
    p.add_argument("--engines", default="vllm,hf", help="comma-separated, of: vllm, hf")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    p.add_argument("--new-tokens", type=int, default=64, help="tokens every row generates")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="weights dtype")
    p.add_argument("--threads", type=int, default=1, help="threads of the engine")
    p.add_argument("--repeats", type=int, default=3, help="calls per figure (the best is kept)")
    p.add_argument("--block-size", type=int, default=None,
                   help="vLLM's KV block size (default: the rollout worker's, 32 on CPU)")
    p.add_argument("--compiled", action="store_true",
                   help="vLLM with torch.compile (the rollout worker runs it eager on a CPU)")
    p.add_argument("--ops", type=int, default=0, metavar="K",
                   help="also profile one call per batch size: its K costliest operators")
    p.add_argument("--json", default="", help="write every figure here")
    args = p.parse_args(argv)
    print(cpu_line(), flush=True)  # hosts with and without AMX give different figures
    engines = [e for e in args.engines.split(",") if e]
    bad = [e for e in engines if e not in ("vllm", "hf")]
    if bad or not engines:
        p.error(f"--engines: {args.engines!r}: allowed: vllm, hf")
    if args.new_tokens < 2 or min(args.batches) < 1:
        p.error("--new-tokens must be >= 2 and --batches >= 1")
    path = resolve_model(args.model)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    weights, kv_100 = decode_bytes(path, dtype, 100)
    bandwidth, flop_rate = read_bandwidth(args.threads), gemm_rate(args.threads, dtype=dtype)
    compute_tok_s = compute_bound(flop_rate, weights // (torch.finfo(dtype).bits // 8))
    print(f"{args.model} {args.dtype}: {weights / GB:.3f} GB of weights per decode step; "
          f"{args.threads} thread(s): read bandwidth {bandwidth / GB:.1f} GB/s, GEMM "
          f"{flop_rate / 1e9:.0f} GFLOP/s (compute bound {compute_tok_s:.0f} tokens/s at any B); "
          f"{args.new_tokens} new tokens a row", flush=True)
    rows = []
    for name in engines:  # vLLM first: it binds this process's OpenMP threads at start
        runner = (VLLMRunner(path, 512, args.threads, dtype, args.block_size, args.compiled)
                  if name == "vllm"
                  else HFEngine(path, args.threads, dtype))
        rows += profile(runner, args.batches, args.new_tokens, args.repeats, bandwidth,
                        weights, kv_100 / 100, name, compute_tok_s)
        for b in args.batches if args.ops else []:
            ops = op_shares(runner, b, args.new_tokens, args.ops)
            print_ops(name, b, ops)
            rows.append({"engine": name, "batch": b, "ops": ops})
        del runner
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "dtype": args.dtype,
                       "bandwidth_gb_s": bandwidth / GB, "gemm_gflop_s": flop_rate / 1e9,
                       "weights_gb": weights / GB,
                       "new_tokens": args.new_tokens, "cpu_count": os.cpu_count(),
                       "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
