"""Config validation, presets and the CLI: every bad value is a one-line error naming the field."""

import dataclasses
import subprocess
import sys

import pytest

from common.config import (
    Config,
    ConfigError,
    CurriculumConfig,
    EWCConfig,
    GRPOConfig,
    LoraConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
)
from common.presets import PRESETS, get_preset
from launch.cli import field_docs, parse_config

BAD_FIELDS = [
    (ModelConfig, "dtype", "fp8", "model.dtype: must be one of auto, bf16, fp16, fp32"),
    (ModelConfig, "name", "", "model.name"),
    (LoraConfig, "mode", "dora", "lora.mode: must be one of full, lora, qlora"),
    (LoraConfig, "r", 0, "lora.r: must be in [1, 1024]"),
    (LoraConfig, "r", 2.5, "lora.r: must be an integer"),
    (LoraConfig, "dropout", 1.0, "lora.dropout: must be in [0.0, 1.0)"),
    (LoraConfig, "target_modules", " , ", "lora.target_modules"),
    (RolloutConfig, "engine", "sglang", "rollout.engine: must be one of hf, vllm"),
    (RolloutConfig, "group_size", 1, "rollout.group_size: must be in [2, inf]"),
    (RolloutConfig, "num_workers", 0, "rollout.num_workers"),
    (RolloutConfig, "temperature", 0.0, "rollout.temperature: must be in (0.0, 10.0]"),
    (RolloutConfig, "top_p", 1.5, "rollout.top_p"),
    (RolloutConfig, "top_p", 0.9, "rollout.top_p: must be 1.0"),
    (RolloutConfig, "top_k", 20, "rollout.top_k: must be 0"),
    (RolloutConfig, "max_staleness", -1, "rollout.max_staleness"),
    (RolloutConfig, "steps_per_call", 0, "rollout.steps_per_call: must be in [1, 8]"),
    (RolloutConfig, "max_new_tokens", "64", "rollout.max_new_tokens: must be an integer"),
    (GRPOConfig, "lr", 0.0, "grpo.lr"),
    (GRPOConfig, "eps_low", 1.0, "grpo.eps_low"),
    (GRPOConfig, "loss_agg", "sum",
     "grpo.loss_agg: must be one of token_mean, token_mean_all, seq_mean, dr_grpo"),
    (GRPOConfig, "dual_clip_c", 0.5, "grpo.dual_clip_c: must be -1 (auto), 0 (off) or > 1"),
    (RewardConfig, "overlong", "drop", "reward.overlong: must be one of keep, mask, soft_penalty"),
    (RewardConfig, "overlong_buffer", 0.0, "reward.overlong_buffer: must be in (0.0, 1.0]"),
    (GRPOConfig, "adv_scale", "z", "grpo.adv_scale: must be one of std, none"),
    (GRPOConfig, "entropy_rho", 0.0, "grpo.entropy_rho: must be in (0.0, 1.0]"),
    (GRPOConfig, "entropy_rho", float("nan"), "grpo.entropy_rho: must be a number"),
    (EWCConfig, "lam", -1.0, "ewc.lam"),
    (EWCConfig, "gamma", 1.5, "ewc.gamma"),
    (CurriculumConfig, "task", "math", "curriculum.task: must be one of arith, gsm8k"),
    (CurriculumConfig, "level", 4, "curriculum.level: must be one of 1, 2, 3"),
    (RunConfig, "steps", 0, "run.steps"),
    (RunConfig, "keep_checkpoints", 0, "run.keep_checkpoints"),
]


@pytest.mark.parametrize("cls,field,value,msg", BAD_FIELDS)
def test_bad_field_names_field_and_allowed_values(cls, field, value, msg):
    with pytest.raises(ConfigError) as e:
        cls(**{field: value})
    assert msg in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("weights", ["1,inf", "nan,1", "1,-inf", "1e39,1"])
def test_reward_weights_must_be_finite(weights):
    """A weight that is not finite (as the rewards' float32: 1e39 is inf there) would make
    every reward, then every advantage, NaN or inf."""
    with pytest.raises(ConfigError) as e:
        RewardConfig(fn="a:f,b:g", weights=weights)
    msg = str(e.value)
    assert msg.startswith("reward.weights: must be finite numbers") and repr(weights) in msg
    assert "\n" not in msg
    assert RewardConfig(fn="a:f,b:g", weights="-1e38,0.5").fn_weights() == [-1e38, 0.5]


