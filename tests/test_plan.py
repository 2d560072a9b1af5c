"""The GPU memory planner against the gpu-8gb seed's published budget (within 15%)."""

import pytest

from common.shapes import KNOWN, Shapes
from launch import plan
from launch.presets import get_preset

SHAPES = KNOWN["deepseek-ai/deepseek-r1-distill-qwen-1.5b"]


def close(x, ref, rel=0.15):
    return abs(x - ref) <= rel * ref


def test_shape_formula_counts_a_real_model_of_that_shape():
    """The planner's parameter count against transformers' own Qwen2 of the same config, built
    on the meta device (no memory, no download)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    s = SHAPES
    config = Qwen2Config(hidden_size=s.hidden, intermediate_size=s.intermediate,
                         num_hidden_layers=s.layers, num_attention_heads=s.heads,
                         num_key_value_heads=s.kv_heads, vocab_size=s.vocab,
                         tie_word_embeddings=s.tied)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    real = sum(p.numel() for p in model.parameters())
    assert SHAPES.params == real  # the built-in count (it includes the biases)
    formula = Shapes(**{k: getattr(s, k) for k in ("layers", "hidden", "intermediate",
                                                         "heads", "kv_heads", "head_dim",
                                                         "vocab", "tied")}).params
    biases = s.layers * (s.heads + 2 * s.kv_heads) * s.head_dim  # q/k/v: left out by the formula
    assert formula + biases == real
    params = dict(model.named_parameters())
    for name, (fan_in, fan_out) in s.linear_sizes().items():
        block = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
        assert tuple(params[f"model.layers.0.{block}.{name}.weight"].shape) == (fan_out, fan_in)


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
    assert not fits and peak > 8.0 and "does not fit" in text


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


def test_a_cpu_preset_gets_its_ram_plan_and_a_gpu_preset_both_plans(capsys):
    """launch.plan shows the plan that binds the preset: a CPU preset's RAM (no CUDA rows),
    a GPU preset's card phases and then its host side."""
    from launch.plan import main

    assert main(["--preset", "cpu-14core", "--cores", "14", "--ram-gb", "16"]) == 0
    out = capsys.readouterr().out
    assert "runs on the CPU" in out and "rollout-5" in out and "of 16: fits" in out
    assert "CUDA" not in out and "card" not in out.split("no card is used", 1)[1]
    assert main(["--preset", "cpu-14core", "--cores", "14", "--ram-gb", "3"]) == 1  # RAM decides
    assert "does not fit: cpu-14core on 14 cores" in capsys.readouterr().out
    capsys.readouterr()
    assert main(["--preset", "gpu-8gb", "--gpu-memory-gb", "8", "--ram-gb", "16"]) == 0
    out = capsys.readouterr().out
    host, card = out.split("the card:", 1)
    assert "rollout (learner idle, engine awake)" in card and "of 8: fits" in card
    assert "engine weights in host memory while asleep" in host and "of 16: fits" in host


def test_the_hf_engine_plans_a_prefill_of_every_prompt_of_a_call():
    """The HF engine (the GPU harness's) prefills all G x prompts sequences at once: its plan
    holds one layer's working set for them, growing with the prompt length (vLLM's does not:
    it chunks the prefill)."""
    def prefill(engine, prompt_tokens):
        cfg = get_preset("gpu-8gb")
        cfg.rollout.engine, cfg.rollout.max_prompt_tokens = engine, prompt_tokens
        return [v for p, name, v in plan.budget(cfg, SHAPES) if name.startswith("prefill")]

    assert prefill("vllm", 512) == []
    one, two = prefill("hf", 256), prefill("hf", 512)
    assert len(one) == 1 and two[0] == pytest.approx(2 * one[0])
    g = get_preset("gpu-8gb").rollout
    assert two[0] > g.group_size * g.prompts_per_step * 512 * 3 * SHAPES.intermediate * 2
