"""The merging vLLM worker's merge (actors/lora_merge.py) on hand-built tensors: W0 + s B A for
adapted modules, W0 for packed siblings without an adapter, one tensor at a time in order."""

import numpy as np
import torch

from actors.lora_merge import merged, merged_weights


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_merged_is_w0_plus_scaled_b_a_for_fp32_and_bf16_w0():
    w0, a, b = _rand(6, 5), _rand(2, 5, seed=1), _rand(6, 2, seed=2)
    torch.testing.assert_close(merged(w0, a, b, 0.5), w0 + 0.5 * b @ a)
    half = w0.bfloat16()
    got = merged(half, a, b, 0.5)
    torch.testing.assert_close(got, half.float() + 0.5 * b @ a)
    assert got.dtype == torch.float32 and half.dtype == torch.bfloat16  # W0 left as it was


def test_merged_weights_are_made_one_at_a_time_in_the_given_order():
    names = [f"model.layers.{i}.self_attn.{m}_proj.weight" for i in range(2) for m in "qk"]
    base = {n: _rand(4, 3, seed=i) for i, n in enumerate(names)}
    update = {}  # adapters on q only: k is a packed sibling loaded as W0
    for n in names[::2]:
        module = n.removesuffix(".weight")
        update[f"{module}.lora_A"] = np.ones((2, 3), np.float32)
        update[f"{module}.lora_B"] = np.full((4, 2), 0.5, np.float32)
    it = merged_weights(names, base, update, scale=2.0)
    first = next(it)  # lazily: the rest are not computed yet
    assert first[0] == names[0]
    torch.testing.assert_close(first[1], base[names[0]] + 2.0)  # 2 x (0.5 x 1 x 2) per entry
    rest = list(it)
    assert [n for n, _ in rest] == names[1:]
    assert rest[0][1] is base[names[1]]  # no adapter: W0 itself, no copy
    torch.testing.assert_close(rest[1][1], base[names[2]] + 2.0)
