"""Tests for learner/losses.py, the surrogate and its weighting: clipped_surrogate,
loss_weights and aggregate, each against a plain-Python loop reference."""

from __future__ import annotations

import math

import pytest
import torch
from loss_cases import MODES, SEEDS, ragged_mask

from learner import losses as L

# --------------------------------------------------------------------------- clipped_surrogate


def _ref_surrogate(logp, old, adv, lo, hi, c=0.0):
    """Loop reference: (loss, clipped_low, clipped_high, dual) as nested lists."""
    out = [[], [], [], []]
    for i in range(len(logp)):
        rows = [[], [], [], []]
        for t in range(len(logp[i])):
            a = adv[i][t] if isinstance(adv[i], list) else adv[i]
            r = math.exp(logp[i][t] - old[i][t])
            s1 = r * a
            s2 = min(max(r, 1 - lo), 1 + hi) * a
            loss = -min(s1, s2)
            dual = bool(c) and a < 0 and loss > -c * a
            rows[0].append(-c * a if dual else loss)
            rows[1].append(s2 < s1 and a < 0)
            rows[2].append(s2 < s1 and a >= 0)
            rows[3].append(dual)
        for k in range(4):
            out[k].append(rows[k])
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("dual_c", [0.0, 1.3])
def test_clipped_surrogate_matches_loop(seed, per_token_adv, dual_c):
    gen = torch.Generator().manual_seed(seed)
    n, t = 6, 9
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    # log-ratios spread over [-0.6, 0.6] so ratios fall below, inside and above [0.8, 1.28]
    # (and above c = 1.3)
    logp = old + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5) * 1.2
    shape = (n, t) if per_token_adv else (n,)
    adv = torch.randn(shape, generator=gen, dtype=torch.float64)
    got = L.clipped_surrogate(logp, old, adv, eps_low=0.2, eps_high=0.28, dual_clip_c=dual_c)
    want = _ref_surrogate(logp.tolist(), old.tolist(), adv.tolist(), 0.2, 0.28, dual_c)
    torch.testing.assert_close(got.loss, torch.tensor(want[0], dtype=torch.float64))
    assert got.clipped_low.tolist() == want[1]
    assert got.clipped_high.tolist() == want[2]
    assert got.dual_clipped.tolist() == want[3]
    assert got.dual_clipped.any() == bool(dual_c)
    ratio = (logp - old).exp()
    assert (ratio < 0.8).any() and (ratio > 1.28).any() and ((ratio > 0.8) & (ratio < 1.28)).any()


def test_clipped_surrogate_by_hand_asymmetric_and_dual():
    ratios = torch.tensor([[0.5, 1.0, 1.2, 1.5, 0.5, 1.5, 4.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    logp = ratios.log()
    sur = L.clipped_surrogate(logp, torch.zeros_like(logp), adv, 0.2, 0.28)
    # A>0: min(r, clip(r)) -> 0.5 (unclipped), 1.0, 1.2, 1.28 (clip-high active)
    # A<0: min(-r, -clip(r)) -> -0.8 (clip-low active), -1.5, -4 (unclipped: unbounded in r)
    want = torch.tensor([[-0.5, -1.0, -1.2, -1.28, 0.8, 1.5, 4.0]], dtype=torch.float64)
    torch.testing.assert_close(sur.loss, want)
    assert sur.clipped_high.tolist() == [[False, False, False, True, False, False, False]]
    assert sur.clipped_low.tolist() == [[False, False, False, False, True, False, False]]
    # dual-clip c = 3 caps the A<0, r=4 token at -c*A = 3; nothing else changes
    dual = L.clipped_surrogate(logp, torch.zeros_like(logp), adv, 0.2, 0.28, dual_clip_c=3.0)
    want[0, -1] = 3.0
    torch.testing.assert_close(dual.loss, want)
    assert dual.dual_clipped.tolist() == [[False] * 6 + [True]]


def test_clipped_surrogate_gradient_zero_when_clipped_or_dual_clipped():
    logp = torch.tensor([[math.log(1.5), math.log(1.1), math.log(4.0), math.log(2.0)]],
                        dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    sur = L.clipped_surrogate(logp, torch.zeros(1, 4, dtype=torch.float64), adv,
                              dual_clip_c=3.0)
    sur.loss.sum().backward()
    # clip-high token and dual-clipped token: no gradient; d(-rA)/dlogp = -rA elsewhere
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.1, 0.0, 2.0]],
                                                       dtype=torch.float64))


