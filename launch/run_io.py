"""Run directory I/O: config, metrics, samples, wandb, plot, atomic checkpoints.

    RUN_DIR/config.json      the resolved Config
    RUN_DIR/metrics.jsonl    one JSON object per step, namespaced keys (reward/mean, time/step_s)
    RUN_DIR/samples.jsonl    a few completions with their rewards every k steps
    RUN_DIR/summary.json     final figures
    RUN_DIR/curves.png       reward and accuracy per step
    RUN_DIR/ckpt-000020/     checkpoints (written to .tmp-*, then renamed: never half-written):
                             learner.{safetensors,json} and driver.{safetensors,json}, plain
                             state (common/state_io.py), no pickle
    RUN_DIR/final/           a checkpoint transformers/peft can load
    RUN_DIR/STOP             asks a running driver to checkpoint and stop after its current step
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field

from common.state_io import (
    CheckpointError,
    check_state,
    load_state,
    rollout_from_state,
    rollout_to_state,
    save_state,
)
from common.types import RolloutBatch, RolloutSummary

log = logging.getLogger("homerl.train")

CKPT_PREFIX = "ckpt-"
DRIVER = "driver"
"""file stem of the driver's part of a checkpoint"""


@dataclass
class PendingStep:
    """A step whose rollout was generated before the checkpoint: kept so resume repeats it."""

    stage: int
    prompts: list[dict]
    batches: list[RolloutBatch]
    """the shares, in order"""


@dataclass
class DriverState:
    """Everything the driver needs to resume (the learner saves its own part)."""

    step: int
    """the next step to train"""
    restarts: int
    """rollout workers replaced so far"""
    curriculum: dict
    """Curriculum.state_dict()"""
    trained_stage: int
    """curriculum stage of the last trained step"""
    pending: dict[int, PendingStep] = field(default_factory=dict)


STOP_FILE = "STOP"


def request_stop(run_dir: str) -> None:
    """Ask the run's driver to checkpoint and stop after the step it is on (`touch RUN_DIR/STOP`
    does the same); `launch.train --resume RUN_DIR` goes on from there."""
    with open(os.path.join(run_dir, STOP_FILE), "w") as f:
        f.write(time.strftime("%Y-%m-%d %H:%M:%S\n"))


def stop_requested(run_dir: str) -> bool:
    return os.path.exists(os.path.join(run_dir, STOP_FILE))


def clear_stop(run_dir: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(run_dir, STOP_FILE))


