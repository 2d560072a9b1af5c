"""Per-core decode and learner throughput of a preset's model, and its step projected to a
bigger box by the cost model (`tools.measure.cost_model`), from figures measured on this one.

    python -m tools.measure.shape_model Qwen/Qwen2-0.5B-Instruct runs/models/qwen2-0.5b-shape
    python -m tools.measure.cores --model runs/models/qwen2-0.5b-shape      # ~6 min on 2 cores
    python -m tools.measure.cores --model runs/models/qwen2-0.5b-shape --cores 14 --ram-gb 16

Each measurement runs in a process of its own (a process's torch threads are fixed once they
start), on a quiet machine:

* decode: `tools.measure.decode_profile`, the HF engine (the preset's rollout engine), B = 8 and 16
  rows at 1 thread and B = 16 at 2, --new-tokens tokens a row (EOS ignored); the decode step is the
  time per token step with prefill taken out, and its share of the roofline bound is printed; *
  learner: `tools.measure.learner_step`, LoRA, --seqs sequences of --completion-len tokens in one
  micro-batch, at 1 and 2 threads, the median of --learner-steps steps after a warm-up.

Then the projection: the preset's step (prompts_per_step x group_size completions of
max_new_tokens) on `--cores` cores split as `launch.plan.sizing` splits them for `--ram-gb`, by
`tools.measure.cost_model.predict`. The figures it needs but this script does not measure are stated
with the result (ASSUMED).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from common.device import cpu_line
from common.presets import get_preset
from launch.plan.sizing import split
from tools.measure.cost_model import ASSUMPTIONS, Calibration, Layout, describe, predict

ASSUMED = {
    "load_s": "a worker's load of a pushed adapter: its bytes copied at 1 GB/s (not measured)",
    "sync_s": "export + driver + Ray per step: cpu-demo's 0.29 s (measured on the 135M model)",
    "box_bandwidth": "the box's read bandwidth on all cores: --box-bandwidth (2-channel DDR5)",
    "call_steps": "every row decodes max_new_tokens (a trained policy stops earlier), plus the "
                  "prefill as measured at B = 16",
    "learner_s": "the learner's time grows with the completion tokens it trains (measured at "
                 "--completion-len, scaled to max_new_tokens)",
}


def run_json(module: str, args: list[str]) -> dict:
    """Run `python -m module args --json F` in a fresh process; F's contents."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        subprocess.run([sys.executable, "-m", module, *args, "--json", out], check=True)
        with open(out) as f:
            return json.load(f)


def measure(args) -> dict:
    """{decode_1, decode_2, learner_1, learner_2}: the four measurements' JSON."""
    decode = ["--model", args.model, "--engines", "hf", "--new-tokens", str(args.new_tokens),
              "--repeats", "2"]
    learner = ["--preset", args.preset, "--model", args.model, "--modes", "lora", "--rhos",
               str(get_preset(args.preset).grpo.entropy_rho), "--seqs", str(args.seqs),
               "--completion-len", str(args.completion_len), "--micro-batch", str(args.seqs),
               "--steps", str(args.learner_steps)]
    return {"decode_1": run_json("tools.measure.decode_profile", [*decode, "--batches", "8", "16",
                                                          "--threads", "1"]),
            "decode_2": run_json("tools.measure.decode_profile", [*decode, "--batches", "16",
                                                          "--threads", "2"]),
            "learner_1": run_json("tools.measure.learner_step", [*learner, "--threads", "1"]),
            "learner_2": run_json("tools.measure.learner_step", [*learner, "--threads", "2"])}


def calibration(m: dict, cfg, completion_len: int) -> Calibration:
    """The cost model's figures for `cfg`'s step from the measurements `m`."""
    d1 = {r["batch"]: r for r in m["decode_1"]["rows"]}
    d2 = {r["batch"]: r for r in m["decode_2"]["rows"]}
    s8, s16 = d1[8]["step_ms"] / 1e3, d1[16]["step_ms"] / 1e3
    b = (s16 - s8) / 8
    l1, l2 = m["learner_1"]["rows"][0], m["learner_2"]["rows"][0]
    adapter_mb = l1["export_mb"] * 2**20 / 1e6
    return Calibration(
        decode_a_s=max(s8 - 8 * b, 1e-6), decode_b_s=max(b, 1e-6),
        call_steps=cfg.rollout.max_new_tokens + d1[16]["prefill_s"] / s16,
        rollout_speedup_2=s16 / (d2[16]["step_ms"] / 1e3),
        learner_s=l1["median_s"] * cfg.rollout.max_new_tokens / completion_len,
        learner_speedup_2=l1["median_s"] / l2["median_s"],
        completions=m["learner_1"]["seqs"], load_s=adapter_mb / 1e3, sync_s=0.29,
        weights_gb=m["decode_1"]["weights_gb"], adapter_mb=adapter_mb)


