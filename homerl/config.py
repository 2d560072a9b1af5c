"""`homerl.GRPOConfig`: TRL's `GRPOConfig` field names, mapped onto homerl's `Config`.

    from homerl import GRPOConfig
    args = GRPOConfig(output_dir="runs/q", learning_rate=1e-5, num_generations=8,
                      max_completion_length=128, max_steps=50)
    args = GRPOConfig(output_dir="runs/q", preset="cpu-14core", **{"rollout.max_staleness": 0})

Every field defaults to None: the preset's value (`preset`, default cpu-demo; `homerl.PRESETS`).
A TRL field is mapped where the concept is the same (the table in `FIELDS`); any homerl
setting is given as a `"section.field"` keyword (`homerl.Config`'s fields, the command line's
flags). A TRL or transformers field homerl has no counterpart for is refused in one line that
names it and what to use instead, unless it is given at a value that already describes what
homerl does (`adam_beta1=0.9`, `lr_scheduler_type="constant"`, `push_to_hub=False`, ...): never
silently ignored. `to_config` gives the `Config` a run would start from.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from common.config import Config, ConfigError
from common.presets import PRESETS, get_preset


@dataclass
class TRLFields:
    """The TRL fields homerl maps; None keeps the preset's value."""

    output_dir: str | None = None
    """where the run lives: its checkpoints, metrics and final weights (run.run_dir)"""
    learning_rate: float | None = None
    """AdamW's learning rate, constant over the run (grpo.lr)"""
    weight_decay: float | None = None
    """AdamW's weight decay (grpo.weight_decay)"""
    max_grad_norm: float | None = None
    """global gradient-norm clip, 0 off (grpo.max_grad_norm)"""
    num_generations: int | None = None
    """completions G sampled per prompt (rollout.group_size)"""
    max_completion_length: int | None = None
    """new tokens per completion at most (rollout.max_new_tokens)"""
    max_prompt_length: int | None = None
    """prompt tokens at most; longer prompts are skipped, counted (rollout.max_prompt_tokens)"""
    temperature: float | None = None
    """sampling temperature (rollout.temperature)"""
    top_p: float | None = None
    """nucleus sampling (rollout.top_p)"""
    top_k: int | None = None
    """top-k sampling, 0 off (rollout.top_k)"""
    beta: float | None = None
    """KL coefficient to the reference policy, 0 off (grpo.beta)"""
    epsilon: float | None = None
    """lower clip range of the importance ratio (grpo.eps_low); the upper one too unless
    epsilon_high is given, as in TRL"""
    epsilon_high: float | None = None
    """upper clip range of the importance ratio, DAPO's clip-higher (grpo.eps_high)"""
    loss_type: str | None = None
    """dapo or bnpo (tokens of the batch: grpo.loss_agg token_mean_all), grpo (per sequence:
    seq_mean), dr_grpo (a constant: dr_grpo)"""
    scale_rewards: str | bool | None = None
    """group or True (advantages over the group's std: grpo.adv_scale std), none or False"""
    top_entropy_quantile: float | None = None
    """share of completion tokens, highest entropy first, that get the gradient
    (grpo.entropy_rho)"""
    mask_truncated_completions: bool | None = None
    """completions cut at max_completion_length get no loss (reward.overlong mask)"""
    reward_weights: list[float] | None = None
    """one weight per reward function (reward.weights); None: 1 each"""
    seed: int | None = None
    """data order, sampling and initialisation (run.seed)"""
    max_steps: int | None = None
    """GRPO updates (run.steps); -1 or None: from num_train_epochs, else the preset's"""
    num_train_epochs: float | None = None
    """passes over train_dataset, when max_steps is not given: steps = ceil(epochs x rows /
    prompts per step)"""
    per_device_train_batch_size: int | None = None
    """completions per forward/backward pass (grpo.micro_batch); with
    gradient_accumulation_steps, the completions of one update, as in TRL"""
    gradient_accumulation_steps: int | None = None
    """micro-batches per update: completions per update = per_device_train_batch_size x this,
    prompts per update (rollout.prompts_per_step) = that / num_generations"""
    generation_batch_size: int | None = None
    """completions generated per update (homerl makes one update per generation):
    rollout.prompts_per_step = this / num_generations"""
    steps_per_generation: int | None = None
    """micro-batches per generation: must equal gradient_accumulation_steps (one update per
    generation)"""
    logging_steps: int | None = None
    """a log line and the callbacks' on_log every this many steps (metrics.jsonl has every
    step)"""
    log_completions: bool | None = None
    """write sampled completions to samples.jsonl every logging_steps (run.sample_every)"""
    save_steps: int | None = None
    """a checkpoint every this many steps (run.checkpoint_every)"""
    save_total_limit: int | None = None
    """checkpoints kept (run.keep_checkpoints)"""
    save_strategy: str | None = None
    """steps (every save_steps) or no (only at the end: run.checkpoint_every 0)"""
    report_to: str | list[str] | None = None
    """wandb (project $WANDB_PROJECT, else homerl; offline without an API key) or none"""
    use_vllm: bool | None = None
    """generate with vLLM (rollout.engine vllm; its CPU wheel on a CPU box) or transformers
    (hf)"""
    gradient_checkpointing: bool | None = None
    """recompute activations in the backward pass (model.gradient_checkpointing)"""
    bf16: bool | None = None
    """compute in bfloat16 (model.dtype bf16); False with fp16 False: fp32"""
    fp16: bool | None = None
    """compute in float16 (model.dtype fp16)"""
    use_cpu: bool | None = None
    """train on the CPU even where a GPU is (model.device cpu)"""
    disable_tqdm: bool | None = None
    """no progress bar"""
    resume_from_checkpoint: bool | str | None = None
    """continue the run in output_dir from its last checkpoint (True, or output_dir itself)"""


