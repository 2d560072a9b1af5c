"""One 8 GB card, measured: a learner step and a rollout of the gpu-8gb preset on a real GPU.

    python -m tools.gpu_smoke --gpu-memory-gb 8                 # the preset's 1.5B, random init
    python -m tools.gpu_smoke --gpu-memory-gb 8 --two-process   # learner and engine processes
    python -m tools.gpu_smoke --gpu-memory-gb 8 --model qwen/qwen2.5-1.5b-instruct --group 4

Needs only PyTorch (CUDA), transformers and peft; bitsandbytes is optional (NF4 QLoRA with it,
a bf16 LoRA base without); no Ray, no vLLM, no download: the model is randomly initialised with
the exact shape of the named model (common/shapes.py) and written to a temporary directory.

What it runs, in one process capped to `--gpu-memory-gb` of the card (torch's per-process
fraction): the preset's learner (LoRA r=16, gradient checkpointing, entropy-selected tokens,
micro-batches of 4) for one warm-up and one timed step on G x prompts sequences of
prompt + completion tokens; then the HF rollout engine (the policy's base in bf16 on the card
beside the resident learner, as the time-sliced card holds it) sampling G x prompts completions
of up to max_new_tokens. It prints each phase's peak GPU memory next to launch.plan's estimate,
and s/step = learner step + rollout.

`--two-process` runs them as the preset does, a learner process and an engine process taking
turns on the device for `--steps` steps (tools/gpu_share.py): per phase and process the peak
against the plan, the two processes summed per phase against the cap, s/step.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time

import numpy as np
import torch

from common.device import torch_dtype
from common.shapes import KNOWN, Shapes, build_random_model
from common.types import TrainBatch
from launch import plan
from launch.presets import get_preset

GiB = 2**30
TINY = Shapes(layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1, head_dim=32,
              vocab=300, tied=True)
"""the --cpu check's shape"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="tools.gpu_smoke", description=__doc__.splitlines()[0])
    p.add_argument("--gpu-memory-gb", type=float, default=8.0, help="cap the card to this")
    p.add_argument("--model", default="deepseek-ai/deepseek-r1-distill-qwen-1.5b",
                   help=f"shape to build: {', '.join(KNOWN)}")
    p.add_argument("--group", type=int, default=8, help="G completions per prompt")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--two-process", action="store_true",
                   help="learner and engine in two processes taking turns on the device")
    p.add_argument("--steps", type=int, default=3, help="steps of --two-process")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--cpu", action="store_true",
                   help="run the same code on the CPU with a tiny shape (a check of this script "
                        "on a machine without a GPU; its memory figures are 0)")
    return p.parse_args(argv)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _reset_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_gb() -> float:
    return torch.cuda.max_memory_reserved() / GiB if torch.cuda.is_available() else 0.0


def config(args, path: str, qlora: bool):
    cfg = get_preset("gpu-8gb")
    cfg.model.name, cfg.model.gpu_memory_gb = path, args.gpu_memory_gb
    cfg.lora.mode = "qlora" if qlora else "lora"
    r = cfg.rollout
    r.engine = "hf"  # what this script samples with: the plan then counts that engine
    r.group_size, r.prompts_per_step = args.group, args.prompts
    r.max_prompt_tokens, r.max_new_tokens = args.prompt_tokens, args.new_tokens
    return cfg


