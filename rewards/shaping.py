"""Reward shaping (pure Python and numpy): the format bonus, and the length penalty.

The reward of a completion is correct + w * format_score. With `if_correct` the bonus counts
only for a right answer: a policy can then no longer earn reward by writing the asked
`Answer: N` line around a guess, which is how a seed of the embedded model once unlearned its
working (completions fell from ~15 tokens of sums to `Answer: 8` in ten steps). With
`reward.format_needs_working` the bonus counts only after valid working
(`rewards.working.working_valid`: true arithmetic statements, not copied from the question,
ending at the answer): a bare `Answer: N` line, a restated question or a false sum above a guess
earns nothing, while the bonus still teaches the line from the first step.

DAPO's soft overlong punishment (Yu et al. 2025, Eq. 13): with L_max = max_new_tokens and a
buffer of L_cache tokens before it,

    R_length(y) = 0                                  |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
                = -1                                  |y| > L_max

Our workers stop at L_max, so a completion cut there gets exactly -1 and the ramp shapes the
ones that finished just before the limit.
"""

from __future__ import annotations

import math

import numpy as np

from rewards.styles import get_style
from rewards.verifiers.reference import OTHER_TAG_SCORE
from rewards.working import working_valid


def format_bonus(fmt: np.ndarray, texts: list[str], needs_working: bool,
                 other_tag: bool = True, styles: list[str | None] | None = None,
                 verifiers: list[str | None] | None = None,
                 questions: list[str | None] | None = None) -> np.ndarray:
    """(N,) what the format bonus pays for: the (N,) format scores, zeroed where
    `needs_working` and a completion has no valid working before its answer line
    (`rewards.working.working_valid`: true statements ending at the answer, not copied from
    `questions[i]`; only for numeric answers, `verifiers[i]` None or "numeric", and never for
    a `one_line` style's sample, `styles[i]`, which asks for no working), and, unless
    `other_tag`, where its only tag is another answer style's (`OTHER_TAG_SCORE`)."""
    fmt = np.asarray(fmt, dtype=np.float32)                                         # (N,)
    if not other_tag:
        fmt = np.where(fmt == np.float32(OTHER_TAG_SCORE), np.float32(0.0), fmt)   # (N,)
    if not needs_working:
        return fmt
    styles = styles if styles is not None else [None] * len(texts)
    verifiers = verifiers if verifiers is not None else [None] * len(texts)
    questions = questions if questions is not None else [None] * len(texts)
    worked = [get_style(s).one_line or v not in (None, "numeric") or working_valid(t, q)
              for t, s, v, q in zip(texts, styles, verifiers, questions)]
    return fmt * np.array(worked, dtype=np.float32)                                 # (N,)


def combine(correct: np.ndarray, fmt: np.ndarray, weight: float,
            if_correct: bool = False) -> np.ndarray:
    """(N,) rewards from (N,) correctness in {0, 1} and (N,) format scores in [0, 1]:
    correct + weight * fmt, the bonus multiplied by correct when `if_correct`."""
    bonus = weight * fmt * correct if if_correct else weight * fmt                  # (N,)
    return (correct + bonus).astype(np.float32)


def overlong_penalty(length: int, max_new_tokens: int, buffer_frac: float) -> float:
    """R_length of a completion of `length` tokens (see the module docstring), in [-1, 0].

    buffer_frac: L_cache as a share of max_new_tokens (at least one token).
    """
    if max_new_tokens < 1 or not 0.0 < buffer_frac <= 1.0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1 and "
                         f"buffer_frac={buffer_frac} in (0, 1]")
    cache = max(1, math.ceil(buffer_frac * max_new_tokens))
    start = max_new_tokens - cache
    if length <= start:
        return 0.0
    if length > max_new_tokens:
        return -1.0
    return (start - length) / cache
