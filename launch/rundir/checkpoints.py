"""Resumable checkpoints of a run: written whole, durable, pruned only once the new one is safe.

    RUN_DIR/ckpt-000020/   learner.{safetensors,json}, driver.{safetensors,json}, COMPLETE
    RUN_DIR/.tmp-ckpt-*    a checkpoint being written (never listed, never resumed from)
    RUN_DIR/.trash-*       an old checkpoint being removed (never listed)

The order of a write (`commit_checkpoint`), each step a cut point of common/durable.py:

1. the learner (in its actor) and then the driver write their files into the temp dir, each
   file fsync'ed; what was written is verified (headers and sizes);
2. COMPLETE is written and fsync'ed, then the temp dir itself;
3. the temp dir is renamed to ckpt-NNNNNN and the run dir fsync'ed: the checkpoint is on disk;
4. only then are older ones beyond run.keep_checkpoints renamed to .trash-* (leaving the list
   at once) and deleted.

A crash or power cut at any point leaves the previous checkpoint or the new one whole, so even
`--run.keep_checkpoints 1` always has a whole checkpoint on disk.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field

from common import durable
from common.state_io import (
    CheckpointError,
    check_state,
    load_state,
    rollout_from_state,
    rollout_to_state,
    save_state,
)
from common.types import RolloutBatch

log = logging.getLogger("homerl.train")

CKPT_PREFIX = "ckpt-"
DRIVER = "driver"
"""file stem of the driver's part of a checkpoint"""
TRASH = ".trash-"


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
    rows: list[dict] = field(default_factory=list)
    """metrics rows of earlier steps not yet in metrics.jsonl when the checkpoint was written"""


def checkpoint_path(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, f"{CKPT_PREFIX}{step:06d}")


def checkpoint_step(ckpt: str) -> int:
    """The step a checkpoint resumes at (from its name, ckpt-NNNNNN)."""
    return int(os.path.basename(os.path.normpath(ckpt))[len(CKPT_PREFIX):])


def checkpoint_tmp_path(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, f".tmp-{CKPT_PREFIX}{step:06d}-{os.getpid()}")


def checkpoint_tmp(run_dir: str, step: int) -> str:
    """A fresh temp dir to fill; `commit_checkpoint` renames it into place."""
    path = checkpoint_tmp_path(run_dir, step)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def commit_checkpoint(run_dir: str, tmp: str, step: int, state: DriverState, keep: int) -> str:
    """Write the driver state last, verify what was written, make it durable, rename it into
    place, then prune old checkpoints (the module's docstring gives the order). A failed write
    leaves the previous ones intact."""
    save_driver_state(tmp, state)
    check_checkpoint(tmp)  # each file was fsync'ed as it was written (save_state)
    complete = os.path.join(tmp, "COMPLETE")
    with open(complete, "w") as f:
        f.write(str(step))
    durable.cut("write", complete)
    durable.fsync_file(complete)
    durable.fsync_dir(tmp)  # its entries (the learner's files too) are on disk
    final = checkpoint_path(run_dir, step)
    if os.path.exists(final):  # a damaged or unfinished one of the same step, never resumed
        discard(run_dir, final)
    durable.rename(tmp, final)
    durable.fsync_dir(run_dir)  # the new checkpoint is on disk: older ones may go
    for old in list_checkpoints(run_dir)[:-keep]:
        if old != final:
            discard(run_dir, old)
    return final


def discard(run_dir: str, path: str) -> None:
    """Remove a checkpoint: renamed out of the list first (durably), then deleted, so a crash
    midway never leaves a listed half-deleted one."""
    trash = os.path.join(run_dir, f"{TRASH}{os.path.basename(path)}-{os.getpid()}")
    durable.remove_tree(trash)
    durable.rename(path, trash)
    durable.fsync_dir(run_dir)
    durable.remove_tree(trash)


def remove_leftovers(run_dir: str) -> None:
    """Delete what killed writers left behind (.tmp-ckpt-* and .trash-* dirs); call it while
    holding the run's lock (launch/rundir/ownership.py), when no other process writes them."""
    if not os.path.isdir(run_dir):
        return
    for name in os.listdir(run_dir):
        if name.startswith((TRASH, f".tmp-{CKPT_PREFIX}", ".tmp-final")):
            shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)


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
            "trained_stage": state.trained_stage, "pending": pending, "rows": state.rows}
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
                       meta["trained_stage"], pending, meta.get("rows", []))
