"""The LM head in fp32 on a 16-bit body, for the learner and the rollout engines alike.

bf16 logits carry ~3 significant digits, enough to move a log-prob by 1e-2, so every role
computes its logits in fp32 (docs/algorithm.md, "The on-policy invariant"). A resident fp32
copy of a 16-bit head's weight would cost V x H x 4 bytes (0.87 GiB for Qwen2-1.5B's 151,936 x
1,536), more than an 8 GB card can spare: `fp32_logits` widens the weight `HEAD_ROWS`
vocabulary rows at a time instead (widening is exact, so the logits are those of the full fp32
product). Its backward, for the learner, gives the hidden states' gradient the same way, slice
by slice, and never the frozen weight's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

HEAD_ROWS = 16384
"""vocabulary rows of a 16-bit LM head widened to fp32 at a time"""


def _sliced(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
            ) -> torch.Tensor:
    """hidden (..., H) fp32 @ weight (V, H).T + bias, `HEAD_ROWS` rows of the weight at a
    time: (..., V) fp32."""
    return torch.cat([F.linear(hidden, weight[i:i + HEAD_ROWS].float(),
                               None if bias is None else bias[i:i + HEAD_ROWS].float())
                      for i in range(0, weight.shape[0], HEAD_ROWS)], dim=-1)


class _FrozenHead(torch.autograd.Function):
    """Logits of a frozen 16-bit head in fp32 with a gradient for the hidden states only."""

    @staticmethod
    def forward(ctx, hidden, weight, bias):
        ctx.save_for_backward(weight)  # the 16-bit weight itself: no copy is kept
        return _sliced(hidden, weight, bias)

    @staticmethod
    def backward(ctx, grad):                                          # (..., V) fp32
        (weight,) = ctx.saved_tensors
        out = None
        for i in range(0, weight.shape[0], HEAD_ROWS):
            part = grad[..., i:i + HEAD_ROWS] @ weight[i:i + HEAD_ROWS].float()  # (..., H)
            out = part if out is None else out.add_(part)
        return out, None, None


def fp32_logits(hidden: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """(..., H) -> (..., V) logits in fp32 whatever the dtypes of `hidden` and `weight`.

    An fp32 weight (or one being trained) is multiplied whole, as `F.linear` does; a frozen
    16-bit weight is widened a slice at a time, in the forward and the backward pass."""
    hidden = hidden.float()
    if weight.dtype == torch.float32 or weight.requires_grad:
        return F.linear(hidden, weight.float(), None if bias is None else bias.float())
    return _FrozenHead.apply(hidden, weight, bias)


def use_fp32_head(model) -> None:
    """Make `model`'s output embedding compute fp32 logits (`fp32_logits`); a no-op for an fp32
    head. The head stays the same module, tied where the model ties it."""
    head = model.get_output_embeddings()
    if head.weight.dtype == torch.float32:
        return

    def forward(x):                                                  # (..., H) -> (..., V)
        return fp32_logits(x, head.weight, head.bias)  # looked up per call: a sleep swaps .data

    head.forward = forward
