"""The training order of a dataset: every sample once per epoch, reshuffled each epoch.

    order = EpochOrder(len(rows), seed=f"{run_seed}-gsm8k")
    rows[order.index(i)]          # training sample number i, for any i >= 0

Epoch `e` is a permutation seeded with `"{seed}-epoch-{e}"`, so sample `i` is the same in every
process and in a resumed run; the latest epoch's permutation is cached.
"""

from __future__ import annotations

import random


class EpochOrder:
    """Seeded per-epoch permutations of `size` samples."""

    def __init__(self, size: int, seed: str):
        if size < 1:
            raise ValueError(f"EpochOrder: needs at least one sample, got {size}")
        self.size, self.seed = size, seed
        self._cached: tuple[int, list[int]] | None = None

    def permutation(self, epoch: int) -> list[int]:
        if self._cached is None or self._cached[0] != epoch:
            order = list(range(self.size))
            random.Random(f"{self.seed}-epoch-{epoch}").shuffle(order)
            self._cached = (epoch, order)
        return self._cached[1]

    def index(self, i: int) -> int:
        """The row of training sample number `i`: epoch `i // size`, position `i % size`."""
        if i < 0:
            raise ValueError(f"sample index must be >= 0, got {i}")
        epoch, position = divmod(i, self.size)
        return self.permutation(epoch)[position]
