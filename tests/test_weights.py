"""actors.weights: how a merging fp32 worker keeps W0. A base of bf16 numbers (a bf16 checkpoint
converted at load) is kept as bf16 and merged in place; any other base is kept as loaded and
merged into a new tensor. Both give W0 + scale * B @ A exactly, update after update."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from actors.weights import WeightApplier
from common.tiny_model import build_tiny_qwen2
from common.types import WeightUpdate

TARGETS = ("q_proj", "v_proj")


def lora_update(model, version: int, seed: int, r: int = 4) -> WeightUpdate:
    g = np.random.default_rng(seed)
    tensors = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in TARGETS:
            out_f, in_f = module.weight.shape
            tensors[f"{name}.lora_A"] = g.standard_normal((r, in_f)).astype(np.float32) * 0.1
            tensors[f"{name}.lora_B"] = g.standard_normal((out_f, r)).astype(np.float32) * 0.1
    return WeightUpdate("lora", version, tensors, scale=2.0)


def expected(w0: dict, update: WeightUpdate) -> dict:
    return {n: w0[n] + update.scale * (torch.from_numpy(update.tensors[f"{n}.lora_B"])
                                       @ torch.from_numpy(update.tensors[f"{n}.lora_A"]))
            for n in w0}


@pytest.mark.parametrize("bf16_numbers", [True, False])
def test_merges_give_w0_plus_scaled_ba_after_every_update(bf16_numbers):
    model = build_tiny_qwen2(seed=1)[0].float()
    if bf16_numbers:  # as `from_pretrained(dtype=float32)` of a bf16 checkpoint gives
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    modules = dict(model.named_modules())
    names = [n for n in modules if n.rsplit(".", 1)[-1] in TARGETS]
    w0 = {n: modules[n].weight.detach().clone() for n in names}
    ptrs = {n: modules[n].weight.data_ptr() for n in names}
    applier = WeightApplier(model, merge=True)
    for version, seed in ((1, 10), (2, 11)):
        update = lora_update(model, version, seed)
        assert applier.apply(update) == len(names)
        want = expected(w0, update)
        for n in names:  # from W0 each time, not from the last merge
            torch.testing.assert_close(modules[n].weight, want[n], rtol=0, atol=0)
    for n in names:
        held = applier.base[n]
        if bf16_numbers:  # half the bytes, and no second fp32 tensor: merged in place
            assert held.dtype == torch.bfloat16 and modules[n].weight.data_ptr() == ptrs[n]
        else:  # the loaded tensor itself, untouched; the merge went into a new one
            assert held.dtype == torch.float32 and held.data_ptr() == ptrs[n]
            assert modules[n].weight.data_ptr() != ptrs[n]
            torch.testing.assert_close(held, w0[n], rtol=0, atol=0)


class Fp32Storages(TorchDispatchMode):
    """The distinct fp32 storages of at least `size` elements that ops inside it return."""

    def __init__(self, size: int):
        super().__init__()
        self.size, self.seen = size, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel() >= self.size:
                self.seen.add(t.untyped_storage().data_ptr())
        return out


def test_a_16bit_body_adds_the_adapters_with_one_fp32_tensor_and_the_same_sums(monkeypatch):
    """merge=False (a GPU engine's bf16 body): the hook holds one fp32 tensor of the
    activations' size, not four (an 8 GiB engine ran out of memory in a prefill), and its
    output is bit for bit the fp32 hook's: W x + scale * B A x summed in fp32, rounded once."""
    from actors import weights

    monkeypatch.setattr(weights, "HOOK_ROWS", 32)  # the 96 rows below widen in 3 slices
    model = build_tiny_qwen2(seed=1)[0].to(torch.bfloat16).eval()
    update = lora_update(model, 1, 10)
    WeightApplier(model, merge=False).apply(update)
    name = next(n for n, _ in model.named_modules() if n.endswith("q_proj"))
    module = dict(model.named_modules())[name]
    x = torch.randn(4, 24, module.in_features).to(torch.bfloat16)              # (N, T, in)
    with torch.no_grad(), Fp32Storages(x[..., 0].numel() * 32) as big:
        out = module(x)                                                          # (N, T, out)
    assert out.dtype == torch.bfloat16 and out.shape == (4, 24, module.out_features)
    assert len(big.seen) == 1, len(big.seen)  # the old hook: x, B A x, its scaling, W x, sum
    a, b = (torch.from_numpy(update.tensors[f"{name}.lora_{k}"]) for k in "AB")
    with torch.no_grad():
        base = F.linear(x, module.weight, module.bias)
        want = (base.float() + F.linear(F.linear(x.float(), a), b) * update.scale)
    assert torch.equal(out, want.to(torch.bfloat16))
    assert (out.float() - base.float()).abs().max() > 0.05  # the adapter is in it
