"""What an fp32 rollout worker's LoRA merges cost in memory: W0 kept compact (bf16, merged in
place, when the base is all bf16 numbers) against kept as loaded (merged into new tensors).

    python -m tools.shape_model Qwen/Qwen2-0.5B-Instruct runs/models/qwen2-0.5b-shape
    python -m tools.bench_merge runs/models/qwen2-0.5b-shape --preset cpu-14core

Each mode runs in its own fresh process, side by side in one invocation: load the model in fp32
as the HF worker does, apply two random LoRA updates of the preset's rank and target modules,
and report the process's RSS and PSS after loading and after the merges (GiB).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

GiB = 2**30


def measure(path: str, preset: str, compact: bool) -> dict:
    """In this process: load, merge twice, and the memory before and after (GiB)."""
    import numpy as np
    import psutil
    import torch

    from actors.weights import WeightApplier
    from common.memory import release_free_memory
    from common.models import load_model
    from common.types import WeightUpdate
    from launch.presets import get_preset

    cfg, proc = get_preset(preset), psutil.Process()

    def mem() -> dict:
        info = proc.memory_full_info()
        return {"rss": info.rss / GiB, "pss": info.pss / GiB}

    model = load_model(path, torch.float32)
    loaded = mem()
    applier, g = WeightApplier(model, merge=True, compact_base=compact), np.random.default_rng(0)
    targets = [n for n, m in model.named_modules()
               if n.rsplit(".", 1)[-1] in cfg.lora.modules() and hasattr(m, "weight")]
    for version in (1, 2):
        tensors = {}
        for name in targets:
            out_f, in_f = dict(model.named_modules())[name].weight.shape
            tensors[f"{name}.lora_A"] = g.standard_normal((cfg.lora.r, in_f), np.float32)
            tensors[f"{name}.lora_B"] = g.standard_normal((out_f, cfg.lora.r), np.float32)
        applier.apply(WeightUpdate("lora", version, tensors, cfg.lora.alpha / cfg.lora.r))
        del tensors
        release_free_memory()
    base_bytes = sum(t.numel() * t.element_size() for t in applier.base.values())
    return {"loaded": loaded, "merged": mem(), "w0_gib": base_bytes / GiB,
            "modules": len(targets)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.bench_merge", description=__doc__.splitlines()[0])
    p.add_argument("model", help="a local model directory (e.g. from tools.shape_model)")
    p.add_argument("--preset", default="cpu-14core", help="LoRA rank and target modules from it")
    p.add_argument("--child", choices=["compact", "plain"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.model, args.preset, args.child == "compact")))
        return 0
    out = {}
    for mode in ("compact", "plain"):
        res = subprocess.run([sys.executable, "-m", "tools.bench_merge", args.model,
                              "--preset", args.preset, "--child", mode],
                             capture_output=True, text=True)
        if res.returncode:
            sys.exit(f"tools.bench_merge: the {mode} run failed: {res.stderr.strip()[-400:]}")
        out[mode] = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"{'W0 kept':<10}{'W0 GiB':>8}{'RSS load':>10}{'RSS merged':>12}{'PSS merged':>12}"
          f"{'growth':>8}")
    for mode, r in out.items():
        growth = r["merged"]["rss"] - r["loaded"]["rss"]
        print(f"{mode:<10}{r['w0_gib']:>8.2f}{r['loaded']['rss']:>10.2f}"
              f"{r['merged']['rss']:>12.2f}{r['merged']['pss']:>12.2f}{growth:>8.2f}")
    c, q = out["compact"]["merged"]["pss"], out["plain"]["merged"]["pss"]
    print(f"PSS after merges, compact / plain: {c:.2f} / {q:.2f} GiB = {c / q:.2f} "
          f"({out['compact']['modules']} adapted linears)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
