"""Greedy evaluation on held-out problems: accuracy, format rate, mean completion length.

    python -m launch.evaluate --model smollm2-135m-instruct --task arith --level 1 --n 200
    python -m launch.evaluate --model runs/<run>/final --task arith --level 1 --n 200
    python -m launch.evaluate --model runs/<run>/final --task gsm8k --data train.jsonl --n 100

`--model` takes an embedded name, a hub id, a local checkpoint, or a run's `final/` adapter.
Prints one JSON object; `--out FILE.json` writes it too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from tqdm import tqdm

from launch.cli import OneLineParser
from launch.models import (
    ModelNotFoundError,
    cpu_supports_bf16,
    load_model,
    load_tokenizer,
    resolve_model,
)
from rewards import DatasetError, VerifierPool, format_prompt, make_task


def load_for_eval(name_or_path: str, dtype: torch.dtype):
    """(model, tokenizer); a run's LoRA `final/` is loaded onto its base and merged."""
    meta = os.path.join(name_or_path, "homerl.json")
    if os.path.exists(meta):
        with open(meta) as f:
            info = json.load(f)
        if info["kind"] == "adapter":
            from peft import PeftModel

            base_path = resolve_model(info["base_model"])
            base = load_model(base_path, dtype=dtype)
            model = PeftModel.from_pretrained(base, name_or_path).merge_and_unload()
            return model.eval(), load_tokenizer(base_path)
    path = resolve_model(name_or_path)
    return load_model(path, dtype=dtype).eval(), load_tokenizer(path)


@torch.no_grad()
def greedy_complete(model, tokenizer, questions: list[str], max_new_tokens: int,
                    batch_size: int = 32, desc: str = "eval") -> list[str]:
    """Greedy completions for chat-formatted questions, batched, with a progress bar."""
    prompts = [format_prompt(tokenizer, q) for q in questions]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # less padding
    out: list[str] = [""] * len(prompts)
    for s in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch", file=sys.stderr):
        idx = order[s: s + batch_size]
        enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True,
                        add_special_tokens=False)
        gen = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for i, t in zip(idx, texts):
            out[i] = t
    return out


def evaluate(model, tokenizer, samples: list[dict], max_new_tokens: int = 64,
             batch_size: int = 32, desc: str = "eval") -> dict:
    """Score greedy completions of `samples`: accuracy, strict accuracy, format rate, n, length.

    accuracy: right final number by any extraction rule; strict: right and in the asked
    `Answer: N` final-line format; format_rate: share in that format.
    """
    t0 = time.perf_counter()
    texts = greedy_complete(model, tokenizer, [s["question"] for s in samples], max_new_tokens,
                            batch_size, desc)
    with VerifierPool() as pool:
        results = pool.score(texts, [s["answer"] for s in samples])
    n = len(samples)
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    return {
        "accuracy": sum(r.score for r in results) / n,
        "strict_accuracy": sum(r.score * (r.format_score == 1.0) for r in results) / n,
        "format_rate": sum(r.format_score == 1.0 for r in results) / n,
        "n": n,
        "mean_completion_tokens": sum(lengths) / n,
        "errors": sum(r.error is not None for r in results),
        "wall_s": time.perf_counter() - t0,
        "examples": [{"question": s["question"], "answer": s["answer"], "completion": t}
                     for s, t in list(zip(samples, texts))[:3]],
    }


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
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
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
                  batch_size: int) -> list[dict]:
    """Every model on every set: [{"model", "sets": {set: result}}]."""
    out = []
    for name in models:
        model, tok = load_for_eval(name, dtype)
        out.append({"model": name, "sets": {
            s: evaluate(model, tok, samples, max_new_tokens, batch_size, desc=f"{s}")
            for s, samples in sets.items()}})
    return out


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.n < 1:
        print("launch.evaluate: error: --n: must be >= 1", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    bf16 = args.dtype == "bf16" or (args.dtype == "auto" and cpu_supports_bf16())
    spec = args.sets or (f"arith-{args.level}" if args.task == "arith" else "gsm8k")
    try:
        sets = heldout_sets(spec, args.n, args.data)
        results = evaluate_many(args.model, sets, torch.bfloat16 if bf16 else torch.float32,
                                args.max_new_tokens, args.batch_size)
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
