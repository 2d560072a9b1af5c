"""Weight export for rollout workers and the final checkpoint.

The export is a `common.types.WeightUpdate` of numpy arrays, so Ray stores it once in the
object store and every worker on a node maps the same buffers (numpy arrays deserialize
zero-copy):

    WeightUpdate("lora", v, {"model.layers.0.self_attn.q_proj.lora_A": (r, in),
                             "...lora_B": (out, r), ...}, scale=alpha / r)
    WeightUpdate("full", v, {state-dict name: array}, aliases={tied name: name it shares})

LoRA module names are those of the plain Hugging Face model, so a worker merges
W = W0 + scale * B @ A without peft.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from common.models import load_tokenizer, resolve_model
from common.types import WeightUpdate

PEFT_PREFIX = "base_model.model."


def lora_tensors(model) -> dict[str, np.ndarray]:
    """Adapter tensors keyed by plain module name + '.lora_A' / '.lora_B' (fp32 numpy)."""
    from peft import get_peft_model_state_dict

    out = {}
    for key, t in get_peft_model_state_dict(model).items():
        name = key.removeprefix(PEFT_PREFIX).replace(".lora_A.weight", ".lora_A")
        name = name.replace(".lora_B.weight", ".lora_B")
        out[name] = t.detach().float().cpu().numpy().copy()
    return out


def to_peft_state_dict(tensors: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Inverse of `lora_tensors`: keys for `peft.set_peft_model_state_dict`."""
    return {f"{PEFT_PREFIX}{k}.weight": torch.from_numpy(np.asarray(v)) for k, v in tensors.items()}


def export_weights(model, lora_cfg, version: int) -> WeightUpdate:
    """The update rollout workers load for `version` (see module docstring)."""
    if lora_cfg.mode in ("lora", "qlora"):
        return WeightUpdate("lora", version, lora_tensors(model), scale=lora_cfg.alpha / lora_cfg.r)
    state, aliases, seen = {}, {}, {}
    for k, v in model.state_dict().items():
        if v.data_ptr() in seen:  # tied weights (embeddings / LM head): ship once
            aliases[k] = seen[v.data_ptr()]
            continue
        seen[v.data_ptr()] = k
        state[k] = v.detach().float().cpu().numpy().copy()
    return WeightUpdate("full", version, state, aliases=aliases)


def save_final(model, cfg, path: str, merged: bool = False) -> str:
    """Write a checkpoint that transformers (and peft, for adapters) can load.

    LoRA without `merged`: the adapter (a few MB) + tokenizer + `homerl.json` naming the base.
    Full, or LoRA with `merged`: full weights + tokenizer. QLoRA merges are refused: the base
    in memory is NF4, so a merged model would carry quantisation error.
    """
    os.makedirs(path, exist_ok=True)
    is_peft = hasattr(model, "peft_config")
    if is_peft and merged:
        if cfg.lora.mode == "qlora":
            raise ValueError("save_final(merged=True): not supported for lora.mode=qlora")
        import copy

        plain = copy.deepcopy(model).merge_and_unload()
        plain.save_pretrained(path)
    else:
        model.save_pretrained(path)
    base = resolve_model(cfg.model.name)
    load_tokenizer(base).save_pretrained(path)
    with open(os.path.join(path, "homerl.json"), "w") as f:
        json.dump({"base_model": base, "kind": "adapter" if is_peft and not merged else "full",
                   "lora_mode": cfg.lora.mode}, f, indent=2)
    return path