def test_steps_per_call_needs_the_staleness_its_last_step_has():
    with pytest.raises(ConfigError) as e:
        RolloutConfig(steps_per_call=3, max_staleness=1)
    assert "rollout.steps_per_call=3" in str(e.value) and "max_staleness=1" in str(e.value)
    RolloutConfig(steps_per_call=3, max_staleness=2)  # every step of a call within the bound


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_are_valid_and_round_trip(name):
    cfg = get_preset(name)
    assert cfg.preset == name
    assert Config.from_dict(cfg.to_dict()) == cfg


def test_the_level_2_preset_is_the_documented_recipe():
    """cpu-demo-l2 is cpu-demo with the flags docs/results.md ("Level 2") ran on 3 seeds, and its
    stages parse: 40 level-1 steps, then 120 of level 2 with level-1 replay."""
    from launch.driver.curriculum import parse_stages

    flags = ["--curriculum.level", "2", "--curriculum.stages", "arith:1:40,arith:2:120",
             "--curriculum.replay", "0.25", "--steps", "160"]
    ran, _ = parse_config(["--preset", "cpu-demo", *flags])
    preset = get_preset("cpu-demo-l2")
    assert dataclasses.replace(ran, preset="cpu-demo-l2") == preset
    assert [(s.level, s.steps) for s in parse_stages(preset.curriculum.stages, preset)] == [(1, 40),
                                                                                   (2, 120)]
    assert get_preset("cpu-demo").curriculum.stages == ""  # the demo's own preset unchanged


def test_unknown_key_and_section_rejected():
    d = get_preset("tiny").to_dict()
    d["grpo"]["learning_rate"] = 1e-3
    with pytest.raises(ConfigError, match="grpo: unknown key"):
        Config.from_dict(d)
    d = get_preset("tiny").to_dict()
    d["optim"] = {}
    with pytest.raises(ConfigError, match="unknown section"):
        Config.from_dict(d)


def test_every_field_has_a_docstring():
    for f in Config.__dataclass_fields__.values():
        if f.name == "preset":
            continue
        cls = f.default_factory
        docs = field_docs(cls)
        missing = [n for n in cls.__dataclass_fields__ if not docs.get(n)]
        assert not missing, f"{cls.__name__} fields without docstring: {missing}"


def test_dual_clip_auto_follows_staleness():
    cfg = get_preset("tiny")
    cfg.rollout.max_staleness = 0
    assert cfg.grpo.dual_clip_c == -1.0 and cfg.dual_clip_c() == 0.0
    cfg.rollout.max_staleness = 1
    assert cfg.dual_clip_c() == 3.0
    cfg.grpo.dual_clip_c = 0.0
    assert cfg.dual_clip_c() == 0.0
    cfg.grpo.dual_clip_c = 5.0
    assert cfg.dual_clip_c() == 5.0


def test_cli_overrides_and_aliases():
    cfg, _ = parse_config(["--preset", "tiny", "--steps", "7", "--seed", "3",
                           "--rollout.group_size", "6", "--lora.mode", "full",
                           "--model.gradient_checkpointing", "true"])
    assert (cfg.run.steps, cfg.run.seed, cfg.rollout.group_size) == (7, 3, 6)
    assert cfg.lora.mode == "full" and cfg.model.gradient_checkpointing is True


@pytest.mark.parametrize("argv,msg", [
    (["--preset", "nope"], "--preset: must be one of tiny, cpu-demo"),
    (["--rollout.group_size", "x"], "--rollout.group_size: must be int"),
    (["--grpo.loss_agg", "sum"], "grpo.loss_agg: must be one of token_mean, token_mean_all"),
    (["--rollout.top_p", "0.95"], "rollout.top_p: must be 1.0"),
    (["--reward.fn", "numeric", "--reward.weights", "inf"], "reward.weights: must be finite"),
    (["--bogus", "1"], "unrecognized arguments: --bogus"),
])
def test_cli_errors_are_one_line(argv, msg):
    proc = subprocess.run([sys.executable, "-m", "launch.train", *argv],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert msg in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_lists_every_field():
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    for f in Config.__dataclass_fields__.values():
        if f.name == "preset":
            continue
        for name, doc in field_docs(f.default_factory).items():
            assert f"--{f.name}.{name}" in proc.stdout
            assert doc.split()[0] in proc.stdout
