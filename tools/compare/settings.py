"""What `tools.compare.bench` and `tools.compare.rollout_only` share: the settings both systems run
with, the prompts, our config for them, the report formatting and the machine line."""

from __future__ import annotations

import ctypes
import gc
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass

import torch

from common.device import cpu_line
from common.models import load_model
from common.presets import get_preset
from tasks.registry import make_task

LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


@dataclass
class Settings:
    model: str = "smollm2-135m-instruct"
    prompts: int = 2
    group: int = 8
    max_new_tokens: int = 64
    temperature: float = 1.0
    lr: float = 3e-4
    lora_r: int = 16
    lora_alpha: int = 32
    rho: float = 0.2
    format_weight: float = 0.5
    steps: int = 6
    warmup: int = 2
    seed: int = 0
    trl_threads: int = 2
    engine: str = "hf"
    """our rollout engine: hf (generate) or vllm (vLLM's CPU wheel, when installed)"""
    trl_engine: str = "hf"
    """TRL's generation: hf (transformers' generate) or vllm (use_vllm=True, colocate)"""
    max_staleness: int = 1
    """ours: rollouts may lag the learner by this many versions (launch.train's default)"""
    steps_per_call: int = 1
    """ours: steps one rollout call generates (launch.train's default)"""

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    @property
    def completions(self) -> int:
        return self.prompts * self.group


TRL_ENGINES = {
    "vllm": "GRPOTrainer with use_vllm=True, vllm_mode=\"colocate\" (vLLM's CPU engine in "
            "TRL's process; python -m tools.compare.trl_vllm checks its weight sync)",
    "hf": "GRPOTrainer with use_vllm=False (transformers' generate)"}
"""what each `--trl-engine` runs, as the benches print it"""


def default_engine() -> str:
    """vllm when vLLM's CPU wheel is installed (`make bench` installs it), else hf."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"


def add_trl_engine(parser) -> None:
    """The benches' `--trl-engine` option."""
    parser.add_argument("--trl-engine", default=default_engine(), choices=list(TRL_ENGINES),
                        help="TRL's generation: vllm (use_vllm=True, colocate) or hf (its "
                        "generate); default: vllm when vLLM is installed, as for ours")


def trl_generation(engine: str) -> dict:
    """TRL's GRPOConfig fields for its generation engine, as a TRL user switches vLLM on."""
    if engine != "vllm":
        return {"use_vllm": False}
    # vLLM's CPU engine takes a share of the machine's RAM for its KV cache by default and
    # refuses to start where the process already holds that much (after ours ran in it);
    # 16 sequences of this model need a few MB, so a TRL user would size it so too
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return {"use_vllm": True, "vllm_mode": "colocate"}


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def machine_line() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import transformers

    try:
        trl_v = importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        trl_v = "not installed"
    return (f"machine: {cpu_line()}, {mem:.0f} GB RAM; "
            f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl_v}")


def settings_line(s: Settings) -> str:
    return (f"settings: {s.model} fp32, {s.prompts} prompts x G={s.group} = {s.completions} "
            f"completions/step, max {s.max_new_tokens} new tokens, temperature {s.temperature}, "
            f"beta 0, LoRA r={s.lora_r} alpha={s.lora_alpha}, lr {s.lr}, rho {s.rho}, "
            f"{s.warmup} warm-up + {s.steps} timed steps; trl: 1 process, {s.trl_threads} torch "
            f"threads; ours: 1 {s.engine} rollout worker + 1 learner x 1 thread on Ray, "
            f"max_staleness={s.max_staleness}, steps_per_call={s.steps_per_call} (rollouts "
            f"overlap updates; each rollout call serves {s.steps_per_call} step(s))")


def bench_prompts(s: Settings, n_steps: int) -> list[dict]:
    """Prompts of all steps in order: step k uses entries [k*B, (k+1)*B), like our driver."""
    task = make_task("arith", 1, None, s.seed)
    return [task.train_sample(i) for i in range(n_steps * s.prompts)]


def fmt3(x: float) -> str:
    """3 significant digits, whole numbers from 1000 up (used by both bench reports)."""
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def release_memory() -> None:
    """Before the next system: collect garbage, hand freed heap pages back to the OS (glibc),
    and reset this process's high-water RSS (VmHWM) to its current RSS, so the next system's
    peak does not include the one that ran before it in this process (Linux >= 4.0)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak RSS (proc(5), /proc/pid/clear_refs)
    except OSError:
        pass


def ours_config(s: Settings, run_dir: str = ""):
    cfg = get_preset("cpu-demo")
    cfg.model.name, cfg.model.dtype = s.model, "fp32"
    cfg.lora.mode, cfg.lora.r, cfg.lora.alpha = "lora", s.lora_r, s.lora_alpha
    cfg.lora.target_modules = LORA_TARGETS
    r = cfg.rollout
    r.prompts_per_step, r.group_size, r.max_new_tokens = s.prompts, s.group, s.max_new_tokens
    r.temperature, r.top_p = s.temperature, 1.0
    r.max_staleness, r.steps_per_call = s.max_staleness, s.steps_per_call
    r.format_weight, r.engine = s.format_weight, s.engine
    g = cfg.grpo
    g.lr, g.beta, g.entropy_rho, g.micro_batch = s.lr, 0.0, s.rho, 8
    g.eps_low, g.eps_high, g.loss_agg, g.adv_scale = 0.2, 0.28, "token_mean", "std"
    g.weight_decay, g.max_grad_norm = 0.0, 1.0
    cfg.curriculum.task, cfg.curriculum.level = "arith", 1
    cfg.run.steps, cfg.run.seed, cfg.run.run_dir = s.total_steps, s.seed, run_dir
    cfg.run.checkpoint_every, cfg.run.sample_every = 0, 10**6
    return cfg


def start_ray(num_cpus: int) -> bool:
    """A quiet local cluster unless one is up already; True when this call started it."""
    import ray

    if ray.is_initialized():
        return False
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return True


def trl_trainer(path: str, tok, rows: list[dict], reward, args, lora_r: int, lora_alpha: int,
                callback):
    """TRL's GRPOTrainer on the fp32 model at `path` with our LoRA targets, the dataset `rows`
    ({"prompt", "answer"}), `reward`, its GRPOConfig `args` and our `callback`; its printing
    callbacks removed (the benches print their own lines)."""
    import datasets
    import peft
    import trl
    from transformers import PrinterCallback, ProgressCallback

    lora = peft.LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0,
                           target_modules=LORA_TARGETS.split(","), task_type="CAUSAL_LM")
    trainer = trl.GRPOTrainer(
        model=load_model(path, torch.float32), reward_funcs=reward, args=args,
        train_dataset=datasets.Dataset.from_list(rows), processing_class=tok, peft_config=lora,
        callbacks=[callback])
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    return trainer