def batch(cfg, vocab: int, seed: int = 0) -> TrainBatch:
    rng = np.random.default_rng(seed)
    r = cfg.rollout
    prompts = [list(rng.integers(100, vocab, r.max_prompt_tokens))
               for _ in range(r.prompts_per_step)]
    n = r.prompts_per_step * r.group_size
    comps = [list(rng.integers(100, vocab, r.max_new_tokens)) for _ in range(n)]
    return TrainBatch([prompts[i // r.group_size] for i in range(n)], comps,
                      [rng.uniform(-3, -0.1, len(c)).astype(np.float32) for c in comps],
                      [rng.uniform(0, 4, len(c)).astype(np.float32) for c in comps],
                      rng.normal(size=n).astype(np.float32))


def learner_phase(cfg, vocab: int) -> tuple[object, float, float]:
    """(learner, timed step seconds, peak GiB of the learn phase)."""
    from learner.learner import Learner

    learner = Learner(cfg)
    b = batch(cfg, vocab)
    learner.train_on(b)  # warm-up: allocator, kernels
    _sync()
    _reset_peak()
    t0 = time.perf_counter()
    learner.train_on(batch(cfg, vocab, seed=1))
    _sync()
    return learner, time.perf_counter() - t0, _peak_gb()


def rollout_phase(cfg, path: str, vocab: int, device: str) -> tuple[float, int, float]:
    """(seconds, tokens, peak GiB) of sampling G x prompts completions beside the learner."""
    from transformers import AutoModelForCausalLM

    from actors.sampling import BehaviourRecorder, hf_generation_config

    r = cfg.rollout
    dtype = torch_dtype(cfg.model.dtype, device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    gen = hf_generation_config(r.max_new_tokens, [vocab + 1], 0)  # an EOS it never samples
    gen.return_dict_in_generate = True
    rng = np.random.default_rng(2)
    ids = torch.tensor([list(rng.integers(100, vocab, r.max_prompt_tokens))
                        for _ in range(r.prompts_per_step) for _ in range(r.group_size)],
                       device=device)
    _reset_peak()
    t0 = time.perf_counter()
    with torch.no_grad():
        recorder = BehaviourRecorder(1.0)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             generation_config=gen, logits_processor=[recorder])
        recorder.finish(out.sequences[:, ids.shape[1]:])
    _sync()
    tokens = int(out.sequences[:, ids.shape[1]:].numel())
    return time.perf_counter() - t0, tokens, _peak_gb()


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("tools.gpu_smoke: error: no CUDA GPU visible to PyTorch (--cpu checks the script "
              "itself on a CPU)", file=sys.stderr)
        return 2
    qlora = _versions()["bitsandbytes"] is not None
    print("NF4 QLoRA (bitsandbytes imports)" if qlora else
          "bitsandbytes does not import: LoRA on a bf16 base, not NF4 QLoRA")
    shapes = TINY if args.cpu else KNOWN[args.model.lower()]
    device = "cpu" if args.cpu else "cuda"
    with tempfile.TemporaryDirectory(prefix="homerl-smoke-") as path:
        build_random_model(shapes, torch.bfloat16).save_pretrained(path)
        cfg = config(args, path, qlora)
        if args.two_process:
            return _two_process(args, cfg, path, shapes, device)
        rows = plan.budget(cfg, shapes)
        est = plan.phases(rows)
        learner, step_s, learn_peak = learner_phase(cfg, shapes.vocab)
        roll_s, tokens, roll_peak = rollout_phase(cfg, path, shapes.vocab, device)
    # one process: the card holds one CUDA context, the plan counts one per process
    ctx = plan.CUDA_CONTEXT / GiB
    result = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "cap_gb": args.gpu_memory_gb,
        "versions": {"torch": torch.__version__, "python": platform.python_version(),
                     **_versions()},
        "model": "tiny (--cpu)" if args.cpu else args.model, "lora_mode": cfg.lora.mode,
        "group": args.group,
        "prompts": args.prompts, "tokens": [args.prompt_tokens, args.new_tokens],
        "learner_step_s": step_s, "rollout_s": roll_s, "rollout_tokens": tokens,
        "s_per_step": step_s + roll_s,
        "learn_peak_gb": learn_peak + ctx, "learn_plan_gb": (est["learn"] - plan.CUDA_CONTEXT)
        / GiB,
        "rollout_peak_gb": roll_peak + ctx, "rollout_plan_gb": est["rollout"] / GiB - ctx,
    }
    for phase in ("learn", "rollout"):
        got, want = result[f"{phase}_peak_gb"], result[f"{phase}_plan_gb"]
        print(f"{phase:<8} peak {got:5.2f} GiB (reserved + 1 CUDA context), plan {want:5.2f} "
              f"GiB, {100 * (got - want) / max(want, 1e-9):+.0f}%")
    print(f"s/step {result['s_per_step']:.1f} (learner {step_s:.1f} s + rollout {roll_s:.1f} s, "
          f"{tokens} tokens); {result['device']}, cap {args.gpu_memory_gb:g} GiB, "
          f"{cfg.lora.mode}, G={args.group}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def _two_process(args, cfg, path: str, shapes, device: str) -> int:
    from tools.gpu_share import report, run_two_process

    if args.cpu:
        cfg.rollout.threads_per_worker = cfg.rollout.learner_threads = 1
    res = run_two_process(cfg, path, shapes, args.steps, args.gpu_memory_gb)
    res |= {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "model": "tiny (--cpu)" if args.cpu else args.model, "lora_mode": cfg.lora.mode,
            "group": args.group, "prompts": args.prompts,
            "tokens": [args.prompt_tokens, args.new_tokens],
            "versions": {"torch": torch.__version__, "python": platform.python_version(),
                         **_versions()}}
    print(f"two processes on {res['device']}, cap {args.gpu_memory_gb:g} GiB, {cfg.lora.mode}, "
          f"G={args.group} x {args.prompts} prompts, {args.prompt_tokens} + {args.new_tokens} "
          f"tokens, {args.steps} steps" + ("; CPU: resident memory stands in for the card, "
                                           "the weights' move is simulated" if args.cpu else ""))
    print(report(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def _versions() -> dict:
    """Installed versions; bitsandbytes None when it does not import (e.g. no kernels)."""
    import importlib.metadata as md

    out = {}
    for name in ("transformers", "peft", "bitsandbytes"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    try:
        import bitsandbytes  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or kernels that fail to load
        out["bitsandbytes"] = None
    return out


if __name__ == "__main__":
    sys.exit(main())
