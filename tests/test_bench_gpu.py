"""tools/bench_gpu.py, our GRPO step against TRL's on one GPU: its code path on the CPU.

The script runs on a GPU box; here the same code runs with a tiny shape on the CPU, where each
process's peak RSS stands in for the card's memory (the GPU boundary: nothing is mocked).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tools.bench_gpu import nf4_skip
from tools.bench_gpu_trl import forced_prompts, micro_batch, trl_config

TINY_RUN = ["--device", "cpu", "--shape", "tiny", "--prompt-tokens", "16", "--new-tokens", "8",
            "--group", "2", "--prompts", "1", "--steps", "3", "--warmup", "0"]


@pytest.mark.slow
def test_both_sides_run_the_same_forced_step_and_the_ratio_is_their_quotient(tmp_path):
    """Both pairs (--nf4 on runs the NF4 QLoRA pair on the CPU too): each side ran its 3 timed
    steps in processes of its own, both sampled the same completions and tokens per step (the
    forced G x prompts completions of exactly --new-tokens tokens, TRL's from prompts of exactly
    the forced length), each side's LoRA weights moved, and the printed ratio, last, is TRL's
    s/step over ours."""
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "tools.bench_gpu", *TINY_RUN, "--nf4", "on",
                           "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["pairs"]) == {"lora", "qlora"} and res["nf4_skipped"] is None
    assert res["harness"] == "two processes, no Ray"
    for name, pair in res["pairs"].items():
        ours, trl = pair["ours"], pair["trl"]
        assert "error" not in ours and "error" not in trl, (name, ours.get("error"),
                                                            trl.get("error"))
        for side in (ours, trl):
            assert len(side["step_s"]) >= 3 and side["timed_steps"] >= 3
            assert side["s_per_step"] > 0 and side["completions_per_s"] > 0
            assert all(gb > 0 for gb in side["peak_gb"].values()) and side["peak_total_gb"] > 0
            # G x prompts = 2 completions of exactly 8 new tokens in each of the 3 timed steps
            assert side["completions_per_step"] == [2, 2, 2]
            assert side["completion_tokens_per_step"] == [16, 16, 16]
            assert side["lora_changed"] is True and side["lora_max_abs_change"] > 0
            assert side["lora_sum_abs_change"] >= side["lora_max_abs_change"]
            assert side["lora_tensors"] > 0
        assert ours["completions_per_step"] == trl["completions_per_step"]
        assert ours["completion_tokens_per_step"] == trl["completion_tokens_per_step"]
        assert ours["lora_tensors"] == trl["lora_tensors"]  # A and B of the same modules
        assert pair["ratio_trl_over_ours"] == pytest.approx(trl["s_per_step"]
                                                            / ours["s_per_step"])
        # TRL: 3 steps x 2 completions of exactly 8 new tokens, from 16-token prompts
        assert trl["completion_lengths"] == [[8, 8]] * 3 and trl["forced_tokens"]
        assert trl["prompt_lengths"] == [16, 16, 16]
        assert trl["loaded_4bit"] == (name == "qlora") and trl["gradient_checkpointing"]
        assert trl["imported"] == [] and ours["harness"]["imported"] == []  # no Ray, no vLLM
        # ours: a learner and an engine process, neither the driver, this test or TRL's
        pids = ours["pids"]
        assert len({pids["learner"], pids["engine"], trl["pid"],
                    ours["harness"]["pids"]["driver"], os.getpid()}) == 5
        assert set(ours["peak_gb"]) == {"learner", "engine"}
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("ratio TRL/ours s/step")
    assert f"{res['pairs']['lora']['ratio_trl_over_ours']:.2f}" in last
    assert "two processes, no Ray" in proc.stdout and "peak RSS" in proc.stdout
    assert "WARNING" not in proc.stdout


@pytest.mark.slow
def test_a_side_whose_process_dies_reports_an_error_instead_of_waiting(tmp_path):
    """Out of memory at the cap kills a side's process on a card; here a model that does not
    exist does: each side answers {"error": ...} (printed as FAILED), neither hangs."""
    from tools.bench_gpu import TINY, parse_args, run_ours, run_trl_side, side_line

    args = parse_args(TINY_RUN)
    missing = str(tmp_path / "no-model")
    ours = run_ours(args, missing, TINY, "lora")
    trl = run_trl_side(args, missing, "lora", "fp32")
    assert "died" in ours["error"] and trl["error"] and "pid" in trl
    assert "FAILED" in side_line("trl", trl, "cpu")


def test_the_nf4_pair_is_skipped_without_cuda_or_when_asked():
    assert "no CUDA" in nf4_skip(SimpleNamespace(nf4="auto", device="cpu"))
    assert nf4_skip(SimpleNamespace(nf4="off", device="cuda")) == "--nf4 off"


def test_trl_gets_one_optimizer_step_per_generation_of_all_completions(tmp_path):
    """GRPOConfig from the installed TRL: a generation holds G x prompts completions, split
    into micro-batches that accumulate into one optimizer step; lengths forced."""
    spec = {"group": 8, "prompts": 2, "micro_batch": 0, "dtype": "fp32", "lr": 5e-5,
            "new_tokens": 512, "device": "cpu", "warmup": 1, "steps": 3, "seed": 0}
    cfg = trl_config(spec, str(tmp_path))
    assert cfg.generation_batch_size == 16 and cfg.per_device_train_batch_size == 8
    assert cfg.steps_per_generation == cfg.gradient_accumulation_steps == 2
    assert cfg.generation_kwargs == {"min_new_tokens": 512} and cfg.max_completion_length == 512
    assert cfg.num_generations == 8 and cfg.learning_rate == 5e-5 and cfg.max_steps == 4
    assert cfg.gradient_checkpointing and not cfg.use_vllm
    assert micro_batch(12, 8) == 6 and micro_batch(2, 8) == 2 and micro_batch(7, 8) == 7


def test_prompts_tokenize_to_exactly_the_forced_length():
    from common.config import ModelConfig
    from common.models import load_tokenizer

    tok = load_tokenizer(ModelConfig().name)
    prompts = forced_prompts(tok, 3, 512, seed=1)
    assert len(set(prompts)) == 3
    assert [len(ids) for ids in tok(text=prompts)["input_ids"]] == [512, 512, 512]


def test_lora_change_compares_only_trainable_lora_tensors_with_their_host_copy():
    import torch

    from tools.gpu_share import lora_change, lora_snapshot

    model = torch.nn.ModuleDict({"lora_A": torch.nn.Linear(2, 2), "base": torch.nn.Linear(2, 2)})
    model["base"].requires_grad_(False)
    before = lora_snapshot(model.named_parameters())
    assert sorted(before) == ["lora_A.bias", "lora_A.weight"]
    with torch.no_grad():
        model["base"].weight.add_(1.0)  # not a LoRA tensor: no change counted
    assert lora_change(before, model.named_parameters()) == {
        "lora_tensors": 2, "lora_max_abs_change": 0.0, "lora_sum_abs_change": 0.0,
        "lora_changed": False}
    with torch.no_grad():
        model["lora_A"].weight[0, 1] -= 0.5
    got = lora_change(before, model.named_parameters())
    assert got["lora_changed"] and got["lora_max_abs_change"] == pytest.approx(0.5)
    assert got["lora_sum_abs_change"] == pytest.approx(0.5)


def test_ours_is_not_started_where_the_card_plan_says_it_cannot_fit():
    """At 8 GiB the 1.5B shape in bf16 LoRA needs two 16-bit bases on the card (learner and
    engine): the plan refuses it with its figure, before any process starts (on an H200 capped
    at 8 GiB the engine died at its cap); NF4 QLoRA fits."""
    from tools.bench_gpu import SHAPES, ours_config, plan_refusal

    args = SimpleNamespace(gpu_memory_gb=8, device="cuda", seed=0, group=8, prompts=2,
                           prompt_tokens=512, new_tokens=512)
    shapes = SHAPES["deepseek-ai/deepseek-r1-distill-qwen-1.5b"]
    refused = plan_refusal(ours_config(args, "unused", "lora"), shapes, 8)
    assert refused and "does not fit the 8 GiB cap" in refused and "rollout phase" in refused
    assert plan_refusal(ours_config(args, "unused", "qlora"), shapes, 8) is None
    assert plan_refusal(ours_config(args, "unused", "lora"), shapes, 12) is None
