"""The fp32 LM head of a 16-bit body (common/lm_head.py): the fp32 product's logits and
hidden-state gradient, a slice of the vocabulary at a time, with no fp32 copy of the weight."""

import torch
import torch.nn.functional as F

from common import lm_head
from common.tiny_model import build_tiny_qwen2
from learner.model import head_fp32, head_logprobs


def test_use_fp32_head_widens_slices_and_keeps_no_fp32_copy(monkeypatch):
    """A 16-bit engine's LM head gives fp32 logits equal to the fp32 product, with no fp32
    parameter (0.87 GiB for Qwen2-1.5B) and the head still tied to the embeddings."""
    monkeypatch.setattr(lm_head, "HEAD_ROWS", 7)  # several slices of the tiny vocabulary
    model = build_tiny_qwen2(seed=1)[0].to(torch.bfloat16).eval()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    bytes_before = sum(p.numel() * p.element_size() for p in model.parameters())
    lm_head.use_fp32_head(model)
    head = model.get_output_embeddings()
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert sum(p.numel() * p.element_size() for p in model.parameters()) == bytes_before
    assert (head.weight is model.get_input_embeddings().weight) == tied
    h = torch.randn(3, 5, head.weight.shape[1]).to(torch.bfloat16)              # (N, T, H)
    with torch.no_grad():
        logits = head(h)                                                         # (N, T, V)
    assert logits.dtype == torch.float32 and logits.shape[-1] == head.weight.shape[0]
    torch.testing.assert_close(logits, F.linear(h.float(), head.weight.float()),
                               rtol=1e-6, atol=1e-6)


class _Widenings(torch.overrides.TorchFunctionMode):
    """Records the shape of every 16-bit -> fp32 widening of a 2-D tensor."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (getattr(func, "__name__", "") == "float" and args[0].dim() == 2
                and args[0].dtype == torch.bfloat16):
            self.shapes.append(tuple(args[0].shape))
        return out


def test_the_learners_head_gradient_is_the_fp32_products_and_widens_only_slices(monkeypatch):
    """The learner's log-probs through a frozen bf16 head: values and the hidden states'
    gradient equal those of the whole fp32 product, while no widening holds more than
    HEAD_ROWS rows of the weight (forward and backward)."""
    monkeypatch.setattr(lm_head, "HEAD_ROWS", 16)
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(24, 50, bias=False).to(torch.bfloat16).requires_grad_(False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(50, 24, generator=g))
    targets = torch.randint(0, 50, (9,), generator=g)
    h = torch.randn(9, 24, generator=g).to(torch.bfloat16).requires_grad_(True)
    w = torch.linspace(-1, 1, 9)
    with _Widenings() as seen:
        logp, ent = head_logprobs(head, h, targets, temperature=0.7)
        (logp * w).sum().backward()
    assert seen.shapes and max(s[0] for s in seen.shapes) <= 16, seen.shapes
    h_ref = h.detach().float().requires_grad_(True)
    want = F.log_softmax(h_ref @ head.weight.float().T / 0.7, -1)[range(9), targets]
    (want * w).sum().backward()
    torch.testing.assert_close(logp, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.grad.float(), h_ref.grad, rtol=1e-2, atol=1e-2)  # bf16 grad
    assert head.weight.grad is None


def test_a_trainable_or_fp32_head_is_multiplied_whole_with_its_weight_gradient():
    head = torch.nn.Linear(8, 11)
    h = torch.randn(4, 8, requires_grad=True)
    out = head_fp32(head, h)
    out.sum().backward()
    torch.testing.assert_close(out, head(h))
    assert head.weight.grad is not None and head.weight.grad.shape == (11, 8)
