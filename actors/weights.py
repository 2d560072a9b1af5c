"""Apply a learner export payload to a plain Hugging Face model held by a rollout worker.

An fp32 worker merges LoRA payloads, W = W0 + scale * B @ A, into its own weights: decoding a
merged model costs the same as the base model, while unmerged adapters add two small matmuls
per layer per token, which at small batch on a CPU is a large share of the decode time.
W0 is kept once so every merge starts from the base, not from the last merge: it is the loaded
tensor itself (file pages the learner shares), and the merged weights live in a new one. A base
whose fp32 values are all bf16 numbers (a bf16 checkpoint converted at load, as the hub's Qwen2
is: private pages already) keeps W0 as bf16, which holds it exactly in half the bytes, and is
merged in place: one fp32 copy of the adapted linears, not two (-0.67 GiB on Qwen2-0.5B).

A bf16 worker keeps the adapters unmerged instead (a forward hook adds scale * B(A x) in fp32,
as peft does in the learner): rounding W0 + scale * B @ A to bf16 loses most of a small
update (measured on a tiny Qwen2: mean |logp_diff| 0.055 merged vs 0.0007 for the bf16 body
alone). See learner/export.py for the update format (`common.types.WeightUpdate`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from common.types import WeightUpdate

HOOK_ROWS = 2048
"""activation rows a 16-bit body's adapter hook widens to fp32 at a time"""


class WeightVersionError(ValueError):
    """A stale or mismatched weight push; the message names both versions."""


def check_version(worker: str, update: WeightUpdate, version: int, current: int,
                  rollback: bool = False) -> None:
    """Refuse a push whose update is not `version`, or older than `current` (unless rollback)."""
    if update.version != version:
        raise WeightVersionError(
            f"{worker}: update holds version {update.version}, push said {version}")
    if version < current and not rollback:
        raise WeightVersionError(
            f"{worker}: refusing stale weights version {version} < current {current}")


def _tensor(a, device="cpu") -> torch.Tensor:
    # Arrays from the object store are read-only views; copy once into torch.
    return torch.tensor(np.asarray(a), device=device)


class WeightApplier:
    """Holds the base weights of the LoRA target modules and applies payloads to `model`:
    merged into the weights (`merge=True`) or as fp32 adapters beside them."""

    def __init__(self, model, merge: bool = True, compact_base: bool = True):
        self.model, self.merge, self.compact_base = model, merge, compact_base
        self.modules = dict(model.named_modules())
        self.base: dict[str, torch.Tensor] = {}
        self.adapters: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}

    def apply(self, update: WeightUpdate) -> int:
        """Load `update` into the model; returns the number of tensors written."""
        if update.kind == "lora":
            return self._apply_lora(update.tensors, float(update.scale))
        if update.kind == "full":
            t = update.tensors
            return self._apply_full({**t, **{k: t[v] for k, v in update.aliases.items()}})
        raise ValueError(f"weights update kind must be lora or full; got {update.kind!r}")

    @torch.no_grad()
    def _apply_lora(self, tensors: dict, scale: float) -> int:
        names = sorted({k.rsplit(".", 1)[0] for k in tensors})
        missing = [n for n in names if n not in self.modules]
        if missing:
            raise ValueError(f"LoRA payload names module {missing[0]!r}, which this model lacks")
        if not self.merge:
            for name in names:
                if name not in self.adapters:
                    self.modules[name].register_forward_hook(self._adapter_hook(name))
                dev = self.modules[name].weight.device
                self.adapters[name] = (_tensor(tensors[f"{name}.lora_A"], dev).float(),
                                       _tensor(tensors[f"{name}.lora_B"], dev).float(), scale)
            return len(names)
        for name in names:
            module = self.modules[name]
            if name not in self.base:
                self.base[name] = self._keep_base(module, self.compact_base)
            weight = module.weight
            a = _tensor(tensors[f"{name}.lora_A"], weight.device)   # (r, in)
            b = _tensor(tensors[f"{name}.lora_B"], weight.device)   # (out, r)
            merged = self.base[name].float() + scale * (b @ a)      # (out, in)
            weight.copy_(merged.to(weight.dtype))
        return len(names)

    @staticmethod
    def _keep_base(module, compact: bool = True) -> torch.Tensor:
        """W0 of `module`, kept for every later merge; `module.weight` is then the merge target.

        fp32 values that are all bf16 numbers: W0 as bf16 (exact, half the bytes), merged in
        place. Otherwise keep the loaded tensor and merge into a new one: the loaded weights are
        pages of the model file, shared with the learner's copy, and writing into them would
        make this process hold a private second copy. `compact=False`: always the latter
        (docs/history.md has what each costs in memory).
        """
        w = module.weight.detach()
        if compact and w.dtype == torch.float32:
            half = w.to(torch.bfloat16)
            if torch.equal(half.float(), w):
                return half
        module.weight = torch.nn.Parameter(torch.empty_like(w), requires_grad=False)
        return w

    def to(self, device) -> None:
        """Move the kept base weights and adapters with the model (a sleeping GPU worker)."""
        self.base = {k: v.to(device) for k, v in self.base.items()}
        self.adapters = {k: (a.to(device), b.to(device), s)
                         for k, (a, b, s) in self.adapters.items()}

    def _adapter_hook(self, name: str):
        def hook(_module, args, output):
            if name not in self.adapters:  # dropped by a full load
                return output
            a, b, scale = self.adapters[name]                       # (r, in), (out, r)
            x = args[0]                                             # (..., in)
            if x.dtype in (torch.float16, torch.bfloat16):
                # a 16-bit body (a GPU engine): the same fp32 sums, but x widened HOOK_ROWS
                # rows at a time and the rest in place: one fp32 tensor of the output's size,
                # not four (a prefill's are tokens x intermediate x 4 bytes each). A x in 16
                # bits instead moved the sampled log-probs 10x further from the learner's
                rows = x.reshape(-1, x.shape[-1])                   # (M, in)
                h = torch.cat([F.linear(c.float(), a) for c in rows.split(HOOK_ROWS)])
                delta = F.linear(h, b).mul_(scale)                  # (M, out) fp32
                return delta.add_(output.reshape(delta.shape)).to(output.dtype).view_as(output)
            delta = F.linear(F.linear(x.to(a.dtype), a), b) * scale
            return (output.to(delta.dtype) + delta).to(output.dtype)
        return hook

    @torch.no_grad()
    def _apply_full(self, tensors: dict) -> int:
        state = self.model.state_dict()
        missing = [k for k in state if k not in tensors]
        if missing:
            raise ValueError(
                f"full weights payload lacks {len(missing)} tensors, e.g. {missing[0]}")
        for k, v in state.items():
            v.copy_(_tensor(tensors[k], v.device).to(v.dtype))
        self.base.clear()  # a full load replaces the base every later merge starts from
        self.adapters.clear()
        return len(state)
