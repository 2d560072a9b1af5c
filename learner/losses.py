"""Loss math for GRPO-style policy optimisation (pure torch, no model, no Ray).

Everything here is a function of tensors only, so it can be unit-tested against
plain-Python loops. The EWC penalty lives in learner/ewc.py. Shapes use these letters:

    B  prompts (groups) in the batch      G  completions sampled per prompt
    N  sequences (N = B * G when flattened) T  completion tokens per sequence (padded)

References:
    PPO          Schulman et al. 2017, "Proximal Policy Optimization Algorithms".
    Dual-clip    Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL".
    GRPO         Shao et al. 2024, "DeepSeekMath" (group-relative advantages).
    Dr. GRPO     Liu et al. 2025, "Understanding R1-Zero-Like Training" (no std scaling).
    DAPO         Yu et al. 2025 (clip-higher, token-level loss aggregation).
    80/20        Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens".
    k3           Schulman 2020, "Approximating KL Divergence" (blog note).

Masking convention: a token is *selected* where ``mask != 0`` (or ``weights != 0``).
Positions outside it may hold garbage (0, -inf, NaN) in any log-prob tensor; every function
that takes a mask replaces them with ``torch.where`` *before* any arithmetic, so neither the
loss nor the gradient can see them (multiplying by the mask afterwards would turn NaN * 0
into NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch
from torch import Tensor

AGGREGATION_MODES = ("token_mean", "token_mean_all", "seq_mean", "dr_grpo")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; allowed values: {allowed}")


# --------------------------------------------------------------------------- policy loss


class Surrogate(NamedTuple):
    """Per-token clipped surrogate loss and which branch each token took, all (N, T)."""

    loss: Tensor
    """-min(r A, clip(r) A), capped at -c A for A < 0 under dual-clip"""
    clipped_low: Tensor
    """bool: A < 0 and r < 1 - eps_low (the clip zeroes the token's gradient)"""
    clipped_high: Tensor
    """bool: A > 0 and r > 1 + eps_high (the clip zeroes the token's gradient)"""
    dual_clipped: Tensor
    """bool: A < 0 and r > c (dual-clip's cap zeroes the token's gradient)"""


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip_c: float = 0.0,
) -> Surrogate:
    """Per-token clipped surrogate loss (PPO, Schulman et al. 2017; clip-higher from DAPO;
    dual-clip from Ye et al. 2020).

    logp, old_logp: (N, T) log-probs of the sampled tokens under the current policy and
    the behaviour policy that sampled them. advantages: (N,) per sequence (broadcast over T)
    or (N, T).

        r_t  = exp(logp_t - old_logp_t)
        L_t  = -min(r_t * A, clip(r_t, 1 - eps_low, 1 + eps_high) * A)
        dual-clip (c > 1), for A < 0 only:   L_t = min(L_t, -c * A)

    Dual-clip bounds what one token with a negative advantage can contribute when r is large
    (a stale sample the policy now likes much more than the behaviour policy did): plain PPO
    leaves -r A unbounded there. dual_clip_c == 0 turns it off.
    Elementwise: garbage in logp gives garbage at that position only; mask it beforehand
    (grpo_loss does).
    """
    if not 0.0 <= eps_low <= 1.0:
        raise ValueError(f"eps_low={eps_low} must be in [0, 1]")
    if eps_high < 0.0:
        raise ValueError(f"eps_high={eps_high} must be >= 0")
    if dual_clip_c != 0.0 and not dual_clip_c > 1.0:
        raise ValueError(f"dual_clip_c={dual_clip_c} must be 0 (off) or > 1")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # (N,) -> (N, 1), broadcast over T
    if advantages.dim() != 2:
        raise ValueError(f"advantages must be (N,) or (N, T), got {tuple(advantages.shape)}")

    ratio = torch.exp(logp - old_logp)                                           # (N, T)
    unclipped = ratio * advantages
    clipped_obj = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.min(unclipped, clipped_obj)
    clipped = clipped_obj < unclipped
    negative = (advantages < 0).expand_as(loss)
    dual = torch.zeros_like(clipped)
    if dual_clip_c:
        cap = -dual_clip_c * advantages                                          # > 0 where A < 0
        dual = negative & (loss > cap)
        loss = torch.where(dual, cap.expand_as(loss), loss)
    return Surrogate(loss, clipped & negative, clipped & ~negative, dual)


