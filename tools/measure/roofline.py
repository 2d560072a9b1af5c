"""Roofline bound on decode tokens/s for the cpu-demo model on this machine: memory and compute.

    python -m tools.measure.roofline  # measure bandwidth, print the bound at B = 1, 16
    python -m tools.measure.roofline --measured 30.5 --batch 16   # also: the fraction a run reached

Decoding one token for each of B sequences reads every weight once (B shares the read) plus the
KV cache of all B sequences, so tokens/s <= B * bandwidth / (weight bytes + B * KV bytes). Each
token also costs 2 FLOPs per weight of a matrix product (attention over the context adds ~3% at
100 tokens, left out), so tokens/s <= GEMM FLOP/s / (2 * weights). The bound is the lower of the
two: at a few rows the weight reads bind, at many the arithmetic. Both rates are measured, not
looked up: the best of several streaming reads (a sum over a tensor much larger than the
caches), and the best of several fp32 1024^3 GEMMs, with 1 thread and with all threads.
"""

from __future__ import annotations

import argparse
import time

import torch

from common.device import cpu_line
from common.models import load_model, resolve_model

GB = 1e9


def best_seconds(fn, repeats: int) -> float:
    """The fastest of `repeats` timed calls of `fn`, seconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def read_bandwidth(threads: int, nbytes: int = 2 * 2**30, repeats: int = 5) -> float:
    """Best streaming read rate in bytes/s: sum over an fp32 tensor of `nbytes`."""
    torch.set_num_threads(threads)
    x = torch.ones(nbytes // 4, dtype=torch.float32)
    return nbytes / best_seconds(x.sum, repeats)


def gemm_rate(threads: int, n: int = 1024, repeats: int = 5,
              dtype: torch.dtype = torch.float32) -> float:
    """Best FLOP/s of an n x n x n matrix product in `dtype` on `threads` threads."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # first call: the library's set-up
    return 2 * n**3 / best_seconds(lambda: a @ b, repeats)


def decode_bytes(model_name: str, dtype: torch.dtype, context: int) -> tuple[int, int]:
    """(weight bytes read per decode step, KV-cache bytes per sequence at `context` tokens)."""
    model = load_model(resolve_model(model_name), dtype=dtype)
    c = model.config
    size = torch.finfo(dtype).bits // 8
    weights = sum(p.numel() for p in model.parameters()) * size  # the tied LM head counted once
    head_dim = c.hidden_size // c.num_attention_heads
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * context * size
    return weights, kv


def decode_bound(batch: int, bandwidth: float, weight_bytes: float, kv_bytes: float) -> float:
    """Tokens/s bound of decoding `batch` sequences: each step reads the weights once and every
    sequence's KV cache (`kv_bytes` each) at `bandwidth` bytes/s."""
    return batch * bandwidth / (weight_bytes + batch * kv_bytes)


def compute_bound(flop_rate: float, weights: int) -> float:
    """Tokens/s bound from the arithmetic: 2 FLOPs per weight per token at `flop_rate` FLOP/s
    (`weights`: parameters in matrix products; whatever the batch)."""
    return flop_rate / (2 * weights)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.measure.roofline", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="model name or path")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="weights dtype")
    p.add_argument("--context", type=int, default=100, help="mean tokens in the KV cache")
    p.add_argument("--batch", type=int, default=16, help="sequences decoded together (B)")
    p.add_argument("--measured", type=float, default=None, help="tokens/s a run reached")
    args = p.parse_args(argv)
    print(cpu_line(), flush=True)  # hosts with and without AMX give different figures
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    weights, kv = decode_bytes(args.model, dtype, args.context)
    print(f"{args.model} {args.dtype}: {weights / GB:.3f} GB of weights per decode step, "
          f"{kv / 1e6:.2f} MB KV cache per sequence at {args.context} tokens")
    threads = torch.get_num_threads()
    size = torch.finfo(dtype).bits // 8
    for t in sorted({1, threads}):
        bw, flops = read_bandwidth(t), gemm_rate(t, dtype=dtype)
        roof = compute_bound(flops, weights // size)
        print(f"read bandwidth, {t} thread(s): {bw / GB:.1f} GB/s; {args.dtype} GEMM "
              f"{flops / 1e9:.0f} GFLOP/s: compute bound {roof:.0f} tokens/s")
        for b in sorted({1, args.batch}):
            bound = min(decode_bound(b, bw, weights, kv), roof)
            line = f"  bound at B={b}: {bound:.0f} tokens/s"
            if args.measured is not None and b == args.batch:
                line += f"; measured {args.measured:.1f} = {args.measured / bound:.0%} of it"
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