def test_clipped_surrogate_bad_args():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="eps_low"):
        L.clipped_surrogate(x, x, torch.zeros(2), eps_low=-0.1)
    with pytest.raises(ValueError, match="eps_high"):
        L.clipped_surrogate(x, x, torch.zeros(2), eps_high=-0.1)
    with pytest.raises(ValueError, match="advantages"):
        L.clipped_surrogate(x, x, torch.zeros(2, 3, 1))
    with pytest.raises(ValueError, match="dual_clip_c"):
        L.clipped_surrogate(x, x, torch.zeros(2), dual_clip_c=0.9)


# --------------------------------------------------------------------------- loss_weights


def _ref_weights(sel, counted, mode, max_new):
    n, t = len(sel), len(sel[0])
    w = [[0.0] * t for _ in range(n)]
    n_sel = sum(map(sum, sel))
    n_count = sum(map(sum, counted))
    rows_sel = [i for i in range(n) if any(sel[i])]
    rows_count = [i for i in range(n) if any(counted[i])]
    for i in range(n):
        for j in range(t):
            if not sel[i][j]:
                continue
            if mode == "token_mean":
                w[i][j] = 1 / n_sel
            elif mode == "token_mean_all":
                w[i][j] = 1 / n_count
            elif mode == "seq_mean":
                w[i][j] = 1 / (len(rows_sel) * sum(sel[i]))
            else:
                w[i][j] = 1 / (len(rows_count) * max_new)
    return w


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
def test_loss_weights_match_loop(seed, mode):
    gen = torch.Generator().manual_seed(seed)
    counted = ragged_mask(gen, 7, 11, empty_row=3)
    sel = L.entropy_topk_mask(torch.rand(7, 11, generator=gen), counted, 0.3)
    got = L.loss_weights(sel, counted, mode, max_new_tokens=16)
    want = _ref_weights(sel.tolist(), counted.tolist(), mode, 16)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32))
    assert torch.all(got[~sel] == 0) and torch.all(got[sel] > 0)


def test_loss_weights_by_hand():
    # row 0: 4 completion tokens, all selected; row 1: 4 tokens, 1 selected; row 2: 2, none
    counted = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    sel = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])

    def loss(mode):
        return L.aggregate(x, L.loss_weights(sel, counted, mode, max_new_tokens=8)).item()

    assert loss("token_mean") == pytest.approx((4 * 1 + 4) / 5)         # 5 selected tokens
    assert loss("token_mean_all") == pytest.approx((4 * 1 + 4) / 10)    # 10 completion tokens
    assert loss("seq_mean") == pytest.approx((1 + 4) / 2)               # 2 rows with a selection
    assert loss("dr_grpo") == pytest.approx((4 * 1 + 4) / (3 * 8))      # 3 rows x 8 tokens


@pytest.mark.parametrize("mode", MODES)
def test_loss_weights_nothing_selected_is_zero(mode):
    counted = torch.ones(2, 3, dtype=torch.bool)
    w = L.loss_weights(torch.zeros(2, 3, dtype=torch.bool), counted, mode, max_new_tokens=4)
    assert torch.equal(w, torch.zeros(2, 3))


def test_loss_weights_bad_args():
    m = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"mode.*'token_mean'.*'dr_grpo'"):
        L.loss_weights(m, m, "sum")
    with pytest.raises(ValueError, match="shape|selected"):
        L.loss_weights(m, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="max_new_tokens"):
        L.loss_weights(m, m, "dr_grpo")


# --------------------------------------------------------------------------- aggregate


@pytest.mark.parametrize("seed", SEEDS)
def test_aggregate_is_the_weighted_sum_and_ignores_garbage(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(7, 11, generator=gen, dtype=torch.float64)
    counted = ragged_mask(gen, 7, 11, empty_row=3)
    w = L.loss_weights(counted, counted, "seq_mean").double()
    x_garbage = x.clone()
    x_garbage[~counted] = float("nan")  # unselected garbage must not leak
    want = sum(a * b for ra, rb in zip(x.tolist(), w.tolist()) for a, b in zip(ra, rb))
    assert L.aggregate(x_garbage, w).item() == pytest.approx(want, rel=1e-12)


def test_aggregate_nothing_selected_is_zero_with_grad():
    x = torch.randn(3, 4, requires_grad=True)
    out = L.aggregate(x, torch.zeros(3, 4))
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert torch.equal(x.grad, torch.zeros(3, 4))


def test_aggregate_bad_args():
    with pytest.raises(ValueError, match="shape"):
        L.aggregate(torch.zeros(2, 2), torch.ones(2, 3))