def loss_weights(selected: Tensor, counted: Tensor, mode: str = "token_mean",
                 max_new_tokens: int | None = None) -> Tensor:
    """Per-token weights w (N, T) of a whole step: the step's loss is sum_{i,t} w_it * l_it.

    selected (N, T) bool: tokens that get the policy gradient (the top-rho entropy tokens of
    the counted ones). counted (N, T) bool: completion tokens that count in the loss (padding
    and excluded sequences False). m = selected, c = counted, N' = rows of c with any token:

        token_mean      w = m / sum_{i,t} m_it          (default; DAPO's token-level mean and
                        the 80/20 paper's Eq. 6 and code: the entropy mask restricts the
                        numerator and the normaliser alike, so rho changes which tokens
                        learn, not the step size)
        token_mean_all  w = m / sum_{i,t} c_it          (the mask only in the numerator: the
                        loss shrinks about rho-fold; with Adam that mostly rescales the
                        penalties added to it, EWC and KL)
        seq_mean        w_it = m_it / (S * sum_t m_it)  over the S rows with a selected token
                        (the original GRPO: each sequence weighs the same, whatever its length)
        dr_grpo         w = m / (N' * max_new_tokens)   (Dr. GRPO, Liu et al. 2025: a constant
                        normaliser, G x max_new_tokens per prompt, so no length bias)

    Computed once per step, so any split into micro-batches sums to the same loss. No selected
    token at all gives all-zero weights.
    """
    _check_choice("mode", mode, AGGREGATION_MODES)
    if selected.shape != counted.shape:
        raise ValueError(f"selected {tuple(selected.shape)} != counted {tuple(counted.shape)}")
    m = (selected != 0).double()
    if mode == "token_mean":
        w = m / m.sum().clamp(min=1)
    elif mode == "token_mean_all":
        w = m / (counted != 0).sum().clamp(min=1)
    elif mode == "seq_mean":
        per_row = m.sum(1, keepdim=True)                                         # (N, 1)
        rows = (per_row > 0).sum().clamp(min=1)
        w = m / (per_row.clamp(min=1) * rows)
    else:
        if not max_new_tokens or max_new_tokens < 1:
            raise ValueError("dr_grpo needs max_new_tokens >= 1")
        rows = (counted != 0).any(1).sum().clamp(min=1)
        w = m / (rows * max_new_tokens)
    return w.float()


