"""The GPU memory planner against the gpu-8gb seed's published budget (within 15%)."""

import pytest

from launch import plan
from launch.presets import get_preset

SHAPES = plan.KNOWN["deepseek-ai/deepseek-r1-distill-qwen-1.5b"]


def close(x, ref, rel=0.15):
    return abs(x - ref) <= rel * ref


def test_builtin_shapes_give_the_known_parameter_count():
    recomputed = plan.Shapes(**{k: getattr(SHAPES, k) for k in
                                ("layers", "hidden", "intermediate", "heads", "kv_heads",
                                 "head_dim", "vocab", "tied")})
    # the q/k/v biases (0.06%) are the only parameters the shape formula leaves out
    assert close(recomputed.params, 1.78e9, rel=0.002)


def test_gpu_8gb_matches_the_published_budget():
    cfg = get_preset("gpu-8gb")
    pub = plan.PUBLISHED["gpu-8gb"]
    assert cfg.rollout.group_size == pub["group_size"]
    assert close(SHAPES.params * plan.NF4_BYTES / plan.GiB, pub["model_nf4_gb"])
    text, fits, peak = plan.report(cfg, 8.0, SHAPES)
    assert fits and close(peak, pub["peak_gb"]), text
    assert "fits" in text and "published" in text


def test_budget_grows_with_group_size_and_without_checkpointing():
    cfg = get_preset("gpu-8gb")
    _, _, peak8 = plan.report(cfg, 8.0, SHAPES)
    cfg.rollout.group_size = 16
    _, _, peak16 = plan.report(cfg, 8.0, SHAPES)
    assert peak16 > peak8  # the KV cache doubles
    cfg.rollout.group_size = 8
    cfg.model.gradient_checkpointing = False
    text, fits, peak = plan.report(cfg, 8.0, SHAPES)
    assert not fits and peak > 8.0 and "DOES NOT FIT" in text


def test_cli_exit_status_and_unknown_preset(capsys, monkeypatch):
    monkeypatch.setattr(plan, "model_shapes", lambda name: SHAPES)
    assert plan.main(["--preset", "gpu-8gb", "--gpu-gb", "8"]) == 0
    assert "peak" in capsys.readouterr().out
    assert plan.main(["--preset", "gpu-8gb", "--gpu-gb", "4"]) == 1
    assert plan.main(["--preset", "nope"]) == 2
    assert "--preset" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"])
def test_model_shapes_fall_back_to_builtin_values_offline(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    s = plan.model_shapes(name)
    assert (s.layers, s.kv_heads, s.head_dim, s.hidden, s.vocab) == (28, 2, 128, 1536, 151936)
