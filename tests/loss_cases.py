"""Shared by the loss tests: seeds, aggregation modes, and a ragged completion mask."""

from __future__ import annotations

import torch

SEEDS = [0, 1, 2, 3, 4]
MODES = ["token_mean", "token_mean_all", "seq_mean", "dr_grpo"]


def ragged_mask(gen: torch.Generator, n: int, t: int, empty_row: int | None = 0) -> torch.Tensor:
    """Right-padded completion mask with random lengths; optionally one all-False row."""
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    if empty_row is not None:
        mask[empty_row] = False
    return mask