FIELDS: dict[str, str] = {
    "output_dir": "run.run_dir", "learning_rate": "grpo.lr", "weight_decay": "grpo.weight_decay",
    "max_grad_norm": "grpo.max_grad_norm", "num_generations": "rollout.group_size",
    "max_completion_length": "rollout.max_new_tokens",
    "max_prompt_length": "rollout.max_prompt_tokens", "temperature": "rollout.temperature",
    "top_p": "rollout.top_p", "top_k": "rollout.top_k", "beta": "grpo.beta",
    "epsilon": "grpo.eps_low", "epsilon_high": "grpo.eps_high", "loss_type": "grpo.loss_agg",
    "scale_rewards": "grpo.adv_scale", "top_entropy_quantile": "grpo.entropy_rho",
    "mask_truncated_completions": "reward.overlong", "reward_weights": "reward.weights",
    "seed": "run.seed", "max_steps": "run.steps", "save_steps": "run.checkpoint_every",
    "save_total_limit": "run.keep_checkpoints", "report_to": "run.wandb_project",
    "use_vllm": "rollout.engine", "gradient_checkpointing": "model.gradient_checkpointing",
    "per_device_train_batch_size": "grpo.micro_batch", "use_cpu": "model.device",
}
"""TRL field -> the homerl setting it sets (the rest are resolved in `to_config`)"""
LOSS_TYPES = {"dapo": "token_mean_all", "bnpo": "token_mean_all", "grpo": "seq_mean",
              "dr_grpo": "dr_grpo"}
SCALES = {"group": "std", True: "std", "none": "none", False: "none"}
AS_HOMERL_DOES: dict[str, tuple] = {
    "adam_beta1": (0.9,), "adam_beta2": (0.999,), "adam_epsilon": (1e-8,),
    "optim": ("adamw_torch", "adamw_torch_fused"), "lr_scheduler_type": ("constant",),
    "warmup_steps": (0,), "warmup_ratio": (0.0,), "num_iterations": (1,),
    "push_to_hub": (False,), "logging_strategy": ("steps",), "remove_unused_columns": (False,),
    "eval_strategy": ("no",), "shuffle_dataset": (True,), "overwrite_output_dir": (False,),
    "logging_first_step": (False,), "do_train": (True,), "vllm_mode": ("colocate",),
}
"""fields accepted only at these values: they describe what homerl does"""
ADVICE = {
    "lr_scheduler_type": "homerl's learning rate is constant (learning_rate)",
    "warmup_steps": "homerl's learning rate is constant, without warmup",
    "warmup_ratio": "homerl's learning rate is constant, without warmup",
    "num_iterations": "homerl makes one update per batch of completions; for off-policy steps "
                      "use 'rollout.max_staleness'",
    "vllm_mode": "homerl's vLLM engine runs in its own Ray actor (use_vllm=True); no server",
    "push_to_hub": "trainer.save_model(dir) writes a peft adapter; push it with huggingface_hub",
    "run_name": "the run is named after output_dir (wandb too)",
    "eval_strategy": "score the trained policy with homerl.evaluate after train()",
    "optim": "homerl's optimizer is AdamW",
    "logging_strategy": "logging_steps sets how often a line is logged",
}


