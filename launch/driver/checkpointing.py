"""The run's checkpoints as the driver takes them: periodic ones, the end of the run, restoring.

    ckpt = Checkpointer(cfg, run_dir, learner)        # the Trainer owns one
    ckpt.save(step, state, writer)     every run.checkpoint_every steps, and on RUN_DIR/STOP
    ckpt.save_end(steps, state, writer, trained)      the last step's checkpoint, then final/
    state, version = ckpt.restore(path)               --resume, or after the learner died

A checkpoint is the learner's state (its `save`) and the driver's (`DriverState`: the
rollouts already generated for later steps, the curriculum, the row logged after it), written
to a temporary directory and renamed (launch/rundir/checkpoints.py). The caller hands the
driver's state as a function, called inside the write, so a failure while gathering it is
handled as one of the write. A periodic checkpoint that cannot be written (full disk,
unwritable directory) leaves the previous one and follows run.checkpoint_fail_policy; the end
of a run is saved like any checkpoint (so `--resume RUN_DIR --steps N+k` goes on from step N)
and final/ is written to a temp dir and renamed; if either fails the run stops with one line
naming the last good checkpoint.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable

import ray

from common import durable
from common.state_io import CheckpointError
from launch.rundir import checkpoints
from launch.rundir.checkpoints import DriverState

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


class Checkpointer:
    """Writes and restores one run's checkpoints through its learner actor."""

    def __init__(self, cfg, run_dir: str, learner):
        self.cfg, self.run_dir, self.learner = cfg, run_dir, learner
        self.failures = 0
        """periodic checkpoints that could not be written (checkpoint_fail_policy=continue)"""

    def save(self, step: int, state: Callable[[], DriverState], writer) -> float:
        """A periodic checkpoint of `step`; returns its seconds. A write that fails leaves the
        previous checkpoint intact and follows run.checkpoint_fail_policy."""
        t0 = time.perf_counter()
        try:
            self.write(step, state, writer)
        except (OSError, CheckpointError, ray.exceptions.RayTaskError) as err:
            cause = write_failure(err)
            shutil.rmtree(checkpoints.checkpoint_tmp_path(self.run_dir, step), ignore_errors=True)
            self.failures += 1
            msg = f"checkpoint of step {step} not written ({_one_line(cause)}); the previous " \
                  "one is kept"
            if self.cfg.run.checkpoint_fail_policy == "stop":
                raise CheckpointWriteError(msg) from None
            log.warning("%s; going on (run.checkpoint_fail_policy=continue)", msg)
        return time.perf_counter() - t0

    def write(self, step: int, state: Callable[[], DriverState], writer) -> None:
        """The learner's state and `state()`, atomically; the run's rows before it are on disk
        first (`writer.sync`)."""
        tmp = checkpoints.checkpoint_tmp(self.run_dir, step)
        ray.get(self.learner.save.remote(tmp))
        driver = state()
        writer.sync()
        checkpoints.commit_checkpoint(self.run_dir, tmp, step, driver,
                                      self.cfg.run.keep_checkpoints)

    def save_end(self, steps: int, state: Callable[[], DriverState], writer,
                 trained: bool) -> str:
        """The last step's resumable checkpoint (unless this life `trained` nothing: then the
        one it resumed from is that state), then final/; returns final/'s path. A failure of
        either is a CheckpointWriteError (one line) naming the last good checkpoint."""
        try:
            if trained:
                self.write(steps, state, writer)
            return self.write_final()
        except (OSError, CheckpointError, ray.exceptions.RayTaskError) as err:
            cause = write_failure(err)
            shutil.rmtree(checkpoints.checkpoint_tmp_path(self.run_dir, steps),
                          ignore_errors=True)
            good = checkpoints.list_checkpoints(self.run_dir)
            last = f"the last good checkpoint is {good[-1]}" if good else "no checkpoint is kept"
            raise CheckpointWriteError(f"the end of the run (step {steps}) was not saved "
                                       f"({_one_line(cause)}); {last}") from None

    def write_final(self) -> str:
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

    def restore(self, ckpt: str) -> tuple[DriverState, int]:
        """(the driver's state, the learner's weights version) of checkpoint `ckpt`, the
        learner's part loaded into the learner actor; a checkpoint of another model is a
        one-line CheckpointError."""
        state = checkpoints.load_driver_state(ckpt)
        try:
            version = ray.get(self.learner.load.remote(ckpt))
        except ray.exceptions.RayTaskError as e:  # e.g. the checkpoint of another model
            last = str(e).strip().splitlines()[-1]
            raise CheckpointError(last.split("CheckpointError: ", 1)[-1]) from None
        log.info("resumed from %s at step %d", ckpt, state.step)
        return state, version
