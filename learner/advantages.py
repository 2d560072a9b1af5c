"""Group-relative advantages (numpy only: the driver computes them and imports no torch).

    rewards (B, G) -> advantages (B, G), one scalar per completion; B prompts, G completions.

GRPO (Shao et al. 2024, "DeepSeekMath"), scale="std":   A_i = (r_i - mean(r)) / (std(r) + eps)
Dr. GRPO (Liu et al. 2025), scale="none":                A_i =  r_i - mean(r)

A NaN reward is an unscorable completion (reward.fn: every function returned None): as in TRL's
GRPOTrainer it is left out of its group's mean and std, and its advantage is 0.
"""

from __future__ import annotations

import numpy as np

from common import metrics as M
from common.types import TrainPlan
from rewards.shaping import overlong_penalty

STD_CORRECTION = 1
"""The one place the std convention lives: Bessel-corrected (unbiased, divide by G - 1), as
torch's default and TRL's GRPOTrainer."""
ADVANTAGE_SCALES = ("std", "none")


def _rows(rewards) -> np.ndarray:
    r = np.asarray(rewards)
    if r.ndim != 2:
        raise ValueError(f"rewards must be 2-D (B, G), got shape {tuple(r.shape)}")
    return r if np.issubdtype(r.dtype, np.floating) else r.astype(np.float32)


def _all_equal_rows(rewards: np.ndarray) -> np.ndarray:
    """(B, G) -> (B,) bool: True where every scorable (not NaN) reward in the row is the same
    (a row with one scorable reward, or none, too)."""
    scored = ~np.isnan(rewards)                                                    # (B, G)
    low = np.where(scored, rewards, np.inf).min(axis=1)                            # (B,)
    high = np.where(scored, rewards, -np.inf).max(axis=1)                          # (B,)
    return high <= low


def _centered_nan(r: np.ndarray, scale: str, eps: float) -> np.ndarray:
    """(B, G) advantages of rewards with NaNs: mean and (Bessel) std over each row's scorable
    rewards only, 0 at the NaNs (what TRL's nanmean / nanstd / nan_to_num give)."""
    scored = ~np.isnan(r)                                                          # (B, G)
    n = scored.sum(axis=1, keepdims=True)                                          # (B, 1)
    mean = np.where(scored, r, 0).sum(axis=1, keepdims=True) / np.maximum(n, 1)    # (B, 1)
    centered = np.where(scored, r - mean, 0)                                       # (B, G)
    if scale == "std":
        var = (centered ** 2).sum(axis=1, keepdims=True) / np.maximum(n - STD_CORRECTION, 1)
        centered = centered / (np.sqrt(var) + eps)
    return centered


def group_advantages(rewards, scale: str = "std", eps: float = 1e-4) -> np.ndarray:
    """Group-relative advantages of (B, G) rewards, same dtype (ints become float32).

    Rows whose rewards are all equal carry no learning signal and get exactly 0 (also avoids
    a NaN std when G == 1). NaN rewards (unscorable) are left out of their row's mean and std
    and get 0.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale={scale!r} is not supported; allowed values: {ADVANTAGE_SCALES}")
    given = _rows(rewards)
    r = given.astype(np.float64)  # a float32 sum or difference of rewards near 3e38 overflows
    if np.isnan(r).any():  # unscorable completions (reward.fn)
        centered = _centered_nan(r, scale, eps)                                    # (B, G)
    else:
        centered = r - r.mean(axis=1, keepdims=True)                              # (B, G)
        if scale == "std" and r.shape[1] > 1:  # G == 1: std undefined, the row is flat anyway
            centered = centered / (r.std(axis=1, keepdims=True, ddof=STD_CORRECTION) + eps)
    # mean() of identical floats can round away from the value itself: force exact zeros
    flat = _all_equal_rows(r)[:, None]
    return np.where(flat, 0.0, centered).astype(given.dtype)


def zero_std_fraction(rewards) -> float:
    """Fraction of groups with no reward variance, in [0, 1]: they get zero advantage, hence
    zero policy gradient (DAPO's "dynamic sampling" filters them out); a health metric."""
    r = _rows(rewards)
    return float(_all_equal_rows(r).mean()) if r.shape[0] else 0.0


def plan_step(summary, cfg) -> tuple[TrainPlan, dict]:
    """The driver's TrainPlan for a step's RolloutSummary (`common.types`) under `cfg`: group-
    normalised advantages over each prompt's G completions, after the overlong rule.

    reward.overlong: keep (a cut completion is scored like any other; it rarely holds the
    asked final answer, so it usually earns 0), mask (its reward still counts in its group's
    mean and std, but its tokens get no loss: DAPO's overlong filtering), soft_penalty (DAPO's
    length shaping added to every reward, rewards/shaping.py).
    """
    g, rule = cfg.rollout.group_size, cfg.reward.overlong
    cut = np.array([r == "length" for r in summary.finish_reasons], dtype=bool)       # (N,)
    rewards_np = np.asarray(summary.rewards, dtype=np.float32)
    stats = {}
    if rule == "soft_penalty":
        penalty = np.array([overlong_penalty(int(n), cfg.rollout.max_new_tokens,
                                             cfg.reward.overlong_buffer)
                            for n in summary.lengths], dtype=np.float32)
        rewards_np = rewards_np + penalty
        stats[M.REWARD_OVERLONG] = float(penalty.mean())
    rewards = rewards_np.reshape(-1, g)                                            # (B, G)
    adv = group_advantages(rewards, scale=cfg.grpo.adv_scale).reshape(-1)        # (B*G,)
    plan = TrainPlan(adv, keep=~cut if rule == "mask" else None,
                     version=summary.version)
    return plan, {M.ADV_ZERO_STD: zero_std_fraction(rewards), **stats}
