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


# --------------------------------------------------------------------------- group_advantages


def _ref_advantages(rows: list[list[float]], scale: str, eps: float) -> list[list[float]]:
    out = []
    for row in rows:
        g = len(row)
        mean = sum(row) / g
        if all(r == row[0] for r in row):
            out.append([0.0] * g)
            continue
        var = sum((r - mean) ** 2 for r in row) / (g - 1)  # unbiased
        denom = math.sqrt(var) + eps if scale == "std" else 1.0
        out.append([(r - mean) / denom for r in row])
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", ["std", "none"])
def test_group_advantages_matches_loop(seed, scale):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (6, 5), generator=gen).double() * 0.5
    rewards[1] = 1.0  # a flat group
    rewards[2] = torch.randn(5, generator=gen, dtype=torch.float64)  # continuous rewards
    got = L.group_advantages(rewards, scale=scale, eps=1e-4)
    want = torch.tensor(_ref_advantages(rewards.tolist(), scale, 1e-4), dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(got[1], torch.zeros(5, dtype=torch.float64))


def test_group_advantages_unbiased_std_by_hand():
    # rewards [0, 1]: mean 0.5, unbiased std = sqrt(0.5) (population std would be 0.5)
    adv = L.group_advantages(torch.tensor([[0.0, 1.0]], dtype=torch.float64), eps=0.0)
    s = math.sqrt(0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.5 / s, 0.5 / s]], dtype=torch.float64))
    assert L.STD_CORRECTION == 1


def test_group_advantages_flat_groups_are_exact_zero():
    rewards = torch.tensor([[0.1, 0.1, 0.1], [7.0, 7.0, 7.0], [0.3, 0.3, 0.3]])
    for scale in ("std", "none"):
        adv = L.group_advantages(rewards, scale=scale)
        assert torch.equal(adv, torch.zeros_like(adv))
    # float32 mean of 7 identical values rounds away from the value: still exactly 0
    rounding = torch.full((1, 7), 2.747471332550049, dtype=torch.float32)
    assert (rounding - rounding.mean(dim=1, keepdim=True) != 0).any()
    for scale in ("std", "none"):
        assert torch.equal(L.group_advantages(rounding, scale=scale), torch.zeros(1, 7))
    single = L.group_advantages(torch.tensor([[1.0], [2.0]]))  # G == 1: no NaN
    assert torch.equal(single, torch.zeros(2, 1))


def test_group_advantages_int_rewards_and_errors():
    adv = L.group_advantages(torch.tensor([[0, 1, 1, 0]]))
    assert adv.is_floating_point()
    with pytest.raises(ValueError, match=r"scale.*'std'.*'none'"):
        L.group_advantages(torch.zeros(2, 3), scale="minmax")
    with pytest.raises(ValueError, match="rewards"):
        L.group_advantages(torch.zeros(6))


def test_zero_std_fraction():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 2.0, 3.0]])
    assert L.zero_std_fraction(rewards) == pytest.approx(0.5)
    assert isinstance(L.zero_std_fraction(rewards), float)
    assert L.zero_std_fraction(torch.zeros(0, 4)) == 0.0


# --------------------------------------------------------------------------- clipped_surrogate


def _ref_surrogate(logp, old, adv, lo, hi):
    loss, clipped = [], []
    for i in range(len(logp)):
        lrow, crow = [], []
        for t in range(len(logp[i])):
            a = adv[i][t] if isinstance(adv[i], list) else adv[i]
            r = math.exp(logp[i][t] - old[i][t])
            s1 = r * a
            s2 = min(max(r, 1 - lo), 1 + hi) * a
            lrow.append(-min(s1, s2))
            crow.append(s2 < s1)
        loss.append(lrow)
        clipped.append(crow)
    return loss, clipped


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_clipped_surrogate_matches_loop(seed, per_token_adv):
    gen = torch.Generator().manual_seed(seed)
    n, t = 6, 9
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    # log-ratios spread over [-0.6, 0.6] so ratios fall below, inside and above [0.8, 1.28]
    logp = old + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5) * 1.2
    shape = (n, t) if per_token_adv else (n,)
    adv = torch.randn(shape, generator=gen, dtype=torch.float64)
    loss, clipped = L.clipped_surrogate(logp, old, adv, eps_low=0.2, eps_high=0.28)
    want_loss, want_clip = _ref_surrogate(logp.tolist(), old.tolist(), adv.tolist(), 0.2, 0.28)
    torch.testing.assert_close(loss, torch.tensor(want_loss, dtype=torch.float64))
    assert clipped.tolist() == want_clip
    ratio = (logp - old).exp()
    assert (ratio < 0.8).any() and (ratio > 1.28).any() and ((ratio > 0.8) & (ratio < 1.28)).any()


