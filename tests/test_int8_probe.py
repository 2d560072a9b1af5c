"""tools.int8_probe: the KL it reports on hand-built logits, and its int8 copies of a tiny random
Llama (the embedded model's figures are in README, from the command)."""

import math

import pytest
import torch

from tools.int8_probe import ARMS, dynamic_arms, dynamic_int8, token_kl, weight_only


def test_token_kl_by_hand():
    ref = torch.tensor([[0.0, 0.0], [0.0, 0.0]])                  # p = (1/2, 1/2) twice
    other = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])       # q = (3/4, 1/4), then p
    # KL(p || q) = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3) at the first position, 0 at the second
    assert token_kl(ref, other) == pytest.approx(0.5 * 0.5 * math.log(4 / 3))
    assert token_kl(ref, ref) == pytest.approx(0.0, abs=1e-7)
    assert token_kl(other, ref) != pytest.approx(token_kl(ref, other))  # KL is not symmetric


@pytest.fixture(scope="module")
def hf_tiny():
    from common.models import resolve_model
    from tools.decode_profile import HFEngine

    return HFEngine(resolve_model("tiny-random-llama"), threads=1)


def test_each_arm_quantises_its_layers_in_a_copy(hf_tiny):
    model = hf_tiny.model
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    for name, keep in ARMS.items():
        copy, layers = dynamic_int8(model, keep)
        assert layers == sum(map(keep, linears)) > 0, name
        mods = dict(copy.named_modules())
        for n in linears:  # a quantised layer is no longer a float nn.Linear
            assert isinstance(mods[n], torch.nn.Linear) != keep(n), (name, n)
    # the fp32 policy the learner scores is untouched
    assert all(isinstance(m, torch.nn.Linear) for n, m in model.named_modules() if n in linears)


def test_the_arms_report_speed_and_a_positive_kl(hf_tiny):
    rows = dynamic_arms(hf_tiny, batch=8, new_tokens=3, repeats=1,
                        arms={"attention only": ARMS["attention only"]})
    assert [r["arm"] for r in rows] == ["fp32", "attention only"]
    assert rows[0]["kl"] == 0.0 and rows[1]["kl"] > 0.0 and rows[1]["quantise_s"] > 0.0
    # a number, not its sign: on a tiny model a step is ~1 ms and (t_N - t_1) is timing noise
    # on a busy machine (CI saw -0.x ms beside a training run)
    assert all(math.isfinite(r["step_ms"]) for r in rows)
    assert isinstance(hf_tiny.model.model.layers[0].self_attn.q_proj, torch.nn.Linear)  # restored


def test_weight_only_covers_every_linear_shape(hf_tiny):
    rows = weight_only(hf_tiny.model, batch=4)
    shapes = {tuple(m.weight.shape) for m in hf_tiny.model.modules()
              if isinstance(m, torch.nn.Linear)}
    assert {tuple(r["shape"]) for r in rows} == shapes
    assert sorted({r["rows"] for r in rows}) == [1, 4]
    assert all(r["fp32_us"] > 0 and r["w8_bf16_us"] > 0 for r in rows)
