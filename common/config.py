"""Run configuration: one dataclass per concern, validated on construction.

Every field carries a one-line docstring (read by `launch.cli` for `--help`). A bad value fails
fast in `__post_init__` with a one-line `ConfigError` naming the field and the allowed values.
Presets live in `common/presets.py`; `launch.cli` applies `--section.field value` overrides.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from common.task_config import FN_SPEC, VERIFIERS, CurriculumConfig, RewardConfig
from common.validate import ConfigError, _choice, _int, _range

__all__ = ["FN_SPEC", "VERIFIERS", "Config", "ConfigError", "CurriculumConfig", "EWCConfig",
           "GRPOConfig", "LoraConfig", "ModelConfig", "RewardConfig", "RolloutConfig",
           "RunConfig"]


@dataclass
class ModelConfig:
    name: str = "smollm2-135m-instruct"
    """policy: embedded name (smollm2-135m-instruct, tiny-random-llama), local path or hub id"""
    dtype: str = "auto"
    """compute dtype: auto (GPU: bf16 from compute capability 8.0, fp16 below; CPU: fp32, which
    keeps rollouts on-policy), bf16, fp16, fp32; trained LoRA tensors are fp32 whatever this is"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass (less memory, ~30% more learner time)"""
    device: str = "auto"
    """auto (a GPU when Ray has one, else CPU), cpu, or cuda (learner and engine share one GPU)"""
    gpu_memory_gb: float = 0.0
    """cap the GPU to this many GiB and check the plan against it (0: the whole card)"""

    def __post_init__(self):
        if not self.name:
            raise ConfigError("model.name: must be a model name, local path or hub id; got ''")
        _choice("model.dtype", self.dtype, ("auto", "bf16", "fp16", "fp32"))
        _choice("model.device", self.device, ("auto", "cpu", "cuda"))
        _range("model.gpu_memory_gb", self.gpu_memory_gb, 0.0, 4096.0)


@dataclass
class LoraConfig:
    mode: str = "lora"
    """what the learner trains: full (all weights), lora (adapters), qlora (adapters on NF4 base)"""
    r: int = 16
    """LoRA rank r"""
    alpha: int = 32
    """LoRA scaling numerator alpha (update scaled by alpha / r)"""
    dropout: float = 0.0
    """dropout on the LoRA input"""
    target_modules: str = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    """comma-separated module names that get adapters"""

    def __post_init__(self):
        _choice("lora.mode", self.mode, ("full", "lora", "qlora"))
        _int("lora.r", self.r, 1, 1024)
        _int("lora.alpha", self.alpha, 1)
        _range("lora.dropout", self.dropout, 0.0, 1.0, hi_open=True)
        if not self.modules():
            raise ConfigError("lora.target_modules: must name at least one module; got ''")

    def modules(self) -> list[str]:
        return [m.strip() for m in self.target_modules.split(",") if m.strip()]