def test_clipped_surrogate_by_hand_asymmetric():
    ratios = torch.tensor([[0.5, 1.0, 1.2, 1.5, 0.5, 1.5]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    logp = ratios.log()
    loss, clipped = L.clipped_surrogate(logp, torch.zeros_like(logp), adv, 0.2, 0.28)
    # A>0: min(r, clip(r)) -> 0.5 (unclipped), 1.0, 1.2, 1.28 (clip-high active)
    # A<0: min(-r, -clip(r)) -> -0.8 (clip-low active), -1.5 (unclipped)
    want = torch.tensor([[-0.5, -1.0, -1.2, -1.28, 0.8, 1.5]], dtype=torch.float64)
    torch.testing.assert_close(loss, want)
    assert clipped.tolist() == [[False, False, False, True, True, False]]


def test_clipped_surrogate_gradient_zero_when_clipped():
    logp = torch.tensor([[math.log(1.5), math.log(1.1)]], dtype=torch.float64, requires_grad=True)
    loss, _ = L.clipped_surrogate(logp, torch.zeros(1, 2, dtype=torch.float64), torch.ones(1))
    loss.sum().backward()
    # clipped token: no gradient; unclipped: d(-r)/dlogp = -r
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.1]], dtype=torch.float64))


def test_clipped_surrogate_bad_args():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="eps_low"):
        L.clipped_surrogate(x, x, torch.zeros(2), eps_low=-0.1)
    with pytest.raises(ValueError, match="eps_high"):
        L.clipped_surrogate(x, x, torch.zeros(2), eps_high=-0.1)
    with pytest.raises(ValueError, match="advantages"):
        L.clipped_surrogate(x, x, torch.zeros(2, 3, 1))


# --------------------------------------------------------------------------- aggregate


def _ref_aggregate(x, m, mode):
    if mode == "token_mean":
        num = sum(x[i][t] * m[i][t] for i in range(len(x)) for t in range(len(x[i])))
        den = sum(m[i][t] for i in range(len(x)) for t in range(len(x[i])))
        return num / den if den else 0.0
    means = []
    for i in range(len(x)):
        den = sum(m[i])
        if den:
            means.append(sum(x[i][t] * m[i][t] for t in range(len(x[i]))) / den)
    return sum(means) / len(means) if means else 0.0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", ["token_mean", "seq_mean"])
def test_aggregate_matches_loop(seed, mode):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(7, 11, generator=gen, dtype=torch.float64)
    mask = _ragged_mask(gen, 7, 11, empty_row=3)
    x_garbage = x.clone()
    x_garbage[~mask] = float("nan")  # unselected garbage must not leak
    got = L.aggregate(x_garbage, mask, mode)
    want = _ref_aggregate(x.tolist(), mask.double().tolist(), mode)
    assert got.item() == pytest.approx(want, rel=1e-12)
    # a float mask gives the same answer as a bool mask
    assert L.aggregate(x, mask.double(), mode).item() == pytest.approx(want, rel=1e-12)


def test_aggregate_modes_differ_on_ragged_lengths():
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, True], [True, False, False, False]])
    assert L.aggregate(x, mask, "token_mean").item() == pytest.approx(4 / 5)
    assert L.aggregate(x, mask, "seq_mean").item() == pytest.approx(1 / 2)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean"])
def test_aggregate_nothing_selected_is_zero_with_grad(mode):
    x = torch.randn(3, 4, requires_grad=True)
    out = L.aggregate(x, torch.zeros(3, 4, dtype=torch.bool), mode)
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert torch.equal(x.grad, torch.zeros(3, 4))


def test_aggregate_bad_args():
    with pytest.raises(ValueError, match=r"mode.*'token_mean'.*'seq_mean'"):
        L.aggregate(torch.zeros(2, 2), torch.ones(2, 2), "sum")
    with pytest.raises(ValueError, match="shape"):
        L.aggregate(torch.zeros(2, 2), torch.ones(2, 3), "token_mean")


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


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_loss_gradient_only_on_selected_tokens(agg, seed):
    gen = torch.Generator().manual_seed(seed)
    n, t = 4, 10
    completion = _ragged_mask(gen, n, t, empty_row=None)
    entropy = torch.rand(n, t, generator=gen)
    sel = L.entropy_topk_mask(entropy, completion, 0.3) & completion
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

    loss, stats = L.grpo_loss(logp, old, adv, sel, eps_low=0.2, eps_high=0.28, agg=agg,
                              ref_logp=ref, beta=0.05)
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert torch.equal(logp.grad[~sel], torch.zeros_like(logp.grad[~sel]))
    assert (logp.grad[sel] != 0).all()
    assert all(torch.isfinite(v) and not v.requires_grad for v in stats.values())


