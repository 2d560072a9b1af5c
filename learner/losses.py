"""Loss math for GRPO-style policy optimisation (pure torch, no model, no Ray).

Everything here is a function of tensors only, so it can be unit-tested against
plain-Python loops. Shapes use these letters:

    B  prompts (groups) in the batch      G  completions sampled per prompt
    N  sequences (N = B * G when flattened) T  completion tokens per sequence (padded)

References:
    PPO          Schulman et al. 2017, "Proximal Policy Optimization Algorithms".
    GRPO         Shao et al. 2024, "DeepSeekMath" (group-relative advantages).
    Dr. GRPO     Liu et al. 2025, "Understanding R1-Zero-Like Training" (no std scaling).
    DAPO         Yu et al. 2025 (clip-higher, token-level loss aggregation).
    80/20        Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens".
    k3           Schulman 2020, "Approximating KL Divergence" (blog note).
    EWC          Kirkpatrick et al. 2017, "Overcoming catastrophic forgetting".
    Online EWC   Schwarz et al. 2018, "Progress & Compress".

Masking convention: a token is *selected* where ``mask != 0``. Positions outside the
mask may hold garbage (0, -inf, NaN) in any log-prob tensor; every function that takes a
mask replaces them with ``torch.where`` *before* any arithmetic, so neither the loss nor
the gradient can see them (multiplying by the mask afterwards would turn NaN * 0 into NaN).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# The one place the std convention lives: Bessel-corrected (unbiased, divide by G - 1),
# i.e. torch's default and what TRL's GRPOTrainer uses.
STD_CORRECTION = 1

ADVANTAGE_SCALES = ("std", "none")
AGGREGATION_MODES = ("token_mean", "seq_mean")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; allowed values: {allowed}")


def _all_equal_rows(rewards: Tensor) -> Tensor:
    """(B, G) -> (B,) bool: True where every reward in the row equals the first one."""
    return (rewards == rewards[:, :1]).all(dim=1)


# --------------------------------------------------------------------------- advantages


def group_advantages(rewards: Tensor, scale: str = "std", eps: float = 1e-4) -> Tensor:
    """Group-relative advantages.

    rewards (B, G) -> advantages (B, G), one scalar per completion.

    GRPO (Shao et al. 2024), scale="std":   A_i = (r_i - mean(r)) / (std(r) + eps)
    Dr. GRPO (Liu et al. 2025), scale="none": A_i =  r_i - mean(r)
    std is the unbiased estimate (see STD_CORRECTION). Rows whose rewards are all equal
    carry no learning signal and get exactly 0 (also avoids a NaN std when G == 1).
    """
    _check_choice("scale", scale, ADVANTAGE_SCALES)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be 2-D (B, G), got shape {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.float()

    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if scale == "std" and rewards.shape[1] > 1:  # G == 1: std undefined, row is flat anyway
        std = rewards.std(dim=1, keepdim=True, correction=STD_CORRECTION)
        centered = centered / (std + eps)
    # mean() of identical floats can round away from the value itself; force exact zeros.
    flat = _all_equal_rows(rewards).unsqueeze(1)
    return torch.where(flat, torch.zeros_like(centered), centered)


def zero_std_fraction(rewards: Tensor) -> float:
    """Fraction of groups with no reward variance. rewards (B, G) -> float in [0, 1].

    These groups yield zero advantage, hence zero policy gradient (DAPO's
    "dynamic sampling" filters them out); a useful health metric.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be 2-D (B, G), got shape {tuple(rewards.shape)}")
    if rewards.shape[0] == 0:
        return 0.0
    return _all_equal_rows(rewards).float().mean().item()


# --------------------------------------------------------------------------- policy loss


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> tuple[Tensor, Tensor]:
    """Per-token clipped surrogate loss (PPO, Schulman et al. 2017; clip-higher from DAPO).

    logp, old_logp: (N, T) log-probs of the sampled tokens under the current policy and
    the behaviour policy that sampled them. advantages: (N,) per sequence (broadcast over T)
    or (N, T).

        r_t  = exp(logp_t - old_logp_t)
        L_t  = -min(r_t * A, clip(r_t, 1 - eps_low, 1 + eps_high) * A)

    Returns (loss (N, T), clipped (N, T) bool: the clipped branch was strictly smaller, i.e.
    the token's gradient is zeroed by the clip).
    Elementwise: garbage in logp gives garbage at that position only; mask it beforehand
    (grpo_loss does).
    """
    if not 0.0 <= eps_low <= 1.0:
        raise ValueError(f"eps_low={eps_low} must be in [0, 1]")
    if eps_high < 0.0:
        raise ValueError(f"eps_high={eps_high} must be >= 0")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # (N,) -> (N, 1), broadcast over T
    if advantages.dim() != 2:
        raise ValueError(f"advantages must be (N,) or (N, T), got {tuple(advantages.shape)}")

    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped_obj = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.min(unclipped, clipped_obj)
    return loss, clipped_obj < unclipped