def aggregate(per_token: Tensor, weights: Tensor) -> Tensor:
    """sum_{i,t} w_it * x_it over the tokens with w > 0. per_token, weights (N, T) -> ().

    Positions with w == 0 may hold garbage (NaN, inf): they are replaced before the product
    (multiplying by 0 afterwards would turn NaN * 0 into NaN). With no weighted token the result
    is 0, still attached to the graph so that backward() works.
    """
    if weights.shape != per_token.shape:
        raise ValueError(f"weights shape {tuple(weights.shape)} != per_token "
                         f"{tuple(per_token.shape)}")
    w = weights.to(per_token.dtype)
    x = torch.where(weights != 0, per_token, torch.zeros_like(per_token))
    return (x * w).sum()


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref), per token. (N, T), (N, T) -> (N, T).

        k3 = exp(ref - logp) - (ref - logp) - 1   >= 0, unbiased when tokens ~ pi.
    """
    log_ratio = ref_logp - logp
    # expm1(d) - d == exp(d) - d - 1 without the cancellation near d = 0 (keeps it >= 0).
    return torch.expm1(log_ratio) - log_ratio


def anchor_kl(logp: Tensor, anchor_logp: Tensor, weights: Tensor) -> Tensor:
    """KL (k3) of the policy to an anchor policy on the sampled tokens, weighted like the loss.

        KL_anchor = sum_{i,t} w_it k3(logp_it, anchor_it)

    The anchor is the policy at the end of the previous curriculum stage (continual learning:
    stay close to what was learned, on the current stage's samples). logp, anchor_logp,
    weights: (N, T); unselected positions (w == 0) may hold garbage and get zero gradient.
    """
    sel = weights != 0
    logp = torch.where(sel, logp, torch.zeros_like(logp))
    anchor = torch.where(sel, anchor_logp.detach(), torch.zeros_like(logp))
    return aggregate(kl_k3(logp, anchor), weights)


# --------------------------------------------------------------------------- token selection


@torch.no_grad()
def entropy_topk_mask(entropy: Tensor, mask: Tensor, rho: float) -> Tensor:
    """Keep only the highest-entropy ("forking") tokens (Wang et al. 2025, 80/20 rule).

    entropy (N, T): per-token entropy of the sampling distribution. mask (N, T): completion
    tokens (padding False). Returns bool (N, T) with exactly k = ceil(rho * n_valid) True
    entries, the valid tokens of highest entropy across the whole batch (not per sequence).
    rho == 1 returns the mask. Padding is never selected, whatever its entropy; a NaN entropy
    on a valid token ranks lowest; ties go to the lower flat index (stable sort).
    """
    if not (0.0 < rho <= 1.0):  # also rejects NaN
        raise ValueError(f"rho={rho} must be in (0, 1]")
    valid = mask != 0
    if rho == 1.0:
        return valid

    flat_valid = valid.reshape(-1)
    score = entropy.detach().reshape(-1).float()
    score = torch.where(torch.isnan(score), torch.full_like(score, -math.inf), score)
    # Two stable sorts = lexicographic key (valid first, then entropy high->low, then index),
    # so padding can never outrank a valid token even when both score -inf.
    by_entropy = torch.sort(score, descending=True, stable=True).indices
    by_valid = torch.sort(flat_valid[by_entropy].to(torch.uint8), descending=True, stable=True)
    order = by_entropy[by_valid.indices]
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)

    n_valid = flat_valid.sum().to(torch.float64)
    k = torch.ceil(rho * n_valid)  # float64, same rounding as math.ceil(rho * n_valid)
    return ((rank < k) & flat_valid).reshape(valid.shape)


# --------------------------------------------------------------------------- diagnostics


def update_is_finite(terms: list[float], grad_norm: float) -> bool:
    """May a step's update be applied: every loss term it backpropagated (each micro-batch's,
    EWC's) and its gradient norm finite? A NaN or inf there (NaN or huge advantages) would
    write NaN into every weight the optimizer touches, and its moments."""
    return all(math.isfinite(x) for x in terms) and math.isfinite(grad_norm)


@dataclass
class LossStats:
    """Sums over the selected tokens of one micro-batch; `+` adds micro-batches of a step.

    policy and kl are already weighted (their sum over a step's micro-batches is the step's
    loss terms); the rest are plain sums and counts that `metrics()` turns into means.
    """

    tokens: float = 0.0
    """selected tokens seen"""
    policy: float = 0.0
    """sum of w * surrogate loss"""
    kl: float = 0.0
    """sum of w * k3 KL to the reference (0 without one)"""
    clip_low: float = 0.0
    """tokens with A < 0 clipped at 1 - eps_low"""
    clip_high: float = 0.0
    """tokens with A > 0 clipped at 1 + eps_high"""
    dual_clip: float = 0.0
    """tokens with A < 0 capped by dual-clip"""
    ratio: float = 0.0
    """sum of importance ratios r"""
    approx_kl: float = 0.0
    """sum of (r - 1) - log r"""
    logp_diff: float = 0.0
    """sum of |logp - old_logp|: learner vs behaviour, before this step's update"""
    logp_diff_max: float = 0.0
    """max of |logp - old_logp|"""

    def __add__(self, other: LossStats) -> LossStats:
        out = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        out["logp_diff_max"] = max(self.logp_diff_max, other.logp_diff_max)
        return LossStats(**out)

    def means(self) -> StepLosses:
        """The step's figures: the loss terms, and means over the selected tokens."""
        n = max(self.tokens, 1.0)
        return StepLosses(
            policy=self.policy, kl=self.kl, clip_frac=(self.clip_low + self.clip_high) / n,
            clip_frac_low=self.clip_low / n, clip_frac_high=self.clip_high / n,
            dual_clip_frac=self.dual_clip / n,
            ratio_mean=self.ratio / n if self.tokens else 1.0, approx_kl=self.approx_kl / n,
            logp_diff=self.logp_diff / n, logp_diff_max=self.logp_diff_max)


@dataclass(frozen=True)
class StepLosses:
    """A step's loss terms and per-token means (`LossStats.means`; common.types.LearnerStep
    carries them to the driver)."""

    policy: float
    kl: float
    clip_frac: float
    """share of selected tokens clipped, either side"""
    clip_frac_low: float
    clip_frac_high: float
    dual_clip_frac: float
    ratio_mean: float
    approx_kl: float
    logp_diff: float
    """mean |learner log-prob - behaviour log-prob| before the update: 0 up to noise on-policy"""
    logp_diff_max: float


@torch.no_grad()
def logp_stats(logp: Tensor, old_logp: Tensor, mask: Tensor) -> LossStats:
    """Only the learner-vs-behaviour figures (tokens, ratio, logp_diff) of selected tokens.

    (N, T) x3 -> LossStats. For a forward pass that trains nothing (the probe the learner runs
    when no sequence of a step has a non-zero advantage).
    """
    sel = mask != 0
    d = torch.where(sel, logp.detach() - old_logp, torch.zeros_like(logp))       # (N, T)
    return LossStats(tokens=float(sel.sum()), ratio=float(torch.where(sel, d.exp(), 0).sum()),
                     approx_kl=float((torch.expm1(d) - d).sum()),
                     logp_diff=float(d.abs().sum()),
                     logp_diff_max=float(d.abs().max()) if sel.any() else 0.0)


# --------------------------------------------------------------------------- full objective


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    weights: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float = 0.0,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
) -> tuple[Tensor, LossStats]:
    """The GRPO objective: clipped surrogate + beta * k3 KL to a reference, weighted per token.

        J = sum_{i,t} w_it [ -min(r_t A, clip(r_t, 1-eps_low, 1+eps_high) A) + beta * k3_t ]

    (with dual-clip's cap for A < 0 when dual_clip_c > 1). logp, old_logp, ref_logp: (N, T);
    advantages (N,) or (N, T); weights (N, T) from `loss_weights` (zero outside the selected
    tokens, which may hold garbage (-inf, NaN): they are replaced before exp, so they get exactly
    zero gradient). Returns (loss scalar, LossStats of this call's selected tokens).
    """
    if beta < 0.0:
        raise ValueError(f"beta={beta} must be >= 0")
    sel = weights != 0

    def clean(x: Tensor) -> Tensor:  # where() routes zero gradient to unselected positions
        return torch.where(sel, x, torch.zeros_like(x))

    logp, old_logp = clean(logp), clean(old_logp.detach())
    sur = clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high, dual_clip_c)
    policy = aggregate(sur.loss, weights)
    kl = torch.zeros_like(policy)
    if beta > 0.0 and ref_logp is not None:
        kl = aggregate(kl_k3(logp, clean(ref_logp.detach())), weights)
    stats = logp_stats(logp, old_logp, sel)
    stats.policy, stats.kl = float(policy.detach()), float(kl.detach())
    stats.clip_low = float((sur.clipped_low & sel).sum())
    stats.clip_high = float((sur.clipped_high & sel).sum())
    stats.dual_clip = float((sur.dual_clipped & sel).sum())
    return policy + beta * kl, stats