@dataclass
class RolloutConfig:
    engine: str = "hf"
    """rollout engine: hf (transformers generate in rollout actors), vllm, or learner (the
    learner's own model generates in its process: one copy of the weights, one actor)"""
    num_workers: int = 1
    """number of rollout actors N"""
    threads_per_worker: int = 1
    """CPU cores (torch threads) per rollout actor"""
    learner_threads: int = 1
    """CPU cores (torch threads) for the learner actor"""
    prompts_per_step: int = 2
    """prompts per training step B"""
    group_size: int = 8
    """completions per prompt G"""
    max_new_tokens: int = 64
    """completion length limit (tokens)"""
    max_prompt_tokens: int = 256
    """prompt length limit (tokens); longer prompts are refused with a counted error"""
    temperature: float = 1.0
    """sampling temperature (the learner uses the same one for log-probs)"""
    top_p: float = 1.0
    """nucleus sampling mass: only 1.0 (the learner scores the full distribution, see README)"""
    top_k: int = 0
    """top-k sampling: only 0 = all tokens (the learner scores the full distribution)"""
    max_staleness: int = 1
    """rollouts may use weights this many versions behind the learner (0 = synchronous)"""
    steps_per_call: int = 1
    """steps one generate call serves (F; one bigger decode batch); max_staleness >= 2F-1"""
    call_timeout_s: float = 900.0
    """a rollout call slower than this marks the worker dead (seconds)"""
    reward_timeout_s: float = 2.0
    """hard time limit per verified completion (seconds)"""
    format_weight: float = 0.5
    """reward = correct + format_weight * format_score (see reward.format_if_correct)"""
    placement: str = "auto"
    """actor placement: auto (pack on one node when it fits, else spread), pack or spread"""
    engine_memory_gb: float = 0.0
    """GPU GiB the rollout engine may take when it shares a card (0: what the plan says)"""
    kv_cache: str = "auto"
    """KV cache of transformers' generate (hf, learner): static (allocated once at the call's
    full size), dynamic (grows per token), or auto (static on a GPU, dynamic on a CPU)"""
    share_cores: bool = True
    """on a CPU node, the learner and the vLLM rollout workers lend each other their cores
    while one waits (common/core_lease.py); false: each keeps to its own, and a run repeats
    bit for bit from its seed (with sharing, thread counts follow timing, and so do float sums)"""

    def __post_init__(self):
        _choice("rollout.engine", self.engine, ("hf", "vllm", "learner"))
        _int("rollout.num_workers", self.num_workers, 1, 1024)
        if self.one_copy and self.num_workers != 1:
            raise ConfigError(f"rollout.num_workers: must be 1 with rollout.engine=learner (the "
                              f"learner's own model generates); got {self.num_workers}")
        _int("rollout.threads_per_worker", self.threads_per_worker, 1, 512)
        _int("rollout.learner_threads", self.learner_threads, 1, 512)
        _int("rollout.prompts_per_step", self.prompts_per_step, 1)
        _int("rollout.group_size", self.group_size, 2)
        _int("rollout.max_new_tokens", self.max_new_tokens, 1, 32768)
        _int("rollout.max_prompt_tokens", self.max_prompt_tokens, 8, 131072)
        _range("rollout.temperature", self.temperature, 0.0, 10.0, lo_open=True)
        _range("rollout.top_p", self.top_p, 0.0, 1.0, lo_open=True)
        if self.top_p != 1.0:
            raise ConfigError(
                f"rollout.top_p: must be 1.0 (a truncated sampling distribution would make the "
                f"behaviour log-probs differ from the learner's full-distribution ones); "
                f"got {self.top_p!r}")
        _int("rollout.top_k", self.top_k, 0)
        if self.top_k != 0:
            raise ConfigError(
                f"rollout.top_k: must be 0 (all tokens; a truncated sampling distribution would "
                f"make the behaviour log-probs differ from the learner's); got {self.top_k!r}")
        _int("rollout.max_staleness", self.max_staleness, 0, 16)
        _int("rollout.steps_per_call", self.steps_per_call, 1, 8)
        if self.steps_per_call - 1 > self.max_staleness:  # 2F-1 keeps workers busy; F-1 runs
            raise ConfigError(
                f"rollout.steps_per_call={self.steps_per_call} needs rollout.max_staleness >= "
                f"{self.steps_per_call - 1} (the last step of a call is that many versions "
                f"behind); got max_staleness={self.max_staleness}")
        _range("rollout.call_timeout_s", self.call_timeout_s, 0.0, lo_open=True)
        _range("rollout.reward_timeout_s", self.reward_timeout_s, 0.0, lo_open=True)
        _range("rollout.format_weight", self.format_weight, 0.0, 10.0)
        _choice("rollout.placement", self.placement, ("auto", "pack", "spread"))
        _range("rollout.engine_memory_gb", self.engine_memory_gb, 0.0, 4096.0)
        _choice("rollout.kv_cache", self.kv_cache, ("auto", "static", "dynamic"))

    @property
    def one_copy(self) -> bool:
        """The learner's model generates (engine=learner): no rollout actor, no weight push."""
        return self.engine == "learner"


@dataclass
class GRPOConfig:
    lr: float = 2e-4
    """AdamW learning rate"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip (0 disables)"""
    eps_low: float = 0.2
    """lower clip range epsilon_low of the importance ratio (PPO/DAPO)"""
    eps_high: float = 0.28
    """upper clip range epsilon_high (DAPO clip-higher)"""
    beta: float = 0.0
    """KL(k3) coefficient beta to the reference policy (0 disables, no reference pass)"""
    loss_agg: str = "token_mean"
    """loss normaliser: token_mean (selected tokens), token_mean_all, seq_mean, dr_grpo"""
    dual_clip_c: float = -1.0
    """dual-clip c > 1 for negative advantages; 0 off; -1 auto (3 if max_staleness > 0)"""
    adv_scale: str = "std"
    """advantage scaling: std (GRPO, (r-mean)/(std+eps)) or none (Dr.GRPO, r-mean)"""
    entropy_rho: float = 0.2
    """fraction rho of completion tokens, highest entropy first, that get the policy gradient"""
    micro_batch: int = 8
    """sequences per forward/backward pass (gradient accumulation over the step)"""

    def __post_init__(self):
        _range("grpo.lr", self.lr, 0.0, 1.0, lo_open=True)
        _range("grpo.weight_decay", self.weight_decay, 0.0, 1.0)
        _range("grpo.max_grad_norm", self.max_grad_norm, 0.0)
        _range("grpo.eps_low", self.eps_low, 0.0, 1.0, lo_open=True, hi_open=True)
        _range("grpo.eps_high", self.eps_high, 0.0, 10.0, lo_open=True)
        _range("grpo.beta", self.beta, 0.0)
        _choice("grpo.loss_agg", self.loss_agg,
                ("token_mean", "token_mean_all", "seq_mean", "dr_grpo"))
        _range("grpo.dual_clip_c", self.dual_clip_c, -1.0)
        if self.dual_clip_c not in (-1.0, 0.0) and not self.dual_clip_c > 1.0:
            raise ConfigError(f"grpo.dual_clip_c: must be -1 (auto), 0 (off) or > 1; "
                              f"got {self.dual_clip_c!r}")
        _choice("grpo.adv_scale", self.adv_scale, ("std", "none"))
        _range("grpo.entropy_rho", self.entropy_rho, 0.0, 1.0, lo_open=True)
        _int("grpo.micro_batch", self.micro_batch, 1)