def per_core_table(m: dict) -> list[str]:
    """Decode and learner tokens/s, in total and per core, at 1 and 2 threads."""
    lines = ["| role | threads | rows | tokens/s | tokens/s per core | of the roofline bound |",
             "|---|---|---|---|---|---|"]
    for key, threads in (("decode_1", 1), ("decode_2", 2)):
        for r in m[key]["rows"]:
            lines.append(f"| decode | {threads} | {r['batch']} | {r['decode_tok_s']:.1f} | "
                         f"{r['decode_tok_s'] / threads:.1f} | {r['of_bound']:.0%} "
                         f"(bound {r['bound_tok_s']:.0f}) |")
    for key, threads in (("learner_1", 1), ("learner_2", 2)):
        r, n = m[key]["rows"][0], m[key]
        lines.append(f"| learner | {threads} | {n['seqs']} x {n['completion_len']} | "
                     f"{r['tokens_per_s']:.1f} | {r['tokens_per_s'] / threads:.1f} | - |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.measure.cores", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="runs/models/qwen2-0.5b-shape", help="model path")
    p.add_argument("--preset", default="cpu-14core", help="the step and split to project")
    p.add_argument("--cores", type=int, default=14, help="cores of the box to project to")
    p.add_argument("--ram-gb", type=float, default=16.0, help="its memory (sizes the split)")
    p.add_argument("--box-bandwidth", type=float, default=60.0,
                   help="GB/s all its cores read together (an assumption)")
    p.add_argument("--new-tokens", type=int, default=16, help="decode: tokens a row")
    p.add_argument("--seqs", type=int, default=8, help="learner: sequences (one micro-batch)")
    p.add_argument("--completion-len", type=int, default=64, help="learner: tokens each")
    p.add_argument("--learner-steps", type=int, default=1, help="learner: timed steps")
    p.add_argument("--json", default="", help="also write the measurements and projection")
    args = p.parse_args(argv)
    print(cpu_line(), flush=True)  # hosts with and without AMX give different figures
    if not os.path.isdir(args.model):
        p.error(f"--model {args.model}: no such folder (build it with tools.measure.shape_model)")
    if args.cores < 2 or args.box_bandwidth <= 0 or args.new_tokens < 2:
        p.error("--cores must be >= 2, --box-bandwidth > 0 and --new-tokens >= 2")
    cfg = get_preset(args.preset)
    cfg.model.name = args.model
    sized, why = split(cfg, args.cores, args.ram_gb)
    m = measure(args)
    cal = calibration(m, sized, args.completion_len)
    ro = sized.rollout
    lay = Layout(args.cores, ro.num_workers, ro.threads_per_worker, ro.learner_threads,
                 -(-ro.prompts_per_step * ro.group_size // ro.num_workers))
    pr = predict(cal, lay, args.box_bandwidth)
    print("\n".join(per_core_table(m)))
    print(f"\nprojection: {args.preset}, {ro.prompts_per_step} x {ro.group_size} completions of "
          f"{ro.max_new_tokens} tokens; {why}\n  {describe(lay)}: {pr.step_s:.1f} s/step "
          f"(rollout {pr.rollout_s:.1f} s, learner {pr.learner_s:.1f} s), "
          f"{pr.completions_per_s:.2f} completions/s")
    print("calibration: " + ", ".join(f"{k} {v:.4g}" for k, v in vars(cal).items()))
    print("cost model:\n" + "\n".join(f"  - {a}" for a in ASSUMPTIONS))
    print("assumed here:\n" + "\n".join(f"  - {k}: {v}" for k, v in ASSUMED.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"measured": m, "calibration": vars(cal), "layout": vars(lay),
                       "step_s": pr.step_s, "completions_per_s": pr.completions_per_s}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
