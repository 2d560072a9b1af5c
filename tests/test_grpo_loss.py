"""Tests for learner/losses.py, the rest: kl_k3, entropy_topk_mask, grpo_loss (gradients,
micro-batches) and logp_stats, each against a plain-Python loop reference."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from loss_cases import MODES, SEEDS, ragged_mask

from learner import losses as L

# --------------------------------------------------------------------------- kl_k3


@pytest.mark.parametrize("seed", SEEDS)
def test_kl_k3_matches_loop_and_nonnegative(seed):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(5, 8, generator=gen, dtype=torch.float64) * 4
    ref = logp + torch.randn(5, 8, generator=gen, dtype=torch.float64)
    got = L.kl_k3(logp, ref)
    want = [
        [math.exp(r - lp) - (r - lp) - 1 for lp, r in zip(row_l, row_r)]
        for row_l, row_r in zip(logp.tolist(), ref.tolist())
    ]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))
    assert (got >= 0).all()
    assert torch.equal(L.kl_k3(logp, logp), torch.zeros_like(logp))
    # tiny differences in float32 must not go negative through cancellation
    lp32 = logp.float()
    tiny = L.kl_k3(lp32, lp32 + torch.randn(5, 8, generator=gen) * 1e-6)
    assert (tiny >= 0).all()


# --------------------------------------------------------------------------- entropy_topk_mask


def test_entropy_topk_mask_small_exact():
    entropy = torch.tensor([[0.1, 2.0, 0.5, 9.0], [1.5, 0.2, 3.0, 9.0], [0.7, 0.7, 8.0, 8.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    # 8 valid tokens, rho=0.5 -> 4 tokens: 3.0, 2.0, 1.5, 0.7 (first of the tied 0.7s)
    got = L.entropy_topk_mask(entropy, mask, 0.5)
    want = torch.tensor([[0, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    assert got.dtype == torch.bool
    assert torch.equal(got, want)


def test_entropy_topk_mask_padding_never_selected():
    entropy = torch.tensor([[1.0, 2.0, float("inf"), float("nan")], [0.5, 1e30, 3.0, 1e9]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]], dtype=torch.bool)
    for rho in (0.01, 0.25, 0.5, 0.75, 0.99):
        got = L.entropy_topk_mask(entropy, mask, rho)
        assert not (got & ~mask).any()
        assert got.sum().item() == math.ceil(rho * 4)
    assert torch.equal(
        L.entropy_topk_mask(entropy, mask, 0.5),
        torch.tensor([[0, 1, 0, 0], [0, 0, 1, 0]], dtype=torch.bool),
    )
    # valid tokens with -inf entropy still outrank padding
    neg = torch.full((2, 3), -math.inf)
    m = torch.tensor([[0, 1, 1], [0, 0, 1]], dtype=torch.bool)
    assert torch.equal(L.entropy_topk_mask(neg, m, 0.99), m)


@pytest.mark.parametrize("seed", SEEDS)
def test_entropy_topk_mask_random(seed):
    gen = torch.Generator().manual_seed(seed)
    entropy = torch.rand(6, 13, generator=gen) * 5
    mask = ragged_mask(gen, 6, 13, empty_row=2)
    entropy[~mask] = 100.0
    n_valid = int(mask.sum())
    assert torch.equal(L.entropy_topk_mask(entropy, mask, 1.0), mask)
    for rho in (0.05, 0.2, 0.37, 0.8):
        got = L.entropy_topk_mask(entropy, mask, rho)
        k = math.ceil(rho * n_valid)
        assert got.sum().item() == k
        assert not (got & ~mask).any()
        # loop reference: threshold = k-th largest valid entropy (values are distinct)
        vals = sorted((e for e, m in zip(entropy.flatten().tolist(), mask.flatten().tolist()) if m),
                      reverse=True)
        want = [[bool(m) and e >= vals[k - 1] for e, m in zip(er, mr)]
                for er, mr in zip(entropy.tolist(), mask.tolist())]
        assert got.tolist() == want


def test_entropy_topk_mask_edge_cases():
    entropy = torch.rand(2, 3)
    assert L.entropy_topk_mask(entropy, torch.zeros(2, 3, dtype=torch.bool), 0.2).sum() == 0
    one = torch.zeros(2, 3, dtype=torch.bool)
    one[1, 2] = True
    assert torch.equal(L.entropy_topk_mask(entropy, one, 1e-6), one)  # at least one token
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"rho.*\(0, 1\]"):
            L.entropy_topk_mask(entropy, one, bad)


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("agg", MODES)
@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_loss_gradient_only_on_selected_tokens(agg, seed):
    gen = torch.Generator().manual_seed(seed)
    n, t = 4, 10
    completion = ragged_mask(gen, n, t, empty_row=None)
    entropy = torch.rand(n, t, generator=gen)
    sel = L.entropy_topk_mask(entropy, completion, 0.3) & completion
    weights = L.loss_weights(sel, completion, agg, max_new_tokens=t)
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64)
    old[~completion] = float("nan")
    logp_data = old.detach().clone() + 0.01 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    logp_data[~completion] = -math.inf  # scatter-style garbage in padding ...
    logp_data[0, -1] = float("nan")  # ... and NaN
    logp_data[~sel & completion] = torch.where(
        torch.rand(n, t, generator=gen) < 0.5, -math.inf, math.nan
    ).double()[~sel & completion]
    logp = logp_data.requires_grad_(True)
    ref = torch.where(completion, old, torch.full_like(old, math.nan))
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0], dtype=torch.float64)

    loss, stats = L.grpo_loss(logp, old, adv, weights, eps_low=0.2, eps_high=0.28,
                              dual_clip_c=3.0, ref_logp=ref, beta=0.05)
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert torch.equal(logp.grad[~sel], torch.zeros_like(logp.grad[~sel]))
    assert (logp.grad[sel] != 0).all()
    assert all(math.isfinite(v) for v in dataclasses.asdict(stats.means()).values())
    assert stats.tokens == sel.sum().item()


def test_grpo_loss_matches_pieces_and_stats():
    gen = torch.Generator().manual_seed(0)
    n, t = 5, 7
    mask = ragged_mask(gen, n, t, empty_row=4)
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64)
    logp = old + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5)
    ref = old + 0.1 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    for agg in MODES:
        w = L.loss_weights(mask, mask, agg, max_new_tokens=t)
        loss, stats = L.grpo_loss(logp, old, adv, w, eps_low=0.2, eps_high=0.28,
                                  ref_logp=ref, beta=0.1)
        sur = L.clipped_surrogate(logp, old, adv, 0.2, 0.28)
        policy = L.aggregate(sur.loss, w)
        kl = L.aggregate(L.kl_k3(logp, ref), w)
        torch.testing.assert_close(loss, policy + 0.1 * kl)
        assert stats.policy == pytest.approx(policy.item())
        assert stats.kl == pytest.approx(kl.item())
        m = stats.means()
        n_sel = mask.sum().item()
        assert m.clip_frac_low == pytest.approx((sur.clipped_low & mask).sum() / n_sel)
        assert m.clip_frac_high == pytest.approx((sur.clipped_high & mask).sum() / n_sel)
        k3 = (logp - old).exp() - 1 - (logp - old)
        assert m.approx_kl == pytest.approx(k3[mask].mean().item())
        assert m.ratio_mean == pytest.approx((logp - old).exp()[mask].mean().item())
        assert m.logp_diff == pytest.approx((logp - old).abs()[mask].mean().item())
        assert m.logp_diff_max == pytest.approx((logp - old).abs()[mask].max().item())
    w = L.loss_weights(mask, mask)
    for kwargs in ({"beta": 0.0, "ref_logp": ref}, {"beta": 0.1, "ref_logp": None}):
        loss, stats = L.grpo_loss(logp, old, adv, w, eps_low=0.2, eps_high=0.28, **kwargs)
        assert stats.kl == 0.0
        assert loss.item() == pytest.approx(stats.policy)


@pytest.mark.parametrize("agg", MODES)
def test_grpo_loss_over_micro_batches_sums_to_the_whole_step(agg):
    """Weights are computed once per step, so any split of its rows gives the same loss,
    gradients and statistics as one pass."""
    gen = torch.Generator().manual_seed(3)
    n, t = 6, 8
    mask = ragged_mask(gen, n, t, empty_row=2)
    sel = L.entropy_topk_mask(torch.rand(n, t, generator=gen), mask, 0.4)
    w = L.loss_weights(sel, mask, agg, max_new_tokens=t)
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64)
    base = old + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    kw = dict(eps_low=0.2, eps_high=0.28, dual_clip_c=1.2)
    whole = base.clone().requires_grad_()
    loss, stats = L.grpo_loss(whole, old, adv, w, **kw)
    loss.backward()
    split = base.clone().requires_grad_()
    total, parts = 0.0, L.LossStats()
    for idx in ([4, 0], [1, 2, 3], [5]):
        part_loss, part = L.grpo_loss(split[idx], old[idx], adv[idx], w[idx], **kw)
        part_loss.backward()
        total, parts = total + part_loss.item(), parts + part
    assert total == pytest.approx(loss.item(), rel=1e-12)
    torch.testing.assert_close(split.grad, whole.grad)
    for k, v in dataclasses.asdict(stats.means()).items():
        assert getattr(parts.means(), k) == pytest.approx(v, rel=1e-9), k


def test_grpo_loss_bad_args():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="beta"):
        L.grpo_loss(x, x, torch.zeros(2), torch.ones(2, 3), eps_low=0.2, eps_high=0.2,
                    beta=-1.0)


# --------------------------------------------------------------------------- diagnostics


@pytest.mark.parametrize("seed", SEEDS)
def test_logp_stats_match_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    n, t = 4, 6
    mask = ragged_mask(gen, n, t)
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64)
    logp = (old + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5)).requires_grad_()
    lp = logp.detach().clone()
    lp[~mask] = math.nan  # garbage outside the mask must not leak
    pairs = [(a, b) for ra, rb, rm in zip(lp.tolist(), old.tolist(), mask.tolist())
             for a, b, m in zip(ra, rb, rm) if m]
    stats = L.logp_stats(logp, old, mask)
    assert L.logp_stats(lp, old, mask).means() == stats.means()
    m = stats.means()
    assert stats.tokens == len(pairs)
    assert m.approx_kl == pytest.approx(
        sum(math.exp(a - b) - 1 - (a - b) for a, b in pairs) / len(pairs), rel=1e-12)
    assert m.ratio_mean == pytest.approx(
        sum(math.exp(a - b) for a, b in pairs) / len(pairs), rel=1e-12)
    assert stats.logp_diff == pytest.approx(sum(abs(a - b) for a, b in pairs))
    assert stats.logp_diff_max == pytest.approx(max(abs(a - b) for a, b in pairs))
    empty = torch.zeros(n, t, dtype=torch.bool)
    assert L.logp_stats(lp, old, empty).means().logp_diff == 0.0
