"""The Trainer's checkpoints: periodic ones, the end of the run, and restoring one.

    Trainer.checkpoint(step)    every run.checkpoint_every steps, and on RUN_DIR/STOP
    Trainer.save_end()          the last step's resumable checkpoint, then final/
    Trainer._restore(ckpt)      --resume, or after the learner died

The end of a run is saved like any checkpoint (so `--resume RUN_DIR --steps N+k` goes on from
step N) and final/ is written to a temp dir and renamed; if either fails the run stops with one
line naming the last good checkpoint.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

import ray

from common import durable
from common.state_io import CheckpointError
from common.types import RolloutSummary
from launch import checkpoints, run_io
from launch.pool import Rollout, Slot

log = logging.getLogger("homerl.train")


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written and run.checkpoint_fail_policy is stop, or the end of
    the run could not be saved."""


def write_failure(err: BaseException) -> BaseException:
    """The OSError or CheckpointError behind a failed write (a RayTaskError carries the actor's
    exception); anything else is re-raised: a bug, not the disk."""
    cause = getattr(err, "cause", err)
    if not isinstance(cause, (OSError, CheckpointError)):
        raise err
    return cause


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


class CheckpointingMixin:
    """Checkpoint methods of launch.train.Trainer (it supplies cfg, run_dir, learner, pool,
    pending, curriculum, start and the rest)."""

    def checkpoint(self, step: int) -> float:
        """Learner state + the rollouts already generated for later steps, atomically. A write
        that fails (full disk, unwritable directory) leaves the previous checkpoint intact and
        follows run.checkpoint_fail_policy."""
        t0 = time.perf_counter()
        try:
            self._write_checkpoint(step)
        except (OSError, CheckpointError, ray.exceptions.RayTaskError) as err:
            cause = write_failure(err)
            shutil.rmtree(run_io.checkpoint_tmp_path(self.run_dir, step), ignore_errors=True)
            self.checkpoint_failures += 1
            msg = f"checkpoint of step {step} not written ({_one_line(cause)}); the previous " \
                  "one is kept"
            if self.cfg.run.checkpoint_fail_policy == "stop":
                raise CheckpointWriteError(msg) from None
            log.warning("%s; going on (run.checkpoint_fail_policy=continue)", msg)
        return time.perf_counter() - t0

    def _write_checkpoint(self, step: int) -> None:
        tmp = run_io.checkpoint_tmp(self.run_dir, step)
        ray.get(self.learner.save.remote(tmp))
        pending = {}
        for j in sorted(self.pending):
            slot = self._rollout(j)
            self.pending[j] = slot
            pending[j] = run_io.PendingStep(slot.stage, slot.prompts,
                                            ray.get(slot.work.batches))
        unlogged = getattr(self, "unlogged", None)  # the row of the step before, logged after
        state = run_io.DriverState(step, self.pool.restarts, self.curriculum.state_dict(),
                                   self.trained_stage, pending, [unlogged] if unlogged else [])
        self.writer.sync()  # the rows before the checkpoint are on disk before it is
        run_io.commit_checkpoint(self.run_dir, tmp, step, state, self.cfg.run.keep_checkpoints)

    def save_end(self) -> str:
        """The last step's resumable checkpoint (unless this life trained nothing: then the one
        it resumed from is that state), then final/; returns final/'s path. A failure of either
        is a CheckpointWriteError (one line) naming the last good checkpoint."""
        steps = self.cfg.run.steps
        try:
            if self.start < steps:
                self._write_checkpoint(steps)
            return self._write_final()
        except (OSError, CheckpointError, ray.exceptions.RayTaskError) as err:
            cause = write_failure(err)
            shutil.rmtree(run_io.checkpoint_tmp_path(self.run_dir, steps), ignore_errors=True)
            good = run_io.list_checkpoints(self.run_dir)
            last = f"the last good checkpoint is {good[-1]}" if good else "no checkpoint is kept"
            raise CheckpointWriteError(f"the end of the run (step {steps}) was not saved "
                                       f"({_one_line(cause)}); {last}") from None

    def _write_final(self) -> str:
        """final/ (a checkpoint transformers/peft load), written to a temp dir, fsync'ed and
        renamed into place: never half-written."""
        final = os.path.join(self.run_dir, "final")
        tmp = os.path.join(self.run_dir, f".tmp-final-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            ray.get(self.learner.save_final.remote(tmp))
            durable.fsync_tree(tmp)
            if os.path.exists(final):
                checkpoints.discard(self.run_dir, final)
            durable.rename(tmp, final)
            durable.fsync_dir(self.run_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def _restore(self, ckpt: str) -> None:
        state = run_io.load_driver_state(ckpt)
        try:
            version = ray.get(self.learner.load.remote(ckpt))
        except ray.exceptions.RayTaskError as e:  # e.g. the checkpoint of another model
            last = str(e).strip().splitlines()[-1]
            raise CheckpointError(last.split("CheckpointError: ", 1)[-1]) from None
        if version > 0:
            self.pool.push(self.learner.export.remote(), version)
        self.learner_version = version
        self.start = state.step
        self.pool.restarts = state.restarts
        for j, p in state.pending.items():  # rollouts generated before the checkpoint
            summary = RolloutSummary.concat([b.summary() for b in p.batches])
            self.pending[j] = Slot(p.stage, p.prompts,
                                   Rollout(summary, [ray.put(b) for b in p.batches]))
        self.curriculum.load_state_dict(state.curriculum)
        self.trained_stage = state.trained_stage
        self.restored_rows = state.rows
        log.info("resumed from %s at step %d", ckpt, self.start)

    def log_restored_rows(self) -> None:
        """The metrics row a checkpoint holds (a step's row is logged just after the checkpoint
        that follows it), logged if metrics.jsonl lacks it: a crash between the two loses none."""
        rows = getattr(self, "restored_rows", [])
        have = {r.get("step") for r in self.writer.metrics()} if rows else set()
        for row in rows:
            if row.get("step") not in have:
                self.writer.log(row)
