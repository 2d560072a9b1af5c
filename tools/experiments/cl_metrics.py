"""The standard continual-learning summary of an accuracy matrix (pure Python, no model).

    R[i][j] = accuracy on stage j's held-out set after training stage i   (T x T)
    b[j]    = the base model's accuracy on stage j's set                   (T,)

    ACC = 1/T     sum_j        R[T-1][j]             final accuracy, averaged over stages
    BWT = 1/(T-1) sum_{j<T-1}  R[T-1][j] - R[j][j]   backward transfer: < 0 is forgetting
    FWT = 1/(T-1) sum_{j>0}    R[j-1][j] - b[j]      forward transfer: what earlier stages
                                                     gave stage j before it was trained

(Lopez-Paz & Ranzato 2017, "Gradient Episodic Memory for Continual Learning", section 4.)
`kept` is the share of stage 1's gain still there at the end: (R[T-1][0] - b[0]) /
(R[0][0] - b[0]), the issue's "keeps at least 80% of stage 1's gain".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CLSummary:
    acc: float
    """final accuracy averaged over the stages"""
    bwt: float
    """backward transfer: mean change on earlier stages from just after training to the end"""
    fwt: float
    """forward transfer: mean gain on a stage from the earlier stages, before training it"""
    forgot_first: float
    """stage 1 accuracy lost by the end: R[0][0] - R[T-1][0]"""
    kept: float
    """share of stage 1's gain kept at the end (nan when stage 1 gained nothing)"""


def summarize(R: list[list[float]], base: list[float]) -> CLSummary:
    T = len(R)
    if T < 2 or any(len(row) != T for row in R) or len(base) != T:
        raise ValueError(f"R must be T x T with T >= 2 and base of length T; got {T} rows of "
                         f"{[len(r) for r in R]}, base of {len(base)}")
    last = R[T - 1]
    gain = R[0][0] - base[0]
    return CLSummary(
        acc=sum(last) / T,
        bwt=sum(last[j] - R[j][j] for j in range(T - 1)) / (T - 1),
        fwt=sum(R[j - 1][j] - base[j] for j in range(1, T)) / (T - 1),
        forgot_first=R[0][0] - last[0],
        kept=(last[0] - base[0]) / gain if gain > 0 else float("nan"),
    )