class GRPOConfig(TRLFields):
    """TRL's GRPOConfig, as homerl runs it (see the module docstring): the fields of
    `TRLFields`, `preset` and any `"section.field"` override."""

    def __init__(self, output_dir: str | None = None, *, preset: str | None = None, **kwargs):
        known = {f.name for f in dataclasses.fields(TRLFields)}
        overrides = {k: v for k, v in kwargs.items() if "." in k}
        for name, value in kwargs.items():
            if name not in known and name not in overrides:
                _refuse_unknown(name, value)
        fields = {k: v for k, v in kwargs.items() if k in known}
        super().__init__(output_dir=output_dir, **fields)
        if preset is not None and preset not in PRESETS:
            raise ConfigError(f"GRPOConfig: preset: {preset!r} is not a preset; allowed: "
                              f"{', '.join(PRESETS)}")
        self.preset = preset
        """the preset every unset field comes from (None: cpu-demo)"""
        self.overrides = overrides
        """{"section.field": value}: homerl's own settings"""
        self._check_overrides()

    def _check_overrides(self) -> None:
        sections = {f.name: f.default_factory for f in dataclasses.fields(Config)
                    if f.default_factory is not dataclasses.MISSING}
        for key in self.overrides:
            section, _, name = key.partition(".")
            cls = sections.get(section)
            if cls is None or name not in {f.name for f in dataclasses.fields(cls)}:
                raise ConfigError(f"GRPOConfig: {key!r} is not a homerl setting; sections: "
                                  f"{', '.join(sections)} (python -m launch.train --help lists "
                                  "every field)")

    def given(self) -> list[str]:
        """The TRL fields set here (not None)."""
        return [f.name for f in dataclasses.fields(TRLFields) if getattr(self, f.name) is not None]


def _refuse_unknown(name: str, value) -> None:
    """Accept a field at a value that describes what homerl does; refuse anything else."""
    if name in AS_HOMERL_DOES and value in AS_HOMERL_DOES[name]:
        return
    why = ADVICE.get(name, "homerl has no such setting; homerl's own are given as "
                           "'section.field' keywords (python -m launch.train --help lists them)")
    raise ConfigError(f"GRPOConfig: {name}={value!r} is not supported: {why}")


def _spell(settings: dict[str, str]):
    """The error-message spelling of a homerl setting: the TRL field that set it, if one did."""
    back = {v: k for k, v in settings.items()} | {"resume": "resume_from_checkpoint=True for"}
    return lambda name: back.get(name, name)


def to_config(args: GRPOConfig, rows: int | None = None) -> tuple[Config, list[str], object]:
    """(the Config a run of `args` starts from, the `section.field` settings `args` gave, how
    an error spells them). `rows`: train_dataset's rows, for num_train_epochs. ConfigError
    (one line, naming the TRL field) for a value homerl cannot run."""
    cfg = get_preset(args.preset or "cpu-demo").to_dict()
    settings: dict[str, str] = {}  # TRL field -> section.field it set, for error messages

    def put(trl: str, key: str, value) -> None:
        section, name = key.split(".")
        cfg[section][name] = value
        settings[trl] = key

    for trl, key in FIELDS.items():
        value = getattr(args, trl)
        if value is not None and not (trl == "max_steps" and value == -1):  # -1: TRL's unset
            put(trl, key, _value(trl, value))
    if args.epsilon is not None and args.epsilon_high is None:  # TRL: symmetric by default
        put("epsilon", "grpo.eps_high", args.epsilon)
    if args.bf16 or args.fp16 or args.bf16 is False:
        put("bf16" if args.bf16 or not args.fp16 else "fp16", "model.dtype",
            "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32")
    if args.save_strategy is not None:
        if args.save_strategy not in ("steps", "no"):
            raise ConfigError(f"GRPOConfig: save_strategy={args.save_strategy!r}: steps or no")
        if args.save_strategy == "no":
            put("save_strategy", "run.checkpoint_every", 0)
    if args.log_completions:
        put("log_completions", "run.sample_every", args.logging_steps or 1)
    _batch(args, cfg, put)
    if args.max_steps in (None, -1) and args.num_train_epochs is not None:
        put("num_train_epochs", "run.steps", _epoch_steps(args.num_train_epochs, rows,
                                                          cfg["rollout"]["prompts_per_step"]))
    for key, value in args.overrides.items():
        section, name = key.split(".")
        cfg[section][name] = value
        settings[key] = key
    try:
        return Config.from_dict(cfg), sorted(set(settings.values())), _spell(settings)
    except (ConfigError, TypeError, ValueError) as e:
        text = str(e)
        for trl, key in settings.items():
            if text.startswith(f"{key}:") and trl != key:
                text = f"{trl} ({key}){text[len(key):]}"
        raise ConfigError(f"GRPOConfig: {text}") from None


