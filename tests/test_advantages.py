"""Tests for learner/advantages.py (numpy): against a plain-Python loop and by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from learner import advantages as A

SEEDS = [0, 1, 2, 3, 4]


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
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 3, (6, 5)).astype(np.float64) * 0.5
    rewards[1] = 1.0  # a flat group
    rewards[2] = rng.normal(size=5)  # continuous rewards
    got = A.group_advantages(rewards, scale=scale, eps=1e-4)
    want = np.array(_ref_advantages(rewards.tolist(), scale, 1e-4))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.array_equal(got[1], np.zeros(5))


def test_group_advantages_unbiased_std_by_hand():
    # rewards [0, 1]: mean 0.5, unbiased std = sqrt(0.5) (population std would be 0.5)
    adv = A.group_advantages(np.array([[0.0, 1.0]]), eps=0.0)
    s = math.sqrt(0.5)
    np.testing.assert_allclose(adv, [[-0.5 / s, 0.5 / s]], rtol=1e-12)
    assert A.STD_CORRECTION == 1


def test_group_advantages_flat_groups_are_exact_zero():
    rewards = np.array([[0.1, 0.1, 0.1], [7.0, 7.0, 7.0], [0.3, 0.3, 0.3]], dtype=np.float32)
    for scale in ("std", "none"):
        assert np.array_equal(A.group_advantages(rewards, scale=scale), np.zeros((3, 3)))
    # a float32 mean of identical values that rounds away from the value: still exactly 0
    rounding = np.full((1, 7), 0.1, dtype=np.float32)
    assert (rounding - rounding.mean(axis=1, keepdims=True) != 0).any()
    for scale in ("std", "none"):
        assert np.array_equal(A.group_advantages(rounding, scale=scale), np.zeros((1, 7)))
    single = A.group_advantages(np.array([[1.0], [2.0]]))  # G == 1: no NaN
    assert np.array_equal(single, np.zeros((2, 1)))


def test_group_advantages_int_rewards_float32_in_float32_out_and_errors():
    adv = A.group_advantages(np.array([[0, 1, 1, 0]]))
    assert adv.dtype == np.float32
    assert A.group_advantages(np.array([[0, 1, 0, 1]], dtype=np.float32)).dtype == np.float32
    with pytest.raises(ValueError, match=r"scale.*'std'.*'none'"):
        A.group_advantages(np.zeros((2, 3)), scale="minmax")
    with pytest.raises(ValueError, match="rewards"):
        A.group_advantages(np.zeros(6))


def test_zero_std_fraction():
    rewards = np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 2.0, 3.0]])
    assert A.zero_std_fraction(rewards) == pytest.approx(0.5)
    assert isinstance(A.zero_std_fraction(rewards), float)
    assert A.zero_std_fraction(np.zeros((0, 4))) == 0.0


def test_rewards_near_the_float32_limit_give_finite_advantages_in_float32():
    """(3e38 - -3e38) overflows a float32 difference; the advantages are still finite and of
    the rewards' dtype, and a flat row of such rewards is exactly 0."""
    r = np.array([[3e38, -3e38, 3e38, -3e38], [3e38] * 4], dtype=np.float32)  # (B, G)
    a = A.group_advantages(r, scale="std")
    assert a.dtype == np.float32 and np.isfinite(a).all()
    np.testing.assert_allclose(a[0], [0.866, -0.866, 0.866, -0.866], atol=1e-3)
    assert (a[1] == 0).all()
    with_nan = np.array([[3e38, -3e38, np.nan]], dtype=np.float32)
    assert np.isfinite(A.group_advantages(with_nan, scale="std")).all()
