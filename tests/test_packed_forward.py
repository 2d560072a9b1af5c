"""The learner's packed shared-prefix forward: each prompt and its completions in one row.

Pure packing and mask on hand-built ids, then the packed forward against the plain one
(log-probs, entropies and gradients) on tiny random Llama and Qwen2 models, with the sdpa and
the eager attention.
"""

import numpy as np
import pytest
import torch

from common.presets import get_preset
from common.tiny_model import save_tiny_qwen2
from common.types import TrainBatch
from learner.learner import Learner
from learner.model import pack_by_prompt, packed_mask, selected_logprobs, shared_prefix_logprobs


def test_pack_by_prompt_puts_a_prompts_completions_in_one_row_positions_restarting():
    prompts = [[1, 2, 3], [4, 5], [1, 2, 3]]
    comps = [[7, 8], [6, 6, 6], [9]]
    pk = pack_by_prompt(prompts, comps)
    assert pk.ids.tolist() == [[1, 2, 3, 7, 8, 9], [4, 5, 6, 6, 6, 0]]
    assert pk.positions.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 3, 4, 0]]
    assert pk.segment.tolist() == [[0, 0, 0, 1, 1, 2], [0, 0, 1, 1, 1, -1]]
    assert pk.row.tolist() == [0, 1, 0]
    assert pk.start.tolist() == [3, 2, 5]
    assert pk.prompt_end.tolist() == [2, 1, 2]


def test_packed_mask_lets_a_completion_see_its_prompt_and_itself_only():
    pk = pack_by_prompt([[1, 2, 3], [4, 5], [1, 2, 3]], [[7, 8], [6, 6, 6], [9]])
    mask = packed_mask(pk.segment)                                               # (2, 1, 6, 6)
    assert mask.shape == (2, 1, 6, 6)

    def sees(u, q):
        return mask[u, 0, q].nonzero().flatten().tolist()

    assert sees(0, 1) == [0, 1]                  # the prompt: causal
    assert sees(0, 4) == [0, 1, 2, 3, 4]         # completion 1: prompt + itself
    assert sees(0, 5) == [0, 1, 2, 5]            # completion 2: not completion 1
    assert sees(1, 4) == [0, 1, 2, 3, 4]
    assert sees(1, 5) == [0, 1, 5]               # padding: the prompt and itself, never empty


def _learner(arch, mode, tmp_path):
    cfg = get_preset("tiny")
    cfg.lora.mode = mode
    if arch == "qwen2":
        cfg.model.name = str(save_tiny_qwen2(tmp_path / "qwen2"))
    learner = Learner(cfg)
    rng = np.random.default_rng(0)
    comps = [list(rng.integers(3, 90, rng.integers(2, 9))) for _ in range(8)]
    learner.train_on(TrainBatch(   # one step off the init (LoRA B = 0 there)
        [list(rng.integers(3, 90, 5)) for _ in range(8)], comps,
        [np.full(len(c), -4.0, np.float32) for c in comps],
        [rng.random(len(c)).astype(np.float32) for c in comps],
        rng.normal(size=8).astype(np.float32)))
    return learner


@pytest.mark.parametrize("arch,mode,attn", [("llama", "lora", "sdpa"), ("llama", "full", "sdpa"),
                                            ("llama", "lora", "eager"),
                                            ("qwen2", "lora", "sdpa")])
def test_packed_forward_equals_the_plain_forward_values_and_gradients(arch, mode, attn,
                                                                      tmp_path):
    """Two prompts of different lengths x 3 completions of different lengths each: the packed
    forward gives the plain padded forward's log-probs, entropies and gradients."""
    learner = _learner(arch, mode, tmp_path)
    model, params = learner.model, list(learner.params.values())
    model.get_base_model().set_attn_implementation(attn) if mode != "full" else \
        model.set_attn_implementation(attn)
    assert model.config._attn_implementation == attn
    rng = np.random.default_rng(7)
    p0, p1 = list(rng.integers(3, 90, 4)), list(rng.integers(3, 90, 7))
    prompts = [p0, p1, p0, p1, p0, p1]           # interleaved: packing regroups them
    comps = [list(rng.integers(3, 90, n)) for n in (5, 2, 8, 3, 8, 6)]
    T = max(len(c) for c in comps)
    sel = torch.tensor([[j < len(c) and (i + j) % 3 != 1 for j in range(T)]
                        for i, c in enumerate(comps)])                          # (6, T)
    rows, cols = sel.nonzero(as_tuple=True)
    seqs = [p + c for p, c in zip(prompts, comps)]
    L = max(len(s) for s in seqs)
    ids = torch.tensor([s + [0] * (L - len(s)) for s in seqs])
    attn_mask = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs])
    plen = torch.tensor([len(p) for p in prompts])

    def run(fn):
        logp, ent = fn()
        grads = torch.autograd.grad((logp * torch.linspace(0.5, 1.5, len(logp))).sum(), params,
                                    allow_unused=True)
        return logp.detach(), ent, grads

    plain = run(lambda: selected_logprobs(model, ids, attn_mask, rows, plen[rows] + cols - 1,
                                          ids[rows, plen[rows] + cols]))
    packed = run(lambda: shared_prefix_logprobs(model, prompts, comps, rows, cols))
    torch.testing.assert_close(packed[0], plain[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1], plain[1], atol=1e-5, rtol=1e-5)
    assert any(g is not None and g.abs().sum() > 0 for g in plain[2])
    for a, b in zip(packed[2], plain[2]):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_a_sliding_window_model_runs_the_plain_forward_and_gets_its_log_probs():
    """A packed row is longer than each sequence, and a sliding-window layer would see the
    wrong keys under the packed mask: such a model takes the unpacked path, still exact."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from learner.model import supports_packing

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
        sliding_window=4, max_window_layers=0)).eval()
    assert "sliding_attention" in model.config.layer_types and not supports_packing(model)
    prompts, comps = [[5, 6, 7, 8, 9]] * 2, [[11, 12, 13, 14], [15, 16]]
    rows, cols = torch.tensor([0, 0, 0, 0, 1, 1]), torch.tensor([0, 1, 2, 3, 0, 1])
    with torch.no_grad():
        logp, _ = shared_prefix_logprobs(model, prompts, comps, rows, cols)
        ref = []
        for p, c in zip(prompts, comps):
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1: -1]
            ref.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0])
    torch.testing.assert_close(logp, torch.cat(ref), atol=1e-5, rtol=1e-5)
