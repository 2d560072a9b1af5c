"""The NF4 (bitsandbytes 4-bit) base that QLoRA trains on, for the learner and the workers.

The learner trains LoRA adapters on a base whose linear weights are NF4-quantised; a rollout
worker that sampled from the original weights would sample from a different policy than the
one the learner scores (the quantisation error is far above float noise). So every role builds
the base the same way, with `nf4_config`, and a worker that cannot run bitsandbytes kernels
decodes from the dequantised NF4 weights (`dequantized_nf4_weights`), which are exactly what
the learner's 4-bit layers multiply by (bitsandbytes dequantises, then runs a plain matmul in
the compute dtype).
"""

from __future__ import annotations

import torch


def nf4_config(compute_dtype: torch.dtype):
    """The one BitsAndBytesConfig of this project: NF4, double quantisation, `compute_dtype`."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_compute_dtype=compute_dtype,
                              bnb_4bit_use_double_quant=True)


def load_nf4_model(path: str, compute_dtype: torch.dtype, device: str = "cpu"):
    """A causal LM from `path` with its linear layers in NF4 (bitsandbytes runs on CPU too)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, quantization_config=nf4_config(compute_dtype),
        device_map={"": 0 if device == "cuda" else device})


@torch.no_grad()
def dequantized_nf4_weights(path: str, compute_dtype: torch.dtype = torch.float32,
                            as_float: bool = True) -> dict[str, torch.Tensor]:
    """{'<module>.weight': tensor} of every NF4 linear layer of `path`, dequantised.

    Loads the model once through `load_nf4_model` on the CPU (as the learner does), so the
    values are those the learner's base holds, and frees it before returning. bitsandbytes
    dequantises into the dtype the weights were quantised from (the checkpoint's: bf16 for the
    hub's Qwen2 models); `as_float` widens them to fp32 (exact, twice the bytes), which a
    worker merging LoRA into them needs; False keeps that dtype.
    """
    from bitsandbytes.functional import dequantize_4bit
    from bitsandbytes.nn import Linear4bit

    model = load_nf4_model(path, compute_dtype)
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, Linear4bit):
            w = module.weight
            t = dequantize_4bit(w.data, w.quant_state)
            out[f"{name}.weight"] = t.float().clone() if as_float else t.clone()
    del model
    if not out:
        raise ValueError(f"{path}: bitsandbytes quantised no linear layer (nothing to dequantise)")
    return out