@dataclass
class EWCConfig:
    lam: float = 0.0
    """EWC strength lambda (0 disables the penalty)"""
    gamma: float = 1.0
    """online-EWC decay of the previous stages' Fisher"""
    fisher_batches: int = 4
    """batches of sampled completions used for the diagonal Fisher estimate"""
    anchor_kl: float = 0.0
    """weight of a k3 KL to the policy at the end of the previous stage (0 disables it)"""

    def __post_init__(self):
        _range("ewc.lam", self.lam, 0.0)
        _range("ewc.anchor_kl", self.anchor_kl, 0.0)
        _range("ewc.gamma", self.gamma, 0.0, 1.0)
        _int("ewc.fisher_batches", self.fisher_batches, 1, 1000)


@dataclass
class RunConfig:
    steps: int = 60
    """training steps (one GRPO update each)"""
    seed: int = 0
    """seed for data order, sampling and initialisation"""
    run_dir: str = ""
    """output directory (empty: runs/<timestamp>)"""
    checkpoint_every: int = 20
    """write a checkpoint every k steps (0: only at the end)"""
    keep_checkpoints: int = 2
    """checkpoints kept on disk (oldest removed first)"""
    sample_every: int = 5
    """log a sample of completions to samples.jsonl every k steps"""
    eval_n: int = 100
    """held-out problems scored by the demo's before/after evaluation"""
    wandb_project: str = ""
    """log to this wandb project (offline when no API key is set; empty: no wandb)"""
    max_learner_restarts: int = 3
    """learner deaths survived by restoring the last checkpoint; one more stops the run"""
    learner_timeout_s: float = 1800.0
    """a learner step still running after this long is a hung learner: killed and restored"""
    checkpoint_fail_policy: str = "continue"
    """a checkpoint that cannot be written (full disk, unwritable directory): continue (warn,
    count, keep the previous one) or stop (exit with one line, checkpoints kept)"""
    wait_for_capacity_s: float = 600.0
    """after a lost node, how long the run waits for the cluster to host the lost learner or
    worker again (seconds) before it stops with one line and a resumable checkpoint"""
    cores: int = 0
    """CPU cores to size the run for (rollout workers, their threads, learner threads:
    launch/plan/sizing.py): 0 = the preset's split, -1 = every core this process may use"""
    ram_gb: float = 0.0
    """RAM to size the run for, GiB: 0 = what is available at start"""
    learner_tcmalloc: bool = True
    """a CPU learner runs with tcmalloc (LD_PRELOAD) when libtcmalloc_minimal is installed
    (`make tcmalloc`): steps ~18% faster here than with glibc malloc, and a lower peak"""

    def __post_init__(self):
        _int("run.steps", self.steps, 1)
        _range("run.wait_for_capacity_s", self.wait_for_capacity_s, 0.0)
        _int("run.max_learner_restarts", self.max_learner_restarts, 0, 1000)
        _range("run.learner_timeout_s", self.learner_timeout_s, 0.0, lo_open=True)
        _choice("run.checkpoint_fail_policy", self.checkpoint_fail_policy, ("continue", "stop"))
        _int("run.seed", self.seed, 0, 2**31 - 1)
        _int("run.checkpoint_every", self.checkpoint_every, 0)
        _int("run.keep_checkpoints", self.keep_checkpoints, 1)
        _int("run.sample_every", self.sample_every, 1)
        _int("run.eval_n", self.eval_n, 1)
        _int("run.cores", self.cores, -1, 4096)
        _range("run.ram_gb", self.ram_gb, 0.0)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    ewc: EWCConfig = field(default_factory=EWCConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    run: RunConfig = field(default_factory=RunConfig)
    preset: str = "custom"

    def dual_clip_c(self) -> float:
        """grpo.dual_clip_c resolved: -1 (auto) is 3 when rollouts may be stale, else off."""
        if self.grpo.dual_clip_c >= 0:
            return self.grpo.dual_clip_c
        return 3.0 if self.rollout.max_staleness > 0 else 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        """Inverse of `to_dict`; unknown sections or keys are a ConfigError."""
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in d:
                continue
            if f.name == "preset":
                kwargs["preset"] = d["preset"]
                continue
            sub = d[f.name]
            sub_cls = f.default_factory
            names = {sf.name for sf in dataclasses.fields(sub_cls)}
            unknown = set(sub) - names
            if unknown:
                raise ConfigError(
                    f"{f.name}: unknown key(s) {sorted(unknown)}; allowed: {sorted(names)}")
            kwargs[f.name] = sub_cls(**sub)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"config: unknown section(s) {sorted(unknown)}")
        return cls(**kwargs)
