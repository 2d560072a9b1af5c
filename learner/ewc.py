"""EWC math for continual learning (pure torch, no model, no Ray).

References:
    EWC          Kirkpatrick et al. 2017, "Overcoming catastrophic forgetting".
    Online EWC   Schwarz et al. 2018, "Progress & Compress".

The Fisher itself is estimated by the learner (`Learner.consolidate`: the empirical Fisher of
the completions' log-likelihood, a mean over sequences).
"""

from __future__ import annotations

import torch
from torch import Tensor


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
