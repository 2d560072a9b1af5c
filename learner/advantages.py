"""Group-relative advantages (numpy only: the driver computes them and imports no torch).

    rewards (B, G) -> advantages (B, G), one scalar per completion; B prompts, G completions.

GRPO (Shao et al. 2024, "DeepSeekMath"), scale="std":   A_i = (r_i - mean(r)) / (std(r) + eps)
Dr. GRPO (Liu et al. 2025), scale="none":                A_i =  r_i - mean(r)
"""

from __future__ import annotations

import numpy as np

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
    """(B, G) -> (B,) bool: True where every reward in the row equals the first one."""
    return (rewards == rewards[:, :1]).all(axis=1)


def group_advantages(rewards, scale: str = "std", eps: float = 1e-4) -> np.ndarray:
    """Group-relative advantages of (B, G) rewards, same dtype (ints become float32).

    Rows whose rewards are all equal carry no learning signal and get exactly 0 (also avoids
    a NaN std when G == 1).
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale={scale!r} is not supported; allowed values: {ADVANTAGE_SCALES}")
    r = _rows(rewards)
    centered = r - r.mean(axis=1, keepdims=True)                                  # (B, G)
    if scale == "std" and r.shape[1] > 1:  # G == 1: std undefined, the row is flat anyway
        centered = centered / (r.std(axis=1, keepdims=True, ddof=STD_CORRECTION) + eps)
    # mean() of identical floats can round away from the value itself: force exact zeros
    return np.where(_all_equal_rows(r)[:, None], np.zeros_like(centered), centered)


def zero_std_fraction(rewards) -> float:
    """Fraction of groups with no reward variance, in [0, 1]: they get zero advantage, hence
    zero policy gradient (DAPO's "dynamic sampling" filters them out); a health metric."""
    r = _rows(rewards)
    return float(_all_equal_rows(r).mean()) if r.shape[0] else 0.0
