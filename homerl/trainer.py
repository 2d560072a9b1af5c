"""`homerl.GRPOTrainer`: TRL's GRPOTrainer, run by homerl's Ray actors.

    from homerl import GRPOConfig, GRPOTrainer
    trainer = GRPOTrainer(model="smollm2-135m-instruct", reward_funcs=reward_len,
                          args=GRPOConfig(output_dir="runs/len", max_steps=20),
                          train_dataset=dataset)
    trainer.train()                   # TrainOutput(global_step, training_loss, metrics)
    trainer.save_model("len-adapter")  # a peft adapter

`train()` takes the path every run takes (`launch.cli.plan_run`, `claim_run`, the driver's
`Trainer` under `run_supervised`): the run directory (`output_dir`) holds the config, the data
(`homerl/data.py`), the reward functions passed by value (`rewards/byvalue.py`), checkpoints,
metrics and final/, so `python -m launch.train --resume DIR` and the web app see the same run.
It joins the Ray cluster `ray.init` already connected to (kept when it returns), else the one
RAY_ADDRESS names or a local one it starts, and leaves that when it returns. Ctrl-C (a
notebook's interrupt) stops after the step in flight, with a checkpoint, and raises
KeyboardInterrupt; a second Ctrl-C stops at once, keeping the last checkpoint. A second
`train()` continues the same run: after a stop it resumes; after a finished run it trains
`max_steps` more.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading

from transformers import TrainerControl, TrainerState
from transformers.trainer_utils import TrainOutput

from common import metrics as M
from common.config import Config, ConfigError
from common.models import resolve_model
from common.task_config import FN_SPEC, VERIFIERS
from homerl import data as run_data
from homerl.config import GRPOConfig, to_config
from launch.cli import RunRefused, claim_run, plan_run
from launch.driver.placement import RayConnection
from launch.driver.supervise import run_supervised, stop_on_interrupt
from launch.driver.trainer import RunStopped, Trainer
from launch.rundir.checkpoints import checkpoint_step, list_checkpoints
from launch.rundir.ownership import is_run, remove_if_untouched
from launch.rundir.reward_code import write_reward_code
from launch.rundir.writer import default_run_dir, read_jsonl
from rewards.byvalue import NAME, pack, spec_of

LORA_FIELDS = {"r": "lora.r", "lora_alpha": "lora.alpha", "lora_dropout": "lora.dropout"}
LORA_DEFAULTS = {"use_dora": False, "use_rslora": False, "bias": "none", "modules_to_save": None}
"""peft.LoraConfig fields homerl accepts only at these values"""


class GRPOTrainer:
    """TRL's `GRPOTrainer(model, reward_funcs, args, train_dataset, ...)` (module docstring)."""

    def __init__(self, model, reward_funcs, args: GRPOConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_processing_classes=None,
                 callbacks=None, optimizers=(None, None), peft_config=None):
        if not isinstance(model, (str, os.PathLike)):
            raise ConfigError("GRPOTrainer: model: pass the model's name or path (homerl loads "
                              "it in its own actors); for a model object, save_pretrained(dir) "
                              "and pass dir")
        if reward_processing_classes is not None or optimizers != (None, None):
            raise ConfigError("GRPOTrainer: reward_processing_classes and optimizers are not "
                              "supported (reward models: score with a function; the optimizer "
                              "is AdamW, GRPOConfig(learning_rate=...))")
        if train_dataset is None:
            raise ConfigError("GRPOTrainer: train_dataset is required")
        self.model = os.fspath(model)
        self.args = args if args is not None else GRPOConfig()
        self.specs, self.packed = reward_specs(reward_funcs)
        self.lora = lora_settings(peft_config)
        self._check_tokenizer(processing_class)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.callbacks = [c() if isinstance(c, type) else c for c in (callbacks or [])]
        self.run_dir = self.args.output_dir or default_run_dir()
        self.state = TrainerState()
        """transformers' TrainerState as the callbacks see it: global_step, max_steps,
        log_history (one row per logged step)"""
        self.trained = False  # a train() of this trainer has started the run

    def _check_tokenizer(self, processing_class) -> None:
        """The run uses the model's own tokenizer: a different one is one line."""
        name = getattr(processing_class, "name_or_path", None)
        if processing_class is not None and name not in (self.model,):
            if name is None or os.path.realpath(name) != os.path.realpath(
                    resolve_model(self.model)):
                raise ConfigError("GRPOTrainer: processing_class: homerl uses the model's own "
                                  "tokenizer; save yours beside the model and pass its path")

    # ---- the config of a run ---------------------------------------------------------------
    def _config(self, resume: bool) -> tuple[Config, list[str], object]:
        """(the Config this train() asks for, the settings given, their error spelling)."""
        rows = run_data.rows(self.train_dataset)
        cfg, given, spell = to_config(self.args, rows)
        steps = cfg.run.steps
        if resume and self.trained and self._finished():  # train() again: max_steps more
            steps = checkpoint_step(list_checkpoints(self.run_dir)[-1]) + cfg.run.steps
        eval_path = run_data.data_path(self.run_dir, "eval") if self.eval_dataset else ""
        answer = self._columns(self.train_dataset)
        data = {"curriculum.task": "file", "curriculum.prompt_field": "prompt",
                "curriculum.data_path": run_data.data_path(self.run_dir, "train"),
                "curriculum.answer_field": "answer" if "answer" in answer else "",
                "curriculum.heldout_path": eval_path, "curriculum.prompt_as_is": True,
                "curriculum.heldout_size": cfg.curriculum.heldout_size if eval_path else 0,
                "curriculum.stages": "", "model.name": self.model,
                "reward.fn": ",".join(self.specs), "run.run_dir": os.path.abspath(self.run_dir),
                "run.steps": steps, **self.lora}
        fixed = cfg.to_dict()
        for key, value in data.items():
            section, name = key.split(".")
            if key not in self.args.overrides:  # an explicit "section.field" wins
                fixed[section][name] = value
        try:
            cfg = Config.from_dict(fixed)
        except (ConfigError, TypeError, ValueError) as e:
            raise ConfigError(f"GRPOTrainer: {e}") from None
        return cfg, sorted({*given, *data}), spell

    @staticmethod
    def _columns(dataset) -> list[str]:
        names = getattr(dataset, "column_names", None)
        if names is not None:
            return list(names)
        if isinstance(dataset, dict):
            return list(dataset)
        return list(dataset[0]) if isinstance(dataset, list) and dataset else []

    def _finished(self) -> bool:
        return os.path.isdir(os.path.join(self.run_dir, "final"))

    # ---- train ---------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: bool | str | None = None, **kwargs) -> TrainOutput:
        """Train (module docstring); returns TrainOutput(global_step, training_loss, metrics).
        `resume_from_checkpoint` True (or output_dir) continues the run in output_dir."""
        if kwargs:
            raise ConfigError(f"GRPOTrainer.train: {', '.join(kwargs)}: not supported "
                              "(trial and ignore_keys_for_eval are Hugging Face Trainer's)")
        resume = self._resume(resume_from_checkpoint)
        cfg, given, spell = self._config(resume)
        try:
            cfg, changes = plan_run(cfg, self.run_dir, resume, given, self.args.preset, spell)
            lock = claim_run(self.run_dir, resume, changes, ["homerl.GRPOTrainer.train"],
                             spell)
        except RunRefused as e:
            raise ConfigError(f"GRPOTrainer: {e}") from None
        started = False
        try:
            self._write_inputs(cfg, resume)
            self.trained = True
            with RayConnection(), stop_on_interrupt("homerl") as interrupted:
                started = True
                return self._run(cfg, resume, interrupted)
        finally:
            lock.release()
            if not started and lock.created:
                remove_if_untouched(self.run_dir)

    def _resume(self, asked: bool | str | None) -> bool:
        asked = asked if asked is not None else self.args.resume_from_checkpoint
        if isinstance(asked, (str, os.PathLike)):
            path = os.path.realpath(os.fspath(asked))
            if not path.startswith(os.path.realpath(self.run_dir)):
                raise ConfigError(f"GRPOTrainer: resume_from_checkpoint={asked!r}: homerl "
                                  f"resumes the run in output_dir ({self.run_dir}) from its "
                                  "newest checkpoint; pass True")
            asked = True
        return bool(asked) or (self.trained and is_run(self.run_dir))

    def _write_inputs(self, cfg: Config, resume: bool) -> None:
        """The dataset (a new run only: a resume keeps its data) and the packed functions."""
        if not resume:
            limit = cfg.run.steps * cfg.rollout.prompts_per_step  # what the run can use
            ds = run_data.as_dataset(self.train_dataset, "train_dataset", limit)
            run_data.write_split(ds, self.run_dir, "train")
            if self.eval_dataset is not None:
                ev = run_data.as_dataset(self.eval_dataset, "eval_dataset", limit)
                run_data.write_split(ev, self.run_dir, "eval")
        elif not os.path.exists(cfg.curriculum.data_path):
            raise ConfigError(f"GRPOTrainer: {cfg.curriculum.data_path}: the run's data is "
                              "missing")
        write_reward_code(self.run_dir, self.packed)

    def _run(self, cfg: Config, resume: bool, interrupted: threading.Event) -> TrainOutput:
        self.state = TrainerState(max_steps=cfg.run.steps, logging_steps=self._every())
        control = TrainerControl()
        self._call("on_train_begin", control)
        metrics_file = os.path.join(self.run_dir, "metrics.jsonl")
        before = len(read_jsonl(metrics_file)) if os.path.exists(metrics_file) else 0
        stopped = None
        try:
            summary = run_supervised(
                Trainer(cfg, self.run_dir, resume),
                progress=False if self.args.disable_tqdm else None,
                on_step=lambda k, row: self._on_step(k, row, control, interrupted))
        except RunStopped as e:
            stopped, summary = e, None
        rows = read_jsonl(metrics_file)
        self._call("on_train_end", control)
        if stopped is not None and interrupted.is_set():
            print(f"homerl: {stopped}: checkpoint saved; train() again continues the run",
                  file=sys.stderr)
            raise KeyboardInterrupt
        return _output(rows, rows[before:], summary)

    def _every(self) -> int:
        return max(1, int(self.args.logging_steps or 1))

    def _on_step(self, k: int, row: dict, control: TrainerControl,
                 interrupted: threading.Event) -> str | None:
        """After step k: the callbacks (on_step_end, on_log every logging_steps); a reason
        stops the run there (Ctrl-C, or a callback's control.should_training_stop)."""
        self.state.global_step = k + 1
        self._call("on_step_end", control)
        if (k + 1) % self._every() == 0 or k + 1 == self.state.max_steps:
            logs = {key: v for key, v in row.items() if isinstance(v, (int, float))}
            self.state.log_history.append({**logs, "step": k + 1})
            self._call("on_log", control, logs=logs)
        if interrupted.is_set():
            return "Ctrl-C"
        return "control.should_training_stop" if control.should_training_stop else None

    def _call(self, event: str, control: TrainerControl, **kwargs) -> None:
        for callback in self.callbacks:
            handler = getattr(callback, event, None)
            if handler is not None:
                handler(self.args, self.state, control, **kwargs)

    # ---- the trained policy ----------------------------------------------------------------
    def save_model(self, output_dir: str | None = None) -> str:
        """Copy the trained policy (final/: a peft adapter for LoRA, which
        `peft.AutoPeftModelForCausalLM.from_pretrained` loads, or full weights) to
        `output_dir` (None: it stays in the run's final/); returns its path."""
        final = os.path.join(self.run_dir, "final")
        if not os.path.isdir(final):
            raise ConfigError(f"GRPOTrainer.save_model: {self.run_dir} has no final/ yet: "
                              "train() to the end first (a stopped run resumes with train())")
        if output_dir is None or os.path.realpath(output_dir) == os.path.realpath(final):
            return final
        shutil.copytree(final, output_dir, dirs_exist_ok=True)
        return output_dir


