"""The GPU memory planner (launch/plan/card.py): the one-copy preset on one card, its rows against
hand-computed sizes, its refusals, and the CLI."""

import pytest

import launch.plan.__main__ as plan_cli
from common.presets import get_preset
from common.shapes import KNOWN, Shapes
from launch.plan import card as plan

SHAPES = KNOWN["deepseek-ai/deepseek-r1-distill-qwen-1.5b"]
QWEN = KNOWN["qwen/qwen2.5-1.5b-instruct"]  # the gpu-8gb preset's model
GiB = 2**30


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


def test_the_one_copy_preset_plans_one_base_copy_and_peaks_under_5_gib():
    cfg = get_preset("gpu-8gb")
    assert cfg.rollout.engine == "learner" and cfg.model.name == "Qwen/Qwen2.5-1.5B-Instruct"
    rows = plan.budget(cfg, QWEN)
    weights = [name for _, name, _ in rows if "weights" in name]
    assert weights == ["base weights (NF4 linears, bf16 embeddings)"]  # one copy
    assert not [p for p, _, _ in rows if p.startswith("engine")]  # no engine process
    assert sum(name == "CUDA context" for _, name, _ in rows) == 1  # one process
    text, fits, peak = plan.report(cfg, 8.0, QWEN)
    assert fits and peak <= 5.0, text
    assert plan.report(cfg, 6.0, QWEN)[1]  # a 6 GB card
    assert plan.caps(rows, 8.0) == {"learner": 8 * GiB}
    phase = plan.by_process(rows)
    assert set(phase["rollout"]) == {"learner"}
    assert phase["learn"]["learner"] > phase["start"]["learner"] < phase["rollout"]["learner"]


def test_one_copy_rows_against_hand_computed_sizes():
    cfg = get_preset("gpu-8gb")  # G=8 x 2 prompts, 512 + 512 tokens, micro-batch 4, r=16
    parts = {name: (p, v) for p, name, v in plan.budget(cfg, QWEN)}
    kv = 16 * 1024 * 2 * 28 * 2 * 128 * 2  # seqs x tokens x (k, v) x layers x kv heads x dim x bf16
    assert parts["KV cache (16 seqs x 1024 tokens)"] == (plan.GEN, kv)
    per_layer = 16 * ((1536 + 1536) + 2 * (1536 + 256) + (1536 + 1536)
                      + 2 * (1536 + 8960) + (8960 + 1536))  # r x (in + out), all 7 linears
    assert parts["LoRA r=16: 18.5M params + grads + AdamW (fp32)"][1] == 28 * per_layer * 16
    nf4 = QWEN.linear_params() * plan.NF4_BYTES + (QWEN.params - QWEN.linear_params()) * 2
    assert parts["base weights (NF4 linears, bf16 embeddings)"][1] == nf4  # tied: one matrix
    assert parts["LM head in fp32, one slice (16384 x 1536)"] == (plan.STEP, 16384 * 1536 * 4)
    rows = plan.LOGITS_CHUNK_BYTES // (4 * 151936)  # 110 of the 410 selected tokens at a time
    key = next(k for k in parts if k.startswith("LM-head logits"))
    assert parts[key] == (plan.STEP, rows * 151936 * 16.0) and f"{rows} of the 410" in key
    # the learner's micro-batch: one prompt and 4 of its completions packed in one row
    acts = next(v for k, (p, v) in parts.items() if k.startswith("activations"))
    assert acts > 28 * (512 + 4 * 512) * 1536 * 2  # one hidden state per layer, and more


def test_the_code_keeps_the_head_slices_and_logit_chunks_the_plan_counts():
    """The driver's plan cannot import torch: its copies of the two constants must agree."""
    from common import lm_head
    from learner import model

    assert plan.HEAD_SLICE_ROWS == lm_head.HEAD_ROWS
    assert plan.LOGITS_CHUNK_BYTES == model.LOGITS_CHUNK_BYTES


def test_every_row_says_where_its_figure_comes_from():
    text, _, _ = plan.report(get_preset("gpu-8gb"), 8.0, QWEN)
    table = [ln for ln in text.splitlines() if ln.strip().endswith(("estimate", "shape"))]
    assert len(table) == len(plan.budget(get_preset("gpu-8gb"), QWEN))
    assert plan.source("CUDA context") == "estimate" and plan.source("KV cache (1)") == "shape"
    assert "none measured on a card yet" in text


def test_a_cap_under_the_peak_is_refused_in_one_line_naming_the_largest_phase(capsys,
                                                                              monkeypatch):
    monkeypatch.setattr(plan, "model_shapes", lambda name: QWEN)
    cfg = get_preset("gpu-8gb")
    peak = max(plan.phases(plan.budget(cfg, QWEN)).values()) / GiB
    assert plan_cli.main(["--preset", "gpu-8gb", "--gpu-memory-gb", "8", "--ram-gb", "16"]) == 0
    assert plan_cli.main(["--preset", "gpu-8gb", "--gpu-memory-gb", "6", "--ram-gb", "16"]) == 0
    capsys.readouterr()
    under = round(peak - 0.5, 1)
    assert plan_cli.main(["--preset", "gpu-8gb", "--gpu-memory-gb", str(under),
                      "--ram-gb", "16"]) == 1
    line = capsys.readouterr().out.strip().splitlines()[-1]
    worst = max(plan.phases(plan.budget(cfg, QWEN)).items(), key=lambda kv: kv[1])[0]
    assert line.strip().startswith(f"does not fit {under:g} GiB: the {worst} phase needs")
    with pytest.raises(plan.ConfigError) as err:
        plan.check(cfg, under)
    assert "\n" not in str(err.value) and "python -m launch.plan" in str(err.value)


