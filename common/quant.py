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


def _plain_name(name: str) -> str:
    """A module's name in the plain model: peft's wrapping ("base_model.model." in front,
    ".base_layer" for an adapted linear) removed, so a learner's names match a worker's."""
    return name.removeprefix("base_model.model.").removesuffix(".base_layer")


@torch.no_grad()
def nf4_state(model) -> dict[str, dict]:
    """{'<module>.weight': {'data': packed uint8, 'quant_state': its tensors}} of every NF4
    linear of `model` (a plain or peft-wrapped NF4 model), on the CPU: the exact bytes the
    learner multiplies by, for a worker to dequantise (one source of truth: a worker that
    quantised the checkpoint itself, on another device's kernel, could hold other bytes)."""
    from bitsandbytes.nn import Linear4bit

    out = {}
    for name, module in model.named_modules():
        if isinstance(module, Linear4bit):
            w = module.weight
            qs = {k: v.cpu() if isinstance(v, torch.Tensor) else v
                  for k, v in w.quant_state.as_dict(packed=True).items()}
            out[f"{_plain_name(name)}.weight"] = {"data": w.data.cpu(), "quant_state": qs}
    if not out:
        raise ValueError("bitsandbytes quantised no linear layer (nothing to dequantise)")
    return out


@torch.no_grad()
def dequantize_state(state: dict[str, dict], as_float: bool = True) -> dict[str, torch.Tensor]:
    """{'<module>.weight': tensor} from `nf4_state`'s bytes, dequantised on the CPU (in the
    dtype they were quantised from; fp32 with `as_float`, an exact widening)."""
    from bitsandbytes.functional import QuantState, dequantize_4bit

    out = {}
    for key, item in state.items():
        qs = QuantState.from_dict(item["quant_state"], device=torch.device("cpu"))
        t = dequantize_4bit(item["data"], qs)
        out[key] = t.float() if as_float else t.clone()
    return out


def dequantized_nf4_weights(path: str, compute_dtype: torch.dtype = torch.float32,
                            as_float: bool = True, state: dict | None = None
                            ) -> dict[str, torch.Tensor]:
    """{'<module>.weight': tensor} of every NF4 linear layer of `path`, dequantised.

    `state`: the learner's own NF4 bytes (`nf4_state`, what a run's workers get). Without it,
    the model is quantised here through `load_nf4_model` on the CPU, as the learner does, and
    freed before returning (a worker outside a run: evaluation). bitsandbytes dequantises into
    the dtype the weights were quantised from (the checkpoint's: bf16 for the hub's Qwen2
    models); `as_float` widens them to fp32 (exact, twice the bytes), which a worker merging
    LoRA into them needs; False keeps that dtype.
    """
    if state is None:
        model = load_nf4_model(path, compute_dtype)
        try:
            state = nf4_state(model)
        except ValueError:
            raise ValueError(f"{path}: bitsandbytes quantised no linear layer (nothing to "
                             "dequantise)") from None
        del model
    return dequantize_state(state, as_float)
