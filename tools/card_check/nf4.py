"""Do the CPU and CUDA NF4 kernels agree? The learner quantises on its device; workers
dequantise the learner's own bytes on the CPU (`common.quant.nf4_state` ->
`dequantize_state`). This prints, on one model of a known shape at random init:

  - whether quantising the same checkpoint on the CPU and on CUDA gives the same bytes
    (why workers take the learner's bytes instead of quantising themselves);
  - the largest difference between the CPU's dequantisation of the learner's CUDA bytes
    and CUDA's own (what a worker serves against what the learner multiplies by).

    python -m tools.card_check.nf4                 # on a CUDA machine with bitsandbytes
    python -m tools.card_check.nf4 --cpu           # the script's own check: CPU against CPU
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

import torch

from common.quant import dequantize_state, load_nf4_model, nf4_state
from common.shapes import KNOWN, Shapes, build_random_model

TINY = Shapes(layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1, head_dim=32,
              vocab=300, tied=True)
"""the --cpu check's shape"""


def compare(path: str, device: str) -> dict:
    """Quantise `path` on the CPU and on `device`; compare bytes and dequantised weights."""
    from bitsandbytes.functional import dequantize_4bit
    from bitsandbytes.nn import Linear4bit

    on_dev = load_nf4_model(path, torch.float32, device=device)
    dev_state = nf4_state(on_dev)
    cpu_state = nf4_state(load_nf4_model(path, torch.float32, device="cpu"))
    same_bytes = sum(torch.equal(dev_state[k]["data"], cpu_state[k]["data"]) for k in dev_state)
    from_bytes = dequantize_state(dev_state)  # what a worker serves, dequantised on the CPU
    worst = 0.0
    for name, module in on_dev.named_modules():
        if isinstance(module, Linear4bit):
            w = module.weight
            ref = dequantize_4bit(w.data, w.quant_state).float().cpu()  # the device's kernel
            worst = max(worst, (from_bytes[f"{name}.weight"] - ref).abs().max().item())
    return {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "layers": len(dev_state), "layers_same_bytes_cpu_vs_device": same_bytes,
            "max_abs_diff_cpu_dequant_vs_device_dequant": worst}


def run_compare(model: str = "qwen/qwen2-0.5b-instruct", cpu: bool = False) -> dict:
    """`compare` on a random model of `model`'s shape (TINY with `cpu`), written to a
    temporary directory."""
    shapes = TINY if cpu else KNOWN[model.lower()]
    with tempfile.TemporaryDirectory(prefix="homerl-nf4-") as path:
        build_random_model(shapes, torch.bfloat16).save_pretrained(path)
        return compare(path, "cpu" if cpu else "cuda")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.card_check.nf4", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen/qwen2-0.5b-instruct", help="shape: " +
                   ", ".join(KNOWN))
    p.add_argument("--cpu", action="store_true", help="tiny shape, both sides on the CPU")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("tools.card_check.nf4: error: no CUDA GPU visible (--cpu checks the script itself)",
              file=sys.stderr)
        return 2
    res = run_compare(args.model, cpu=args.cpu)
    print(f"{res['device']}: {res['layers_same_bytes_cpu_vs_device']}/{res['layers']} layers "
          f"quantise to the same bytes on the CPU and the device; CPU dequantisation of the "
          f"device's bytes vs the device's own: max |diff| "
          f"{res['max_abs_diff_cpu_dequant_vs_device_dequant']:.3g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
