"""tools.compare.one_update: one GRPO update of ours and one of TRL's GRPOTrainer on the same
hand-built batch, from the same LoRA initialisation, move the policy identically (a tiny random
Llama; `python -m tools.compare.one_update` runs it on the cpu-demo model)."""

import numpy as np
import pytest

pytest.importorskip("trl")


def tiny_batch(tok, rng):
    prompts = [tok("What is 2 + 3?", add_special_tokens=False).input_ids,
               tok("Ann has 4 pens.", add_special_tokens=False).input_ids]
    lengths = [7, 3, 12, 5, 9, 1, 6, 10]  # ragged: both pad, and the normaliser counts tokens
    comps = [rng.integers(3, tok.vocab_size, n).tolist() for n in lengths]
    adv = np.array([1.5, -0.5, -0.5, -0.5, 0.8, -0.8, 0.8, -0.8], np.float32)
    return [prompts[i // 4] for i in range(8)], comps, adv


def compare(tmp_path, **grpo):
    from common.models import load_tokenizer, resolve_model
    from common.presets import get_preset
    from tools.compare.one_update import Batch, compare

    cfg = get_preset("tiny")
    cfg.grpo.entropy_rho = 1.0  # every token, as TRL's default
    for k, v in grpo.items():
        setattr(cfg.grpo, k, v)
    path = resolve_model(cfg.model.name)
    tok = load_tokenizer(path)
    prompts, comps, adv = tiny_batch(tok, np.random.default_rng(0))
    return compare(cfg, path, tok, Batch(prompts, comps, adv), str(tmp_path))


def test_our_update_is_trls_on_the_same_batch(tmp_path):
    c = compare(tmp_path)
    assert c.loss_ours == pytest.approx(c.loss_trl, rel=1e-4)
    assert c.grad_norm_ours == pytest.approx(c.grad_norm_trl, rel=1e-4)
    assert c.grad_cos > 0.9999
    assert c.step_norm_ours == pytest.approx(c.step_norm_trl, rel=1e-3)
    assert c.step_cos > 0.999


def test_a_different_normaliser_shows_as_a_different_gradient(tmp_path):
    """The comparison can tell: each sequence weighing the same (seq_mean) instead of each
    token (TRL's DAPO) turns the gradient."""
    c = compare(tmp_path, loss_agg="seq_mean")
    assert c.grad_cos < 0.999
