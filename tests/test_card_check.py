"""tools/card_check/__main__.py, the gpu-8gb preset's step on a bare GPU box: its code path on the
CPU.

The check runs on a GPU box; here the same code runs with the tiny shape on the CPU, where each
process's peak resident set stands in for the card's memory (the GPU boundary: nothing is
mocked). Also TRL's side (tools/card_check/trl_side.py) and the two-process harness
(tools/card_check/two_process.py) it can run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tools.card_check.trl_side import forced_prompts, micro_batch, trl_config

TINY = ["--cpu", "--prompt-tokens", "160", "--new-tokens", "16", "--group", "4"]


def card_check(tmp_path, *args, timeout=900) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "card.json"
    proc = subprocess.run([sys.executable, "-m", "tools.card_check", *TINY, *args,
                           "--out", str(out)], capture_output=True, text=True, timeout=timeout)
    return proc, json.loads(out.read_text())


@pytest.mark.slow
def test_the_card_check_runs_its_code_on_the_cpu(tmp_path):
    """Ours (one-copy: 2 steps, each phase against the plan) and TRL on the same model,
    prompts, G, lengths and LoRA, written to one JSON file; neither side imports Ray or vLLM
    (the NF4 kernels' comparison has a test of its own: test_gpu_card.py)."""
    proc, res = card_check(tmp_path, "--steps", "2", "--skip-nf4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours, trl, plan = res["ours"], res["trl"], res["plan"]
    assert "error" not in ours and len(ours["steps"]) == 2
    assert ours["load"]["imported"] == [] and ours["load"]["pid"] != os.getpid()
    for i, step in enumerate(ours["steps"]):
        assert step["step"] == i and step["version"] == i + 1 and step["gen_s"] > 0
        assert step["completions"] == 2 * 4 and 0 < step["completion_tokens"] <= 8 * 16
        assert step["prompt_tokens"] == [160, 160]  # exactly the asked prompt length
        assert 0 <= step["logp_diff"] < 1e-3  # one copy, staleness 0: one policy
        for phase in ("rollout", "learn"):
            mem = step["memory"][phase]
            assert mem["peak_gb"] > 0 and mem["above_start_gb"] >= 0 and "rss_gb" in mem
    assert ours["s_per_step"] == pytest.approx(ours["gen_s"] + ours["learn_s"], rel=0.5)
    assert set(plan["phases_gb"]) == {"start", "rollout", "learn"} and plan["peak_gb"] > 0
    assert set(plan["above_start_gb"]) == {"rollout", "learn"}
    # TRL: 2 steps of G x prompts completions of exactly 16 new tokens from 160-token prompts
    assert "error" not in trl, trl
    assert trl["completion_lengths"] == [[16] * 8] * 2 and trl["prompt_lengths"] == [160] * 4
    assert trl["lora_changed"] and trl["loaded_4bit"] == (res["lora_mode"] == "qlora")
    assert trl["imported"] == [] and trl["s_per_step"] > 0 and trl["peak_gb"] > 0
    assert res["nf4"] == {"skipped": "--skip-nf4"}
    assert {"device", "commit", "versions", "settings", "cap_gb", "elapsed_s"} <= set(res)
    assert "ours: step 1" in proc.stdout and "TRL:" in proc.stdout


def _two_steps_then_hang(conn, spec):
    """A stand-in for ours' process: it measures two steps, then takes forever."""
    import time

    for step in range(2):
        conn.send({"event": "step", "step": step, "pid": os.getpid()})
    time.sleep(600)


def test_a_time_limit_keeps_every_message_sent_before_it_and_ends_the_process():
    """The check hands each result over as it is measured (its JSON is rewritten at once), so
    cutting a slow run off loses nothing measured, says why, and leaves nothing running."""
    import time

    from tools.card_check.ours import spawn_ours

    got = []
    t0 = time.monotonic()
    spawn_ours({}, 10.0, got.append, target=_two_steps_then_hang)
    assert time.monotonic() - t0 < 40
    assert [m["event"] for m in got] == ["step", "step", "error"]
    assert "time limit" in got[-1]["error"]
    pid = got[0]["pid"]
    assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read()


@pytest.mark.slow
def test_the_two_process_layout_takes_turns_on_one_device_simulated_on_cpu(tmp_path):
    """--layout two-process: a learner and an HF engine process, as the time-sliced option
    runs them. On a CPU the engine's move of its weights off the device is simulated (its
    tensors emptied, a copy kept aside) and each process's resident memory stands in for the
    card."""
    proc, res = card_check(tmp_path, "--layout", "two-process", "--steps", "2", "--skip-trl",
                           "--skip-nf4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = res["ours"]
    pids = ours["pids"]
    assert len({pids["learner"], pids["engine"], pids["driver"], os.getpid()}) == 4
    assert ours["imported"] == []  # neither child imported Ray or vLLM
    for w in ours["engine_weights_bytes"]:  # off the device while the learner steps, and back
        assert w["awake"] > 0 and w["asleep"] == 0 and w["woken"] == w["awake"]
    for phase, procs in ours["phases"].items():  # summed from each process's measured peak
        assert procs["learner"]["peak_gb"] > 0 and procs["engine"]["peak_gb"] > 0
        assert ours["phase_sum_gb"][phase] == pytest.approx(
            procs["learner"]["peak_gb"] + procs["engine"]["peak_gb"])
    assert len(ours["step_s"]) == 2 and ours["s_per_step"] > 0
    assert "summed per phase" in proc.stdout


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

    from tools.card_check.meters import lora_change, lora_snapshot

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
