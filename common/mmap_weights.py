"""Tensors of a safetensors file as views of its pages, not copies.

    tensors = mmap_tensors("model.safetensors", {"model.layers.0.mlp.up_proj.weight"})

A process that keeps a model's base weights only to read them (a vLLM worker's W0 for LoRA
merges) holds them as a copy-on-write map of the file: the page cache pages are shared with
every other process that maps the same file (the learner's loaded model), so PSS counts them
once across processes instead of once per private copy. Nothing is written back to the file.
A tensor whose offset is not aligned to its element size is copied instead.
"""

from __future__ import annotations

import json
import mmap
import struct

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
          "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}


def read_header(path: str) -> tuple[dict, int]:
    """({name: {dtype, shape, data_offsets}}, byte offset of the data section)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def mmap_tensors(path: str, names: set[str] | None = None) -> dict[str, torch.Tensor]:
    """{name: tensor} for `names` present in the file (all when None), in the stored dtype,
    each a view of a private (copy-on-write) map of the file."""
    header, start = read_header(path)
    wanted = [k for k in header if names is None or k in names]
    if not wanted:
        return {}
    with open(path, "rb") as f:
        pages = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # writable: no torch warning
    out = {}
    for name in wanted:
        info = header[name]
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: {name} has dtype {info['dtype']}; allowed: "
                             f"{', '.join(DTYPES)}")
        lo, hi = info["data_offsets"]
        size = torch.empty((), dtype=dtype).element_size()
        count = (hi - lo) // size
        view = torch.frombuffer(pages, dtype=dtype, count=count, offset=start + lo)
        if (start + lo) % size:
            view = view.clone()  # unaligned: a copy, not a slow or failing view
        out[name] = view.reshape(info["shape"])
    return out