def test_budget_grows_with_group_size_and_without_checkpointing():
    cfg = get_preset("gpu-8gb")
    _, _, peak8 = plan.report(cfg, 8.0, QWEN)
    cfg.rollout.group_size = 16
    _, _, peak16 = plan.report(cfg, 8.0, QWEN)
    assert peak16 > peak8  # the KV cache and the prefill double
    cfg.rollout.group_size = 8
    cfg.model.gradient_checkpointing = False
    _, _, peak = plan.report(cfg, 8.0, QWEN)
    assert peak > peak8 + 1  # every layer's activations
    line = plan.refusal(cfg, peak - 0.5, QWEN)
    assert "would fit with --model.gradient_checkpointing true" in line, line


def test_the_time_sliced_layout_suggests_one_copy_when_it_does_not_fit():
    cfg = get_preset("gpu-8gb")
    cfg.rollout.engine = "vllm"
    _, fits, peak = plan.report(cfg, 6.0, SHAPES)
    assert not fits and peak > 6.0
    assert "would fit with --rollout.engine learner" in plan.refusal(cfg, 6.0, SHAPES)


def test_cli_exit_status_and_unknown_preset(capsys, monkeypatch):
    monkeypatch.setattr(plan, "model_shapes", lambda name: QWEN)
    assert plan_cli.main(["--preset", "gpu-8gb", "--gpu-gb", "8", "--ram-gb", "16"]) == 0
    assert "peak" in capsys.readouterr().out
    assert plan_cli.main(["--preset", "gpu-8gb", "--gpu-gb", "2", "--ram-gb", "16"]) == 1
    assert plan_cli.main(["--preset", "nope"]) == 2
    assert "--preset" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
                                  "Qwen/Qwen2.5-1.5B-Instruct"])
def test_model_shapes_fall_back_to_builtin_values_offline(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    s = plan.model_shapes(name)
    assert (s.layers, s.kv_heads, s.head_dim, s.hidden, s.vocab) == (28, 2, 128, 1536, 151936)


def test_a_cpu_preset_gets_its_ram_plan_and_a_gpu_preset_both_plans(capsys):
    """launch.plan shows the plan that binds the preset: a CPU preset's RAM (no CUDA rows),
    a GPU preset's card phases and then its host side."""
    from launch.plan.__main__ import main

    assert main(["--preset", "cpu-14core", "--cores", "14", "--ram-gb", "16"]) == 0
    out = capsys.readouterr().out
    assert "runs on the CPU" in out and "rollout-5" in out and "of 16.0 GiB: fits" in out
    assert "CUDA" not in out and "card" not in out.split("no card is used", 1)[1]
    assert main(["--preset", "cpu-14core", "--cores", "14", "--ram-gb", "3"]) == 1  # RAM decides
    assert "does not fit: cpu-14core on 14 cores" in capsys.readouterr().out
    capsys.readouterr()
    assert main(["--preset", "gpu-8gb", "--gpu-memory-gb", "8", "--ram-gb", "16"]) == 0
    out = capsys.readouterr().out
    host, card = out.split("the card:", 1)
    assert "rollout (generating)" in card and "of 8 GiB: fits" in card
    assert "rollout-0" not in host and "of 16.0 GiB: fits" in host  # no engine process


def test_the_hf_engine_plans_a_prefill_of_every_prompt_of_a_call():
    """transformers' generate (the HF engine, one-copy mode) prefills all G x prompts
    sequences at once: its plan holds one layer's working set for them, growing with the
    prompt length (vLLM's does not: it chunks the prefill)."""
    def prefill(engine, prompt_tokens):
        cfg = get_preset("gpu-8gb")
        cfg.rollout.engine, cfg.rollout.max_prompt_tokens = engine, prompt_tokens
        return [v for p, name, v in plan.budget(cfg, SHAPES) if name.startswith("prefill")]

    assert prefill("vllm", 512) == []
    for engine in ("hf", "learner"):
        one, two = prefill(engine, 256), prefill(engine, 512)
        assert len(one) == 1 and two[0] == pytest.approx(2 * one[0])
        g = get_preset("gpu-8gb").rollout
        assert two[0] > g.group_size * g.prompts_per_step * 512 * 3 * SHAPES.intermediate * 2


def test_under_wsl2_the_host_plan_says_how_to_give_linux_more_ram_mocked_wsl(capsys,
                                                                          monkeypatch):
    """WSL2 gives Linux half of the PC's RAM by default: the host plan and a RAM refusal say
    how to change that (the kernel's osrelease is mocked: this machine is no WSL2)."""
    from launch.plan import ram
    from launch.plan.ram import refusal

    monkeypatch.setattr(plan, "model_shapes", lambda name: QWEN)
    for module in (plan_cli, ram):
        monkeypatch.setattr(module, "wsl", lambda: True)
    assert plan_cli.main(["--preset", "gpu-8gb", "--ram-gb", "16"]) == 0
    assert ".wslconfig" in capsys.readouterr().out.split("the card:")[0]
    line = refusal(get_preset("gpu-8gb"), 0.5, QWEN, gpu=True)
    assert "\n" not in line and "memory=NGB" in line and "wsl --shutdown" in line
    monkeypatch.setattr(ram, "wsl", lambda: False)
    assert ".wslconfig" not in refusal(get_preset("gpu-8gb"), 0.5, QWEN, gpu=True)