def reward_specs(reward_funcs) -> tuple[list[str], dict[str, bytes]]:
    """(`reward.fn` specs, {name: packed bytes}) of TRL's `reward_funcs`: a callable, a
    `module:function` string or a built-in verifier name, or a list of them. Callables are
    packed by value (`rewards.byvalue`) under their names, made unique (`<lambda>`: reward)."""
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise ConfigError("GRPOTrainer: reward_funcs: give at least one reward function")
    specs, packed = [], {}
    for fn in funcs:
        if isinstance(fn, str):
            if fn not in VERIFIERS and not FN_SPEC.match(fn):
                raise ConfigError(f"GRPOTrainer: reward_funcs: {fn!r} is not "
                                  "package.module:function or a built-in verifier "
                                  f"({', '.join(VERIFIERS)})")
            specs.append(fn)
            continue
        if not callable(fn) or hasattr(fn, "config"):  # a reward model has a config
            raise ConfigError(f"GRPOTrainer: reward_funcs: a {type(fn).__name__} is not a "
                              "reward function (reward models are not supported)")
        base = getattr(fn, "__name__", "")
        base = base if NAME.match(base or "") else "reward"
        name, k = base, 2
        while name in packed:
            name, k = f"{base}_{k}", k + 1
        try:
            packed[name] = pack(fn)
        except TypeError as e:
            raise ConfigError(f"GRPOTrainer: {e}") from None
        specs.append(spec_of(name))
    return specs, packed


