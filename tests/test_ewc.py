"""Tests for learner/ewc.py: the EWC penalty and the online Fisher against plain loops."""

from __future__ import annotations

import pytest
import torch

from learner import ewc as E

SEEDS = [0, 1, 2, 3, 4]


def _ewc_setup(seed: int):
    gen = torch.Generator().manual_seed(seed)
    shapes = {"w": (3, 4), "b": (4,), "frozen": (2,)}
    params = {k: torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_()
              for k, s in shapes.items()}
    anchor = {k: torch.randn(s, generator=gen, dtype=torch.float64) for k, s in shapes.items()}
    fisher = {k: torch.rand(s, generator=gen, dtype=torch.float64) for k, s in shapes.items()
              if k != "frozen"}
    return params, anchor, fisher


@pytest.mark.parametrize("seed", SEEDS)
def test_ewc_penalty_matches_loop_and_gradient(seed):
    params, anchor, fisher = _ewc_setup(seed)
    lam = 0.7
    pen = E.ewc_penalty(params, anchor, fisher, lam)
    want = 0.0
    for name, f in fisher.items():
        for fi, pi, ai in zip(f.flatten().tolist(), params[name].flatten().tolist(),
                              anchor[name].flatten().tolist()):
            want += fi * (pi - ai) ** 2
    assert pen.item() == pytest.approx(lam / 2 * want, rel=1e-12)
    pen.backward()
    for name, f in fisher.items():
        torch.testing.assert_close(params[name].grad, lam * f * (params[name] - anchor[name]))
    assert params["frozen"].grad is None  # not in fisher -> not penalised


def test_ewc_penalty_zero_at_anchor_empty_and_missing():
    params, anchor, fisher = _ewc_setup(0)
    at_anchor = {k: v.clone().requires_grad_() for k, v in anchor.items()}
    pen = E.ewc_penalty(at_anchor, anchor, fisher, 3.0)
    assert pen.item() == 0.0
    pen.backward()
    assert all(torch.equal(at_anchor[k].grad, torch.zeros_like(anchor[k])) for k in fisher)
    zero = E.ewc_penalty(params, anchor, {}, 1.0)
    assert isinstance(zero, torch.Tensor) and zero.item() == 0.0
    with pytest.raises(KeyError, match="missing_layer"):
        E.ewc_penalty(params, anchor, {"missing_layer": torch.ones(1)}, 1.0)


def test_ewc_penalty_float32_params():
    p = {"w": torch.ones(3, dtype=torch.bfloat16, requires_grad=True)}
    pen = E.ewc_penalty(p, {"w": torch.zeros(3)}, {"w": torch.full((3,), 2.0)}, 1.0)
    assert pen.dtype == torch.float32 and pen.item() == pytest.approx(3.0)
    pen.backward()
    assert p["w"].grad.dtype == torch.bfloat16


def test_online_fisher():
    f1 = {"w": torch.tensor([1.0, 2.0]), "old_only": torch.tensor([4.0])}
    f2 = {"w": torch.tensor([10.0, 20.0]), "new_only": torch.tensor([5.0])}
    first = E.online_fisher(None, f1, gamma=0.9)
    assert torch.equal(first["w"], f1["w"]) and first["w"] is not f1["w"]
    acc = E.online_fisher(first, f2, gamma=0.5)
    assert torch.equal(acc["w"], torch.tensor([10.5, 21.0]))
    assert torch.equal(acc["old_only"], torch.tensor([2.0]))
    assert torch.equal(acc["new_only"], torch.tensor([5.0]))
    assert torch.equal(first["w"], torch.tensor([1.0, 2.0]))  # inputs untouched
    # three steps by loop: F = g^2 F1 + g F2 + F3
    fs = [torch.rand(3, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    run = None
    for f in fs:
        run = E.online_fisher(run, {"x": f}, gamma=0.8)
    torch.testing.assert_close(run["x"], 0.64 * fs[0] + 0.8 * fs[1] + fs[2])
    with pytest.raises(ValueError, match=r"gamma.*\[0, 1\]"):
        E.online_fisher(None, f1, gamma=1.5)