def aggregate(per_token: Tensor, mask: Tensor, mode: str = "token_mean") -> Tensor:
    """Reduce a per-token quantity to a scalar. per_token (N, T), mask (N, T) bool/float -> ().

    token_mean (DAPO):          sum_{i,t} x_it m_it / sum_{i,t} m_it
        every token weighs the same, so long answers are not down-weighted.
    seq_mean (original GRPO):   mean_i [ sum_t x_it m_it / sum_t m_it ]
        over sequences with at least one selected token.
    With no selected token at all the result is 0, still attached to the graph so that
    backward() works (and yields zero gradients). Never syncs with the device.
    """
    _check_choice("mode", mode, AGGREGATION_MODES)
    if mask.shape != per_token.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != per_token {tuple(per_token.shape)}")
    w = mask.to(per_token.dtype)
    # where, not x * m: a NaN at an unselected position would survive a multiplication by 0.
    x = torch.where(mask != 0, per_token, torch.zeros_like(per_token)) * w

    if mode == "token_mean":
        denom = w.sum()
        return x.sum() / torch.where(denom > 0, denom, torch.ones_like(denom))

    row_den = w.sum(dim=1)
    has_tokens = row_den > 0
    row_mean = x.sum(dim=1) / torch.where(has_tokens, row_den, torch.ones_like(row_den))
    n_rows = has_tokens.sum().clamp(min=1)  # rows without tokens have row_mean == 0 exactly
    return (row_mean * has_tokens).sum() / n_rows


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref), per token. (N, T), (N, T) -> (N, T).

        k3 = exp(ref - logp) - (ref - logp) - 1   >= 0, unbiased when tokens ~ pi.
    """
    log_ratio = ref_logp - logp
    # expm1(d) - d == exp(d) - d - 1 without the cancellation near d = 0 (keeps it >= 0).
    return torch.expm1(log_ratio) - log_ratio


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


# --------------------------------------------------------------------------- continual learning


def ewc_penalty(
    params: dict[str, Tensor],
    anchor: dict[str, Tensor],
    fisher: dict[str, Tensor],
    lam: float,
) -> Tensor:
    """Elastic Weight Consolidation (Kirkpatrick et al. 2017).

        penalty = lam / 2 * sum_i F_i (theta_i - theta*_i)^2

    params / anchor / fisher: name -> tensor of the same shape. Only the names in fisher are
    penalised (params may hold more); anchor and fisher are treated as constants.
    Returns a scalar attached to params' graph (accumulated in at least float32),
    or a zero tensor when fisher is empty.
    """
    total: Tensor | None = None
    for name, f in fisher.items():
        if name not in params:
            raise KeyError(f"ewc_penalty: fisher has {name!r} but params does not")
        if name not in anchor:
            raise KeyError(f"ewc_penalty: fisher has {name!r} but anchor does not")
        theta = params[name]
        dtype = torch.promote_types(theta.dtype, torch.float32)
        diff = theta.to(dtype) - anchor[name].detach().to(theta.device, dtype)
        term = (f.detach().to(theta.device, dtype) * diff.pow(2)).sum()
        total = term if total is None else total + term
    if total is None:
        device = next(iter(params.values())).device if params else None
        return torch.zeros((), device=device)
    return 0.5 * lam * total


@torch.no_grad()
def online_fisher(
    prev: dict[str, Tensor] | None, new: dict[str, Tensor], gamma: float
) -> dict[str, Tensor]:
    """Online EWC running Fisher (Schwarz et al. 2018, Progress & Compress).

        F <- gamma * F_prev + F_new

    prev None -> a copy of new. Names present in only one dict keep gamma * F_prev or F_new.
    Returns new, detached tensors (inputs are never modified).
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma={gamma} must be in [0, 1]")
    if prev is None:
        return {name: f.detach().clone() for name, f in new.items()}
    out = {name: gamma * f.detach() for name, f in prev.items()}
    for name, f in new.items():
        out[name] = out[name] + f.detach() if name in out else f.detach().clone()
    return out


# --------------------------------------------------------------------------- diagnostics


@torch.no_grad()
def approx_kl(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """Mean over selected tokens of (r - 1) - log r, r = exp(logp - old_logp) (k3 of the ratio).

    (N, T) x3 -> () detached. Estimates KL(pi_old || pi); how far the update has moved.
    """
    sel = mask != 0
    log_ratio = torch.where(sel, logp - old_logp, torch.zeros_like(logp))
    k3 = torch.expm1(log_ratio) - log_ratio
    return k3.sum() / sel.sum().clamp(min=1)


@torch.no_grad()
def clip_fraction(clipped: Tensor, mask: Tensor) -> Tensor:
    """Fraction of selected tokens where the clipped branch was active. (N, T) x2 -> () float."""
    sel = mask != 0
    return (clipped & sel).sum().float() / sel.sum().clamp(min=1)


# --------------------------------------------------------------------------- full objective


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    agg: str = "token_mean",
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO objective: clipped surrogate + beta * k3 KL to a reference, aggregated by agg.

        J = agg_t[ -min(r_t A, clip(r_t, 1-eps_low, 1+eps_high) A) + beta * k3_t ]

    logp, old_logp, ref_logp: (N, T); advantages (N,) or (N, T); mask (N, T) is the SELECTED
    token mask (completion tokens AND any entropy mask). Unselected positions may contain
    garbage (-inf, NaN): they are replaced before exp, so they get exactly zero gradient.
    Returns (loss scalar, stats) with detached 'policy', 'kl' (0 if beta == 0 or ref_logp is
    None), 'clip_frac', 'approx_kl'.
    """
    _check_choice("agg", agg, AGGREGATION_MODES)
    if beta < 0.0:
        raise ValueError(f"beta={beta} must be >= 0")
    sel = mask != 0

    def clean(x: Tensor) -> Tensor:  # where() routes zero gradient to unselected positions
        return torch.where(sel, x, torch.zeros_like(x))

    logp, old_logp = clean(logp), clean(old_logp.detach())
    per_token, clipped = clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high)
    policy = aggregate(per_token, mask, agg)

    if beta > 0.0 and ref_logp is not None:
        kl = aggregate(kl_k3(logp, clean(ref_logp.detach())), mask, agg)
        loss = policy + beta * kl
    else:
        kl = torch.zeros_like(policy)
        loss = policy

    stats = {
        "policy": policy.detach(),
        "kl": kl.detach(),
        "clip_frac": clip_fraction(clipped, mask),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }
    return loss, stats
