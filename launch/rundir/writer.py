"""The run directory's files: config, metrics, samples, summary, wandb, the plot, STOP.

    RUN_DIR/config.json      the resolved Config
    RUN_DIR/metrics.jsonl    one JSON object per step, namespaced keys (reward/mean, time/step_s)
    RUN_DIR/samples.jsonl    a few completions with their rewards every k steps
    RUN_DIR/summary.json     final figures
    RUN_DIR/curves.png       reward and accuracy per step
    RUN_DIR/ckpt-000020/     checkpoints (written to .tmp-*, fsync'ed, then renamed: never
                             half-written): learner.{safetensors,json} and
                             driver.{safetensors,json}, plain state (common/state_io.py), no
                             pickle; the last step's too, so a finished run can be extended
    RUN_DIR/final/           a checkpoint transformers/peft can load (written to .tmp-final-*,
                             then renamed)
    RUN_DIR/.homerl-run, RUN_DIR/.homerl-lock, RUN_DIR/config-history.jsonl   ownership.py
    RUN_DIR/STOP             asks a running driver to checkpoint and stop after its current step
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time

from common import durable
from common.types import RolloutSummary
from launch.rundir.ownership import mark_run

log = logging.getLogger("homerl.train")

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
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        durable.fsync_dir(os.path.dirname(path) or ".")
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def default_run_dir() -> str:
    return os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))


class RunWriter:
    """Appends metrics and samples; optionally mirrors metrics to wandb."""

    def __init__(self, run_dir: str, cfg_dict: dict, resume_step: int | None = None):
        self.dir = run_dir
        mark_run(run_dir)  # a run of this project from now on (launch/rundir/ownership.py)
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

    def sync(self) -> None:
        """fsync metrics.jsonl and samples.jsonl (before a checkpoint that follows their rows)."""
        for path in (self.metrics_file.path, self.samples_file.path):
            if os.path.exists(path):
                durable.fsync_file(path)

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
    """The whole rows of a JSON-lines file; a line cut short (a crash or a full disk mid-write)
    or otherwise unreadable is left out (`scan_jsonl` says which)."""
    return scan_jsonl(path)[0]


def scan_jsonl(path: str) -> tuple[list[dict], list[int]]:
    """(whole rows, numbers of the lines that are not a JSON object) of a JSON-lines file."""
    if not os.path.exists(path):
        return [], []
    rows, bad = [], []
    with open(path, errors="replace") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            (rows.append(row) if isinstance(row, dict) else bad.append(i))
    return rows, bad


def _truncate_jsonl(path: str, step: int) -> None:
    """Keep the rows of steps before `step` (a resume redoes the others), replacing the file
    durably (temp file, fsync, rename): a crash midway leaves the old file whole. A torn last
    line (the previous driver died mid-write) is dropped with one warning."""
    if not os.path.exists(path):
        return
    rows, bad = scan_jsonl(path)
    if bad:
        with open(path, errors="replace") as f:  # the number of its last non-blank line
            last = max((i for i, line in enumerate(f, 1) if line.strip()), default=0)
        torn = "a torn last line" if bad == [last] else f"unreadable line(s) {bad}"
        log.warning("%s: dropped %s (a write cut short by a crash or a full disk); its %d whole "
                    "row(s) are kept", path, torn, len(rows))
    rows = [r for r in rows if r.get("step", 0) < step]
    durable.write_file(path, "".join(json.dumps(r) + "\n" for r in rows))


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