def _value(trl: str, value):
    """A TRL field's value as the homerl setting it maps to holds it."""
    if trl == "loss_type":
        if value not in LOSS_TYPES:
            raise ConfigError(f"GRPOConfig: loss_type={value!r} is not supported; homerl has "
                              f"{', '.join(LOSS_TYPES)}")
        return LOSS_TYPES[value]
    if trl == "scale_rewards":
        if value not in SCALES:
            raise ConfigError(f"GRPOConfig: scale_rewards={value!r} is not supported; homerl "
                              "scales by the group's std (group, True) or not (none, False)")
        return SCALES[value]
    if trl == "report_to":
        return _wandb_project(value)
    if trl == "mask_truncated_completions":
        return "mask" if value else "keep"
    if trl == "reward_weights":
        return ",".join(repr(float(w)) for w in value)
    if trl == "use_vllm":
        return "vllm" if value else "hf"
    if trl == "use_cpu":
        return "cpu" if value else "auto"
    if trl == "output_dir":
        return os.path.abspath(os.fspath(value))
    return value


def _wandb_project(report_to) -> str:
    targets = [report_to] if isinstance(report_to, str) else list(report_to)
    targets = [t for t in targets if t not in ("none", None)]
    other = [t for t in targets if t not in ("wandb", "all")]
    if other:
        raise ConfigError(f"GRPOConfig: report_to={report_to!r}: homerl reports to wandb or "
                          "none (metrics.jsonl and the Ray dashboard always)")
    return (os.environ.get("WANDB_PROJECT") or "homerl") if targets else ""


def _batch(args: GRPOConfig, cfg: dict, put) -> None:
    """TRL's batch sizes -> prompts per update: one update per generation in homerl, so the
    completions of an update (per_device_train_batch_size x gradient_accumulation_steps) are
    those of a generation (generation_batch_size)."""
    accum = args.gradient_accumulation_steps
    if args.steps_per_generation is not None and args.steps_per_generation != (accum or 1):
        raise ConfigError("GRPOConfig: steps_per_generation must equal "
                          "gradient_accumulation_steps: homerl makes one update per generation "
                          "(for off-policy steps use 'rollout.max_staleness')")
    per_update = None
    if args.per_device_train_batch_size is not None:
        per_update = args.per_device_train_batch_size * (accum or 1)
    elif accum is not None:
        raise ConfigError("GRPOConfig: gradient_accumulation_steps needs "
                          "per_device_train_batch_size (their product: completions per update)")
    gen = args.generation_batch_size
    if gen is not None and per_update is not None and gen != per_update:
        raise ConfigError(f"GRPOConfig: generation_batch_size={gen} must equal "
                          f"per_device_train_batch_size x gradient_accumulation_steps = "
                          f"{per_update}: homerl makes one update per generation")
    completions = gen if gen is not None else per_update
    if completions is None:
        return
    group = cfg["rollout"]["group_size"]
    if completions % group:
        raise ConfigError(f"GRPOConfig: {completions} completions per update is not a multiple "
                          f"of num_generations={group} (TRL requires it too)")
    put("generation_batch_size" if gen is not None else "per_device_train_batch_size",
        "rollout.prompts_per_step", completions // group)


def _epoch_steps(epochs: float, rows: int | None, prompts_per_step: int) -> int:
    if rows is None:
        raise ConfigError("GRPOConfig: num_train_epochs needs a dataset of known length; give "
                          "max_steps for an IterableDataset")
    if not (epochs > 0 and math.isfinite(epochs)):
        raise ConfigError(f"GRPOConfig: num_train_epochs must be > 0; got {epochs!r}")
    return max(1, math.ceil(epochs * rows / prompts_per_step))
