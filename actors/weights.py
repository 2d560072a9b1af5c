"""Apply a learner export payload to a plain Hugging Face model held by a rollout worker.

LoRA payloads are merged, W = W0 + scale * B @ A, into the worker's own weights: decoding a
merged model costs the same as the base model, while unmerged adapters add two small matmuls
per layer per token, which at small batch on a CPU is a large share of the decode time.
W0 is kept once (in the worker's dtype) so every merge starts from the base, not from the last
merge. See learner/export.py for the payload format.
"""

from __future__ import annotations

import numpy as np
import torch


class WeightVersionError(ValueError):
    """A stale or mismatched weight push; the message names both versions."""


def check_version(worker: str, payload: dict, version: int, current: int,
                  rollback: bool = False) -> None:
    """Refuse a push whose payload is not `version`, or older than `current` (unless rollback)."""
    if payload["version"] != version:
        raise WeightVersionError(
            f"{worker}: payload holds version {payload['version']}, push said {version}")
    if version < current and not rollback:
        raise WeightVersionError(
            f"{worker}: refusing stale weights version {version} < current {current}")


def _tensor(a) -> torch.Tensor:
    # Arrays from the object store are read-only views; copy once into torch.
    return torch.tensor(np.asarray(a))


class WeightApplier:
    """Holds the base weights of the LoRA target modules and merges payloads into `model`."""

    def __init__(self, model):
        self.model = model
        self.modules = dict(model.named_modules())
        self.base: dict[str, torch.Tensor] = {}

    def apply(self, payload: dict) -> int:
        """Load `payload` into the model; returns the number of tensors written."""
        if payload["kind"] == "lora":
            return self._apply_lora(payload["tensors"], float(payload["scale"]))
        if payload["kind"] == "full":
            aliases = payload.get("aliases", {})
            return self._apply_full({**payload["tensors"],
                                     **{k: payload["tensors"][v] for k, v in aliases.items()}})
        raise ValueError(f"weights payload kind must be lora or full; got {payload['kind']!r}")

    @torch.no_grad()
    def _apply_lora(self, tensors: dict, scale: float) -> int:
        names = sorted({k.rsplit(".", 1)[0] for k in tensors})
        for name in names:
            if name not in self.modules:
                raise ValueError(f"LoRA payload names module {name!r}, which this model lacks")
            weight = self.modules[name].weight
            if name not in self.base:
                self.base[name] = weight.detach().clone()
            a = _tensor(tensors[f"{name}.lora_A"])                  # (r, in)
            b = _tensor(tensors[f"{name}.lora_B"])                  # (out, r)
            merged = self.base[name].float() + scale * (b @ a)      # (out, in)
            weight.copy_(merged.to(weight.dtype))
        return len(names)

    @torch.no_grad()
    def _apply_full(self, tensors: dict) -> int:
        state = self.model.state_dict()
        missing = [k for k in state if k not in tensors]
        if missing:
            raise ValueError(
                f"full weights payload lacks {len(missing)} tensors, e.g. {missing[0]}")
        for k, v in state.items():
            v.copy_(_tensor(tensors[k]).to(v.dtype))
        self.base.clear()  # a full load replaces the base every later merge starts from
        return len(state)