def write_json(path: str, obj) -> None:
    """Write `path` whole or not at all (temp file + rename): the web app reads a run's
    config.json while its driver rewrites it, and must never see it half-written."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def default_run_dir() -> str:
    return os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))


class RunWriter:
    """Appends metrics and samples; optionally mirrors metrics to wandb."""

    def __init__(self, run_dir: str, cfg_dict: dict, resume_step: int | None = None):
        self.dir = run_dir
        os.makedirs(run_dir, exist_ok=True)
        write_json(os.path.join(run_dir, "config.json"), cfg_dict)
        if resume_step is not None:  # drop rows of steps the resumed run will redo
            for name in ("metrics.jsonl", "samples.jsonl"):
                _truncate_jsonl(os.path.join(run_dir, name), resume_step)
        self.wandb = _init_wandb(cfg_dict, run_dir, resume_step is not None)
        self.metrics_file = _Appender(os.path.join(run_dir, "metrics.jsonl"))
        self.samples_file = _Appender(os.path.join(run_dir, "samples.jsonl"))
        self.wandb_error = ""  # why wandb was dropped mid-run, if it was

    def log(self, row: dict) -> None:
        """Append a metrics row. A row that cannot be written (full disk) is kept and written
        with the next one that can, so no row is lost and none is half-written."""
        self.metrics_file.append([row])
        self._to_wandb(lambda w: w.log(row, step=row["step"]))

    def samples(self, step: int, rows: list[dict]) -> None:
        """Append sample completions, kept and written later like metrics on a full disk."""
        self.samples_file.append([{"step": step, **r} for r in rows])

    def summary(self, data: dict) -> None:
        with open(os.path.join(self.dir, "summary.json"), "w") as f:
            json.dump(data, f, indent=2)
        self._to_wandb(lambda w: w.summary.update(data))
        self.close()

    def close(self) -> None:
        """Finish the wandb run (idempotent)."""
        self._to_wandb(lambda w: w.finish())
        self.wandb = None

    def _to_wandb(self, call) -> None:
        """wandb mirrors metrics.jsonl: if it fails (its service died, its disk is full) the
        run goes on without it, with one warning, instead of ending."""
        if self.wandb is None:
            return
        try:
            call(self.wandb)
        except Exception as err:
            self.wandb, self.wandb_error = None, f"{type(err).__name__}: {err}"
            log.warning("wandb failed (%s); wandb is off for the rest of this run, "
                        "metrics.jsonl keeps every row", self.wandb_error)
            _detach_wandb()

    def metrics(self) -> list[dict]:
        return read_jsonl(os.path.join(self.dir, "metrics.jsonl"))


class _Appender:
    """Appends JSON lines to one file; rows an OSError (full disk) refused are kept and written
    before the next ones, and a partly written line is cut off, so a reader never sees half a
    row and no row is lost while the process lives."""

    def __init__(self, path: str):
        self.path = path
        self.unwritten: list[dict] = []

    def append(self, rows: list[dict]) -> None:
        self.unwritten.extend(rows)
        text = "".join(json.dumps(r) + "\n" for r in self.unwritten)
        size = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        try:
            with open(self.path, "a") as f:
                f.write(text)
                f.flush()
            self.unwritten.clear()
        except OSError as err:
            with contextlib.suppress(OSError):
                os.truncate(self.path, size)  # drop a partial line
            log.warning("%s: %d row(s) not written yet (%s); kept for the next write",
                        os.path.basename(self.path), len(self.unwritten), err)


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _truncate_jsonl(path: str, step: int) -> None:
    rows = [r for r in read_jsonl(path) if r.get("step", 0) < step]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def _init_wandb(cfg_dict: dict, run_dir: str, resume: bool):
    project = cfg_dict["run"]["wandb_project"]
    if not project:
        return None
    import wandb

    mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return wandb.init(project=project, dir=run_dir, config=cfg_dict, mode=mode,
                      name=os.path.basename(os.path.normpath(run_dir)),
                      resume="allow" if resume else None)


def _detach_wandb() -> None:
    """Unhook a failed wandb from this process: its import hooks would otherwise report every
    later import of torch, transformers, ... to the dead service and raise in that import."""
    import wandb

    try:
        wandb.teardown()  # removes the hooks first; then fails on the dead connection
    except Exception:
        pass


# ---- checkpoints ---------------------------------------------------------------------------
def checkpoint_tmp_path(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, f".tmp-{CKPT_PREFIX}{step:06d}-{os.getpid()}")


def checkpoint_tmp(run_dir: str, step: int) -> str:
    """A fresh temp dir to fill; `commit_checkpoint` renames it into place."""
    path = checkpoint_tmp_path(run_dir, step)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def commit_checkpoint(run_dir: str, tmp: str, step: int, state: DriverState, keep: int) -> str:
    """Write the driver state last, verify what was written (headers and sizes), rename
    atomically, then prune old checkpoints. A failed write leaves the previous ones intact."""
    save_driver_state(tmp, state)
    check_checkpoint(tmp)
    with open(os.path.join(tmp, "COMPLETE"), "w") as f:
        f.write(str(step))
    final = os.path.join(run_dir, f"{CKPT_PREFIX}{step:06d}")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: str) -> list[str]:
    """Complete checkpoints, oldest first (temp dirs and ones without COMPLETE are ignored)."""
    if not os.path.isdir(run_dir):
        return []
    names = sorted(n for n in os.listdir(run_dir) if n.startswith(CKPT_PREFIX))
    paths = [os.path.join(run_dir, n) for n in names]
    return [p for p in paths if os.path.exists(os.path.join(p, "COMPLETE"))]


def save_driver_state(directory: str, state: DriverState) -> None:
    tensors, pending = {}, {}
    for j, p in state.pending.items():
        shares = []
        for i, batch in enumerate(p.batches):
            t, meta = rollout_to_state(f"pending.{j}.{i}", batch)
            tensors.update(t)
            shares.append(meta)
        pending[str(j)] = {"stage": p.stage, "prompts": p.prompts, "shares": shares}
    meta = {"step": state.step, "restarts": state.restarts, "curriculum": state.curriculum,
            "trained_stage": state.trained_stage, "pending": pending}
    save_state(directory, DRIVER, tensors, meta)


def check_checkpoint(ckpt: str) -> None:
    """Refuse an unreadable checkpoint in one line before any actor starts (headers only)."""
    for name in (DRIVER, "learner"):
        check_state(ckpt, name)


def newest_readable(ckpts: list[str]) -> str | None:
    """The newest of `ckpts` (oldest first) that `check_checkpoint` accepts. A damaged newer
    one is skipped with a warning naming it; when none is readable, the newest one's
    CheckpointError (one line). None for no checkpoints."""
    first = None
    for ckpt in reversed(ckpts):
        try:
            check_checkpoint(ckpt)
        except CheckpointError as err:
            first = first or err
            continue
        if first is not None:
            log.warning("%s; resuming from the previous checkpoint, %s", first, ckpt)
        return ckpt
    if first is not None:
        raise first
    return None


def load_driver_state(ckpt: str) -> DriverState:
    """The driver's state of a checkpoint; a CheckpointError (one line) if it is unreadable."""
    tensors, meta = load_state(ckpt, DRIVER, numpy=True)
    pending = {int(j): PendingStep(p["stage"], p["prompts"],
                                   [rollout_from_state(f"pending.{j}.{i}", tensors, m)
                                    for i, m in enumerate(p["shares"])])
               for j, p in meta["pending"].items()}
    return DriverState(meta["step"], meta["restarts"], meta["curriculum"],
                       meta["trained_stage"], pending)


def plot_curves(run_dir: str, rows: list[dict]) -> str | None:
    """curves.png: reward/mean and reward/correct per step (matplotlib, headless)."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("reward/mean", "reward"), ("reward/correct", "accuracy (train)"),
                       ("reward/format", "format")):
        ax.plot(steps, [r.get(key, float("nan")) for r in rows], label=label)
    ax.set_xlabel("step")
    ax.set_title(os.path.basename(os.path.normpath(run_dir)))
    ax.legend()
    ax.grid(alpha=0.3)
    path = os.path.join(run_dir, "curves.png")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def sample_rows(summary: RolloutSummary, prompts: list[dict]) -> list[dict]:
    """samples.jsonl rows: the completions whose text the workers sent back (with reward.fn,
    each function's reward too; an unscorable completion's reward is null)."""
    rows = []
    for i, text in zip(summary.sample_index or range(len(summary.sample_texts)),
                       summary.sample_texts):
        p = prompts[summary.prompt_index[i]]
        reward = float(summary.rewards[i])
        rows.append({"question": p["question"], "answer": p["answer"], "completion": text,
                     "reward": None if math.isnan(reward) else reward,
                     "correct": float(summary.correct[i]), "error": summary.reward_errors[i]})
        if summary.fn_scores:
            rows[-1]["fn"] = {name: scores[i] for name, scores in summary.fn_scores.items()}
    return rows
