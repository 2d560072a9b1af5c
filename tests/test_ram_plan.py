"""The RAM plan of CPU runs: its arithmetic on hand-computed sizes, and the refusal path."""

import os
import subprocess
import sys

import pytest

from common.config import ConfigError
from common.presets import get_preset
from common.shapes import Shapes
from launch.plan.ram import (
    ACT_OVERHEAD,
    RUNTIME_PRIVATE,
    SHARED_LIBS,
    GiB,
    budget,
    check,
    per_process,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = Shapes(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=32,
             tied=True, dtype="float32")


def _cfg(workers=2, engine="hf", mode="lora"):
    cfg = get_preset("cpu-demo")
    cfg.model.dtype = "fp32"
    cfg.rollout.num_workers, cfg.rollout.engine, cfg.lora.mode = workers, engine, mode
    cfg.rollout.prompts_per_step, cfg.rollout.group_size = 2, 4
    cfg.rollout.max_new_tokens, cfg.grpo.micro_batch = 10, 3
    cfg.lora.r = 2
    return cfg


def test_toy_shapes_count_params_by_hand():
    # linears per layer: q 8x8, k 8x4, v 8x4, o 8x8, gate/up 8x16 each, down 16x8
    assert TOY.linear_params() == 2 * (64 + 32 + 32 + 64 + 128 + 128 + 128)
    assert TOY.params == 1152 + 32 * 8 + (2 * 2 + 1) * 8 == 1448


def test_plan_rows_match_hand_computed_bytes():
    cfg = _cfg(workers=2)
    rows = {(p, n.split(" (")[0]): v for p, n, v in budget(cfg, TOY)}
    # fp32 file and fp32 run: the learner and both workers map one copy, a third each
    assert rows[("learner", "base weights")] == pytest.approx(1448 * 4 / 3)
    assert rows[("rollout-1", "base weights")] == pytest.approx(1448 * 4 / 3)
    # LoRA r=2 on the 7 linears: r*(in+out) per layer, params + grads + 2 AdamW moments fp32
    lora = 2 * 2 * ((8 + 8) + (8 + 4) + (8 + 4) + (8 + 8) + (8 + 16) * 2 + (16 + 8))
    assert rows[("learner", "LoRA r=2: params + grads + AdamW, fp32")] == lora * 16
    # activations: 3 x 10 completion tokens + one 70-token arithmetic prompt, every layer,
    # ACT_OVERHEAD copies of (2h + 2 q + 2 kv + 3 i) fp32 values
    working = (2 * 8 + 2 * 8 + 2 * 4 + 3 * 16) * 4
    acts = rows[("learner", "step activations")]
    assert acts == pytest.approx((3 * 10 + 70) * 2 * ACT_OVERHEAD * working)
    # each worker: 4 of the step's 8 sequences, 70 + 10 tokens, K and V of 2 layers x 1 head x 4
    assert rows[("rollout-0", "KV cache")] == 4 * 80 * 2 * 2 * 1 * 4 * 4
    assert rows[("rollout-0", "merged LoRA linears")] == TOY.linear_params() * 4
    assert rows[("rollout-0", "decode logits")] == 4 * 32 * 8
    # the prefill's values of one layer: 4 sequences x the 70-token prompt (merged: no hook)
    assert rows[("rollout-0", "prefill, one layer")] == 4 * 70 * working
    # the libraries' code split among the learner and the two workers; the rest private
    runtime = RUNTIME_PRIVATE + SHARED_LIBS / 3
    assert rows[("learner", "runtime")] == rows[("rollout-1", "runtime")] == runtime
    procs = per_process(budget(cfg, TOY))
    assert set(procs) == {"driver", "learner", "rollout-0", "rollout-1"}
    assert sum(procs.values()) == pytest.approx(sum(rows.values()))


def test_a_file_stored_in_another_dtype_is_a_private_copy_in_every_process(monkeypatch):
    monkeypatch.setenv("HOMERL_SHARE_WEIGHTS", "0")  # no shared fp32 conversion
    bf16_file = Shapes(**{**TOY.__dict__, "dtype": "bfloat16"})
    rows = {(p, n): v for p, n, v in budget(_cfg(workers=2), bf16_file)}
    assert rows[("learner", "base weights")] == rows[("rollout-0", "base weights")] == 1448 * 4
    # the worker keeps W0 of the adapted linears as bf16 and merges in place (actors/weights.py)
    assert rows[("rollout-0", "bf16 W0 of the adapted linears")] == TOY.linear_params() * 2
    assert ("rollout-0", "merged LoRA linears") not in rows


def test_a_bf16_file_run_in_fp32_is_one_shared_conversion(monkeypatch):
    monkeypatch.delenv("HOMERL_SHARE_WEIGHTS", raising=False)
    bf16_file = Shapes(**{**TOY.__dict__, "dtype": "bfloat16"})
    rows = {(p, n.split(" (")[0]): v for p, n, v in budget(_cfg(workers=2), bf16_file)}
    # the learner and both workers map one fp32 copy: a third each
    assert rows[("learner", "base weights")] == pytest.approx(1448 * 4 / 3)
    assert rows[("rollout-1", "base weights")] == pytest.approx(1448 * 4 / 3)
    lora = 2 * 2 * ((8 + 8) + (8 + 4) + (8 + 4) + (8 + 8) + (8 + 16) * 2 + (16 + 8))
    assert rows[("rollout-0", "LoRA adapters, unmerged, fp32")] == lora * 4
    assert not any(n.endswith("adapted linears") or n.startswith("merged") for _, n in rows)
    # the unmerged adapter's hook: a delta and a sum beside the widest (intermediate) output
    working = (2 * 8 + 2 * 8 + 2 * 4 + 3 * 16) * 4
    assert rows[("rollout-0", "prefill, one layer")] == 4 * 70 * (working + 2 * 16 * 4)


def test_more_workers_share_the_libraries_code_among_more_processes():
    def runtime(workers):
        return dict(((p, n), v) for p, n, v in budget(_cfg(workers), TOY))[
            ("learner", "runtime")]

    assert runtime(6) == RUNTIME_PRIVATE + SHARED_LIBS / 7
    assert runtime(1) - runtime(6) == pytest.approx(SHARED_LIBS * (1 / 2 - 1 / 7))


def test_checkpointing_and_smaller_micro_batches_shrink_the_learner():
    def learner(cfg):
        return per_process(budget(cfg, TOY))["learner"]

    cfg = _cfg()
    plain = learner(cfg)
    cfg.model.gradient_checkpointing = True
    assert learner(cfg) < plain
    cfg = _cfg()
    cfg.grpo.micro_batch = 1
    assert learner(cfg) < plain


def test_a_vllm_worker_holds_its_own_weights_and_engine():
    rows = {(p, n): v for p, n, v in budget(_cfg(workers=1, engine="vllm"), TOY)}
    assert rows[("rollout-0", "vLLM weights (own copy)")] == 1448 * 4
    # W0 of the adapted linears: file pages the worker maps beside the learner, half each
    adapted = TOY.linear_params() * 4
    assert rows[("rollout-0", "W0 of the adapted linears (file pages)")] == adapted / 2
    # merged one tensor at a time as vLLM loads them (actors/lora_merge.py): one layer of two
    assert rows[("rollout-0", "merged adapted linears of one layer, fp32")] == adapted / 2
    assert rows[("learner", "base weights")] == 1448 * 4 - adapted / 2  # no HF worker maps it
    assert ("rollout-0", "merged LoRA linears") not in rows
    # a bf16 file: the fp32 learner holds a private copy, the worker maps the bf16 pages alone
    bf16_file = Shapes(**{**TOY.__dict__, "dtype": "bfloat16"})
    rows = {(p, n): v for p, n, v in budget(_cfg(workers=2, engine="vllm"), bf16_file)}
    assert rows[("learner", "base weights")] == 1448 * 4
    assert rows[("rollout-1", "W0 of the adapted linears (file pages)")] == adapted / 2 / 2


def test_check_refuses_in_one_line_naming_the_largest_consumer():
    cfg = _cfg(workers=2)
    total = sum(per_process(budget(cfg)).values()) / GiB
    check(cfg, total + 0.01)  # fits
    with pytest.raises(ConfigError) as err:
        check(cfg, total / 2)
    msg = str(err.value)
    assert "\n" not in msg and "GiB of RAM" in msg and "largest" in msg and "try" in msg


def test_train_refuses_a_config_planned_above_the_available_memory(tmp_path):
    # 1000 rollout workers of the embedded model: ~850 GiB planned, no machine here has it
    r = subprocess.run([sys.executable, "-m", "launch.train", "--preset", "cpu-demo",
                        "--rollout.num_workers", "1000", "--run-dir", str(tmp_path / "run")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and "rollout worker(s)" in lines[0]
    assert "--rollout.num_workers 500" in lines[0]
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()