def lora_settings(peft_config) -> dict[str, object]:
    """{"lora.field": value} of a `peft.LoraConfig` (None: the preset's LoRA settings)."""
    if peft_config is None:
        return {}
    if type(peft_config).__name__ != "LoraConfig":
        raise ConfigError(f"GRPOTrainer: peft_config: a {type(peft_config).__name__}; homerl "
                          "trains LoRA adapters (peft.LoraConfig) or full weights "
                          "('lora.mode': 'full')")
    for name, default in LORA_DEFAULTS.items():
        if getattr(peft_config, name, default) not in (default, None, False):
            raise ConfigError(f"GRPOTrainer: peft_config.{name}="
                              f"{getattr(peft_config, name)!r} is not supported")
    out: dict[str, object] = {key: getattr(peft_config, f) for f, key in LORA_FIELDS.items()}
    modules = peft_config.target_modules
    if modules and modules != "all-linear":  # all-linear: homerl's default, every projection
        out["lora.target_modules"] = modules if isinstance(modules, str) else ",".join(
            sorted(modules))
    return out


def _output(rows: list[dict], new: list[dict], summary: dict | None) -> TrainOutput:
    """TRL's TrainOutput of a run's metrics rows (`new`: those this train() logged)."""
    losses = [r[M.LOSS_POLICY] for r in new if M.LOSS_POLICY in r]
    wall = summary["wall_s"] if summary else sum(r.get(M.STEP_S, 0.0) for r in new)
    metrics = {"train_runtime": wall, "train_loss": sum(losses) / len(losses) if losses else 0.0,
               "train_steps_per_second": len(new) / wall if wall else 0.0}
    if summary:
        metrics |= {k: v for k, v in summary.items() if isinstance(v, (int, float))}
    step = rows[-1][M.STEP] + 1 if rows else 0
    return TrainOutput(step, metrics["train_loss"], metrics)
