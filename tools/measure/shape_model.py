"""A randomly initialised model of a hub model's exact shape, written to disk (no download).

    python -m tools.measure.shape_model Qwen/Qwen2-0.5B-Instruct runs/models/qwen2-0.5b-shape
    python -m launch.train --preset cpu-14core --model.name runs/models/qwen2-0.5b-shape ...

For measuring memory and speed at a real model's size where its weights cannot be downloaded:
the shape comes from `common.shapes.KNOWN`, the weights are stored in the real model's dtype
(bf16 for Qwen2, so the fp32 processes convert a private copy as they would for the real one),
and the tokenizer is the embedded model's (its ids all fall inside the larger vocabulary; the
model's outputs are random tokens, so every completion runs to max_new_tokens).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from common.config import ModelConfig
from common.models import resolve_model
from common.shapes import KNOWN, build_random_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.measure.shape_model",
                                description=__doc__.splitlines()[0])
    p.add_argument("shape", help=f"a model with built-in shapes: {', '.join(KNOWN)}")
    p.add_argument("out", help="directory to write (config, safetensors, tokenizer)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    shapes = KNOWN.get(args.shape.lower())
    if shapes is None:
        p.error(f"shape {args.shape!r}: allowed: {', '.join(KNOWN)}")
    import torch

    out = Path(args.out)
    model = build_random_model(shapes, dtype=getattr(torch, shapes.dtype), seed=args.seed)
    source = Path(resolve_model(ModelConfig().name))  # the embedded model: tokenizer only
    model.save_pretrained(out)
    for name in (*TOKENIZER_FILES, "generation_config.json"):  # its sampling settings too
        if (source / name).exists():
            shutil.copy(source / name, out / name)
    n = sum(t.numel() for t in model.parameters())
    print(f"{out}: random {args.shape} shape, {n / 1e6:.0f}M parameters in {shapes.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