def test_grpo_loss_matches_pieces_and_stats():
    gen = torch.Generator().manual_seed(0)
    n, t = 5, 7
    mask = _ragged_mask(gen, n, t, empty_row=4)
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64)
    logp = old + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5)
    ref = old + 0.1 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    for agg in ("token_mean", "seq_mean"):
        loss, stats = L.grpo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, agg=agg,
                                  ref_logp=ref, beta=0.1)
        per_tok, clipped = L.clipped_surrogate(logp, old, adv, 0.2, 0.28)
        policy = L.aggregate(per_tok, mask, agg)
        kl = L.aggregate(L.kl_k3(logp, ref), mask, agg)
        torch.testing.assert_close(loss, policy + 0.1 * kl)
        torch.testing.assert_close(stats["policy"], policy)
        torch.testing.assert_close(stats["kl"], kl)
        torch.testing.assert_close(stats["clip_frac"], L.clip_fraction(clipped, mask))
        torch.testing.assert_close(stats["approx_kl"], L.approx_kl(logp, old, mask))
        assert set(stats) == {"policy", "kl", "clip_frac", "approx_kl"}
    for kwargs in ({"beta": 0.0, "ref_logp": ref}, {"beta": 0.1, "ref_logp": None}):
        loss, stats = L.grpo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, **kwargs)
        assert stats["kl"].item() == 0.0
        torch.testing.assert_close(loss, stats["policy"])


def test_grpo_loss_bad_args():
    x = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"agg.*'token_mean'.*'seq_mean'"):
        L.grpo_loss(x, x, torch.zeros(2), m, eps_low=0.2, eps_high=0.2, agg="mean")
    with pytest.raises(ValueError, match="beta"):
        L.grpo_loss(x, x, torch.zeros(2), m, eps_low=0.2, eps_high=0.2, beta=-1.0)


# --------------------------------------------------------------------------- diagnostics


@pytest.mark.parametrize("seed", SEEDS)
def test_approx_kl_and_clip_fraction_match_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    n, t = 4, 6
    mask = _ragged_mask(gen, n, t)
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64)
    logp = (old + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5)).requires_grad_()
    lp = logp.detach().clone()
    lp[~mask] = math.nan
    got = L.approx_kl(lp, old, mask)
    terms = [math.exp(a - b) - 1 - (a - b)
             for ra, rb, rm in zip(lp.tolist(), old.tolist(), mask.tolist())
             for a, b, m in zip(ra, rb, rm) if m]
    assert got.item() == pytest.approx(sum(terms) / len(terms), rel=1e-12)
    assert not L.approx_kl(logp, old, mask).requires_grad

    _, clipped = L.clipped_surrogate(logp, old, torch.ones(n, dtype=torch.float64))
    flags = [c for rc, rm in zip(clipped.tolist(), mask.tolist()) for c, m in zip(rc, rm) if m]
    assert L.clip_fraction(clipped, mask).item() == pytest.approx(sum(flags) / len(flags))
    empty = torch.zeros(n, t, dtype=torch.bool)
    assert L.clip_fraction(clipped, empty).item() == 0.0
    assert L.approx_kl(lp, old, empty).item() == 0.0


# --------------------------------------------------------------------------- EWC


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
    pen = L.ewc_penalty(params, anchor, fisher, lam)
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
    pen = L.ewc_penalty(at_anchor, anchor, fisher, 3.0)
    assert pen.item() == 0.0
    pen.backward()
    assert all(torch.equal(at_anchor[k].grad, torch.zeros_like(anchor[k])) for k in fisher)
    zero = L.ewc_penalty(params, anchor, {}, 1.0)
    assert isinstance(zero, torch.Tensor) and zero.item() == 0.0
    with pytest.raises(KeyError, match="missing_layer"):
        L.ewc_penalty(params, anchor, {"missing_layer": torch.ones(1)}, 1.0)


def test_ewc_penalty_float32_params():
    p = {"w": torch.ones(3, dtype=torch.bfloat16, requires_grad=True)}
    pen = L.ewc_penalty(p, {"w": torch.zeros(3)}, {"w": torch.full((3,), 2.0)}, 1.0)
    assert pen.dtype == torch.float32 and pen.item() == pytest.approx(3.0)
    pen.backward()
    assert p["w"].grad.dtype == torch.bfloat16


def test_online_fisher():
    f1 = {"w": torch.tensor([1.0, 2.0]), "old_only": torch.tensor([4.0])}
    f2 = {"w": torch.tensor([10.0, 20.0]), "new_only": torch.tensor([5.0])}
    first = L.online_fisher(None, f1, gamma=0.9)
    assert torch.equal(first["w"], f1["w"]) and first["w"] is not f1["w"]
    acc = L.online_fisher(first, f2, gamma=0.5)
    assert torch.equal(acc["w"], torch.tensor([10.5, 21.0]))
    assert torch.equal(acc["old_only"], torch.tensor([2.0]))
    assert torch.equal(acc["new_only"], torch.tensor([5.0]))
    assert torch.equal(first["w"], torch.tensor([1.0, 2.0]))  # inputs untouched
    # three steps by loop: F = g^2 F1 + g F2 + F3
    fs = [torch.rand(3, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    run = None
    for f in fs:
        run = L.online_fisher(run, {"x": f}, gamma=0.8)
    torch.testing.assert_close(run["x"], 0.64 * fs[0] + 0.8 * fs[1] + fs[2])
    with pytest.raises(ValueError, match=r"gamma.*\[0, 1\]"):
        L.online_fisher(None, f1, gamma=1.5)
