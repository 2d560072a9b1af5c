"""Named presets: complete `Config` instances for the hardware this project targets.

    tiny        random tiny Llama built in memory; a full run in seconds (tests)
    cpu-demo    embedded SmolLM2-135M-Instruct, vLLM rollouts, sized for a 2-core CPU (`make demo`)
    cpu-demo-l2 cpu-demo's recipe taken on to level 2 (multi-digit arithmetic) after level 1
    cpu-14core  Qwen2-0.5B-Instruct, 6 rollout workers on a 14-core CPU box
    gpu-8gb     Qwen2.5-1.5B-Instruct, NF4 QLoRA r=16, one copy of the weights, one 8 GB card
"""

from __future__ import annotations

from common.config import (
    Config,
    ConfigError,
    CurriculumConfig,
    GRPOConfig,
    LoraConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
)


def _tiny() -> Config:
    return Config(
        preset="tiny",
        model=ModelConfig(name="tiny-random-llama", dtype="fp32"),
        lora=LoraConfig(mode="lora", r=8, alpha=16),
        rollout=RolloutConfig(prompts_per_step=2, group_size=4, max_new_tokens=12,
                              max_staleness=1, call_timeout_s=120.0),
        grpo=GRPOConfig(lr=1e-3, entropy_rho=0.5, micro_batch=8),
        run=RunConfig(steps=4, checkpoint_every=2, sample_every=2, eval_n=20),
    )


def _cpu_demo() -> Config:
    return Config(
        preset="cpu-demo",
        model=ModelConfig(name="smollm2-135m-instruct"),
        lora=LoraConfig(mode="lora", r=16, alpha=32),
        # vLLM's CPU wheel: 110 steps in ~9.7 min against ~13 with HF generate, and about as
        # much learnt (3 seeds, docs/results.md: unseen 66.5% vs 69.5%, seen 94.5 vs 86.7)
        rollout=RolloutConfig(engine="vllm", prompts_per_step=2, group_size=8, max_new_tokens=40,
                              temperature=0.8, num_workers=1, threads_per_worker=1,
                              learner_threads=1, max_staleness=1),
        # micro_batch 8, one prompt's G completions packed in one row: the learner's step
        # ~22% shorter than at 4 (its time is no longer hidden: core sharing lends what it
        # saves to the rollout) for ~0.25 GiB more activation peak (docs/performance.md, "Memory")
        # entropy_rho 1.0, every completion token in the loss: against the top 20% it raised
        # unseen accuracy 58.7 -> 69.5% (3 seeds) and reached +20 points sooner (docs/results.md,
        # "Learning"; docs/history.md, "Time to accuracy"); the learner's 12-16% more work is
        # hidden behind the rollout at staleness 1
        grpo=GRPOConfig(lr=3e-4, entropy_rho=1.0, micro_batch=8),
        curriculum=CurriculumConfig(task="arith", level=1),
        # the format bonus only after working: without it one seed in three collapsed to
        # formatted guesses (`Answer: 8`, no sums) within ten steps (docs/results.md)
        reward=RewardConfig(format_needs_working=True),
        # 110 steps: ~9.5 min on 2 cores with vLLM (~14 with HF); the recipe search
        # (docs/results.md, "What did not work") found 110 steps at lr 3e-4 beat 60 at 1e-3
        run=RunConfig(steps=110, checkpoint_every=20, eval_n=150),
    )


def _cpu_demo_l2() -> Config:
    cfg = _cpu_demo()
    cfg.preset = "cpu-demo-l2"
    # Level 1 first: the base gets no level-2 problem right in 8 samples (pass@8 0%), so level 2
    # alone pays nothing to learn from; 40 level-1 steps teach the answer line and a sum to
    # write, and a quarter of the level-2 prompts replay level 1. The best level-2 recipe
    # measured, short of the +20-point target: 1.0 -> 8.2% (3 seeds, docs/results.md, "Level 2")
    cfg.curriculum.level = 2  # the held-out sets a run scores
    cfg.curriculum.stages = "arith:1:40,arith:2:120"
    cfg.curriculum.replay = 0.25
    cfg.run.steps = 160  # 10.3-11.4 min on 2 cores
    return cfg


def _cpu_14core() -> Config:
    return Config(
        preset="cpu-14core",
        # gradient checkpointing: without it a micro-batch of 16 x 256 tokens holds ~24 GB of
        # activations (measured 1.5 GiB at 4 x 64 on a random model of this shape; plan/ram.py)
        model=ModelConfig(name="Qwen/Qwen2-0.5B-Instruct", gradient_checkpointing=True),
        lora=LoraConfig(mode="lora", r=16, alpha=32),
        rollout=RolloutConfig(prompts_per_step=8, group_size=8, max_new_tokens=256,
                              num_workers=6, threads_per_worker=1, learner_threads=8,
                              max_staleness=1),
        # micro-batches of 8: 0.67 GiB of checkpointed activations, not 1.33 (the whole split
        # then plans under 8 GiB on a 16 GB box; the gradient is the same)
        grpo=GRPOConfig(lr=1e-4, entropy_rho=0.2, micro_batch=8),
        curriculum=CurriculumConfig(task="arith", level=2),
        # sized from the machine it runs on (launch/plan/sizing.py): 14 cores give the split above
        run=RunConfig(steps=200, checkpoint_every=25, cores=-1),
    )


def _gpu_8gb() -> Config:
    return Config(
        preset="gpu-8gb",
        # an instruct model whose GSM8K answers fit 512 new tokens (DeepSeek-R1-Distill's
        # thinking traces mostly would not: docs/gpu.md); dtype auto: bf16 on cards of compute
        # capability >= 8.0, fp16 on older ones
        model=ModelConfig(name="Qwen/Qwen2.5-1.5B-Instruct", dtype="auto",
                          gradient_checkpointing=True, device="cuda", gpu_memory_gb=8.0),
        lora=LoraConfig(mode="qlora", r=16, alpha=32),
        # one copy of the weights: the learner's NF4 model generates (launch/driver/one_copy.py);
        # rollouts and steps take turns in its process, so no staleness to gain from
        rollout=RolloutConfig(engine="learner", prompts_per_step=2, group_size=8,
                              max_new_tokens=512, max_prompt_tokens=512, max_staleness=0),
        grpo=GRPOConfig(lr=5e-5, entropy_rho=0.2, micro_batch=4),
        curriculum=CurriculumConfig(task="gsm8k"),
        run=RunConfig(steps=500, checkpoint_every=25),
    )


PRESETS = {"tiny": _tiny, "cpu-demo": _cpu_demo, "cpu-14core": _cpu_14core, "gpu-8gb": _gpu_8gb,
           "cpu-demo-l2": _cpu_demo_l2}


def get_preset(name: str) -> Config:
    """A fresh Config for the named preset; unknown names are a one-line ConfigError."""
    if name not in PRESETS:
        raise ConfigError(f"--preset: must be one of {', '.join(PRESETS)}; got {name!r}")
    return PRESETS[name]()
