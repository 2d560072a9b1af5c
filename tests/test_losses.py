"""Tests for learner/losses.py: every function against a plain-Python loop reference."""

from __future__ import annotations

import math

import pytest
import torch

from learner import losses as L

SEEDS = [0, 1, 2, 3, 4]


def _ragged_mask(gen: torch.Generator, n: int, t: int, empty_row: int | None = 0) -> torch.Tensor:
    """Right-padded completion mask with random lengths; optionally one all-False row."""
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    if empty_row is not None:
        mask[empty_row] = False
    return mask


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


MODES = ["token_mean", "token_mean_all", "seq_mean", "dr_grpo"]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
def test_loss_weights_match_loop(seed, mode):
    gen = torch.Generator().manual_seed(seed)
    counted = _ragged_mask(gen, 7, 11, empty_row=3)
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
    counted = _ragged_mask(gen, 7, 11, empty_row=3)
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
    mask = _ragged_mask(gen, 6, 13, empty_row=2)
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
    completion = _ragged_mask(gen, n, t, empty_row=None)
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
    assert all(math.isfinite(v) for v in stats.metrics().values())
    assert stats.tokens == sel.sum().item()


def test_grpo_loss_matches_pieces_and_stats():
    gen = torch.Generator().manual_seed(0)
    n, t = 5, 7
    mask = _ragged_mask(gen, n, t, empty_row=4)
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
        m = stats.metrics()
        n_sel = mask.sum().item()
        assert m["policy/clip_frac_low"] == pytest.approx((sur.clipped_low & mask).sum() / n_sel)
        assert m["policy/clip_frac_high"] == pytest.approx((sur.clipped_high & mask).sum() / n_sel)
        k3 = (logp - old).exp() - 1 - (logp - old)
        assert m["policy/approx_kl"] == pytest.approx(k3[mask].mean().item())
        assert m["policy/ratio_mean"] == pytest.approx((logp - old).exp()[mask].mean().item())
        assert m["policy/logp_diff"] == pytest.approx((logp - old).abs()[mask].mean().item())
        assert m["policy/logp_diff_max"] == pytest.approx((logp - old).abs()[mask].max().item())
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
    mask = _ragged_mask(gen, n, t, empty_row=2)
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
    for k, v in stats.metrics().items():
        assert parts.metrics()[k] == pytest.approx(v, rel=1e-9), k


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
    mask = _ragged_mask(gen, n, t)
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64)
    logp = (old + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5)).requires_grad_()
    lp = logp.detach().clone()
    lp[~mask] = math.nan  # garbage outside the mask must not leak
    pairs = [(a, b) for ra, rb, rm in zip(lp.tolist(), old.tolist(), mask.tolist())
             for a, b, m in zip(ra, rb, rm) if m]
    stats = L.logp_stats(logp, old, mask)
    assert L.logp_stats(lp, old, mask).metrics() == stats.metrics()
    m = stats.metrics()
    assert stats.tokens == len(pairs)
    assert m["policy/approx_kl"] == pytest.approx(
        sum(math.exp(a - b) - 1 - (a - b) for a, b in pairs) / len(pairs), rel=1e-12)
    assert m["policy/ratio_mean"] == pytest.approx(
        sum(math.exp(a - b) for a, b in pairs) / len(pairs), rel=1e-12)
    assert stats.logp_diff == pytest.approx(sum(abs(a - b) for a, b in pairs))
    assert stats.logp_diff_max == pytest.approx(max(abs(a - b) for a, b in pairs))
    empty = torch.zeros(n, t, dtype=torch.bool)
    assert L.logp_stats(lp, old, empty).metrics()["policy/logp_diff"] == 0.0
