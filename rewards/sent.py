"""Semantic entropy of a prompt's sampled answers (SENT ordering, easy -> hard).

Completions are clustered by their verified, normalised final answer; the entropy of the
cluster distribution is low when the model keeps giving one answer (easy or confidently wrong)
and high when its answers scatter. A completion with no parsable answer is its own cluster:
it carries no agreement with anything.
"""

from __future__ import annotations

import math
from collections import Counter


def answer_entropy(answers: list[str | None]) -> float:
    """Entropy (nats) of the distribution of `answers` over answer clusters; 0 for one cluster."""
    if not answers:
        raise ValueError("answer_entropy: needs at least one answer")
    counts = Counter(a if a is not None else ("<none>", i) for i, a in enumerate(answers))
    n = len(answers)
    return -sum(c / n * math.log(c / n) for c in counts.values())


def sent_order(entropies: list[float]) -> list[int]:
    """Indices sorted by entropy, lowest first; ties keep their original order (stable)."""
    return sorted(range(len(entropies)), key=lambda i: entropies[i])
