"""Rollout calls as the vLLM worker makes them, with and without n-gram speculative decoding.

    python -m tools.spec_probe                 # 10 calls plain, then 10 with 3 drafted tokens
    python -m tools.spec_probe --draft 0 1 3 --calls 20

Each call: 2 level-1 arithmetic prompts x G=8 completions, temperature 0.8, up to 40 new
tokens, stopping at EOS (the cpu-demo rollout), one thread, the engine the worker uses
(`actors.vllm_engine`, prefix caching on, log-probs of the sampled tokens). --draft K > 0 adds
vLLM's n-gram proposer (prompt lookup of 2-4 tokens, K drafted tokens a step). Prints per
setting the median call time, tokens/s, tokens a completion, and how many sampled tokens came
back with a log-prob that is not a number: the learner's importance ratio needs every one.
Each setting runs in a process of its own (`isolated`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time

from common.models import resolve_model
from rewards import format_prompt, make_task
from tools.decode_profile import VLLMRunner

RESULT = "spec_probe result: "  # a child's result line on stdout


def probe(draft: int, calls: int, model: str) -> dict:
    spec = None if draft == 0 else {"method": "ngram", "num_speculative_tokens": draft,
                                    "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    runner = VLLMRunner(resolve_model(model), 512, 1, speculative=spec)
    tok, task = runner.tok, make_task("arith", 1, None, 0)
    times, tokens, bad, example = [], 0, 0, ""
    for call in range(calls + 1):  # call 0 warms up
        texts = [format_prompt(tok, task.train_sample(100 + 2 * call + i)["question"])
                 for i in range(2)]
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        params = [runner.engine.params(8, call * 16 + i * 8, 0.8, 40, [tok.eos_token_id])
                  for i in range(2)]
        t0 = time.perf_counter()
        rows = runner.engine.generate(ids, params)
        dt = time.perf_counter() - t0
        comps = [c for row in rows for c in row]
        if call:
            times.append(dt)
            tokens += sum(len(c.token_ids) for c in comps)
            bad += sum(not math.isfinite(x) for c in comps for x in c.logprobs)
            example = example or tok.decode(comps[0].token_ids)
    del runner
    return {"draft": draft, "call_s": statistics.median(times), "lo": min(times),
            "hi": max(times), "tok_s": tokens / sum(times), "per_completion": tokens / (16 * calls),
            "nan": bad, "tokens": tokens, "example": example}


def isolated(draft: int, calls: int, model: str) -> dict:
    """`probe` in a fresh process: once vLLM's n-gram proposer has loaded numba into a process,
    a later vLLM engine start there fails (vLLM 0.32's kernel rebinding trips over a numba
    object), so each setting gets a process of its own."""
    out = subprocess.run([sys.executable, "-m", "tools.spec_probe", "--one", str(draft),
                          "--calls", str(calls), "--model", model],
                         capture_output=True, text=True, check=False)
    lines = [x for x in out.stdout.splitlines() if x.startswith(RESULT)]
    if out.returncode or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"spec_probe: --draft {draft} failed (exit {out.returncode}): {tail}")
    return json.loads(lines[-1][len(RESULT):])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.spec_probe", description=__doc__.splitlines()[0])
    p.add_argument("--draft", type=int, nargs="+", default=[0, 3],
                   help="drafted tokens a step, per setting (0: no speculative decoding)")
    p.add_argument("--calls", type=int, default=10, help="timed calls per setting")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child's setting
    args = p.parse_args(argv)
    if args.calls < 1 or min(args.draft) < 0:
        p.error("--calls must be >= 1 and --draft >= 0")
    if args.one is not None:
        print(RESULT + json.dumps(probe(args.one, args.calls, args.model)), flush=True)
        return 0
    for d in args.draft:
        r = isolated(d, args.calls, args.model)
        print(f"draft {d}: call median {r['call_s']:.2f} s (range {r['lo']:.2f}-{r['hi']:.2f}), "
              f"{r['tok_s']:.1f} tokens/s, {r['per_completion']:.1f} tokens a completion, "
              f"{r['nan']} of {r['tokens']} log-probs not a number; e.g. {r['example']!r}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
