"""The end of a run, with real Ray actors: it is a resumable checkpoint that --resume extends;
a failure to save it is one line naming the last good checkpoint; a driver dying between a
checkpoint and its step's metrics row loses no row."""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from common.presets import get_preset
from launch.rundir.checkpoints import checkpoint_tmp, list_checkpoints
from launch.rundir.writer import read_jsonl


# ---- 8. the end of a run is a resumable checkpoint (real Ray actors) ---------------------------
def resume_to_the_end(cfg, run_dir: str) -> int:
    """Resume the run in `run_dir` and finish it; the step it resumed at."""
    from launch.driver.trainer import Trainer

    resumed = Trainer(cfg, run_dir, resume=True)
    try:
        start = resumed.start
        resumed.run()
    finally:
        resumed.shutdown()
    return start


def test_the_end_of_a_run_is_a_checkpoint_that_resume_extends(run_job, reference_run, tmp_path):
    cfg = get_preset("tiny")
    # 2 steps, no checkpoint but the end: test_faults' damaged-checkpoint reference run, copied
    cfg.run.steps, cfg.run.checkpoint_every = 2, 0
    shutil.copytree(reference_run(cfg), tmp_path, dirs_exist_ok=True)
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path))] == [
        "ckpt-000002"]
    assert (tmp_path / "final" / "homerl.json").exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith((".tmp-", ".trash-"))]
    cfg.run.steps = 4
    summary, rows, _ = run_job(cfg, tmp_path, resume=True)
    assert [r["step"] for r in rows] == list(range(4)) and summary["steps"] == 4
    assert [r["weights/version"] for r in rows] == [1, 2, 3, 4]  # went on from version 2
    assert list_checkpoints(str(tmp_path))[-1].endswith("ckpt-000004")


def test_a_failed_end_save_is_one_line_naming_the_last_good_checkpoint(ray_cluster, tmp_path):
    from launch.driver.checkpointing import Checkpointer, CheckpointWriteError
    from launch.driver.trainer import Trainer

    class FullDiskAtTheEndCheckpoints(Checkpointer):
        def write(self, step, state, writer):
            if step == self.cfg.run.steps:
                checkpoint_tmp(self.run_dir, step)
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            super().write(step, state, writer)

    class FullDiskAtTheEnd(Trainer):
        checkpointer_class = FullDiskAtTheEndCheckpoints

    cfg = get_preset("tiny")
    cfg.run.steps, cfg.run.checkpoint_every = 4, 2
    trainer = FullDiskAtTheEnd(cfg, str(tmp_path))
    try:
        with pytest.raises(CheckpointWriteError) as err:
            trainer.run()
    finally:
        trainer.shutdown()
    assert str(err.value) == ("the end of the run (step 4) was not saved (OSError: [Errno 28] "
                              "No space left on device (injected)); the last good checkpoint "
                              f"is {tmp_path / 'ckpt-000002'}")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
    assert resume_to_the_end(cfg, str(tmp_path)) == 2
    assert [r["step"] for r in read_jsonl(str(tmp_path / "metrics.jsonl"))] == [0, 1, 2,
                                                                                       3]
    assert list_checkpoints(str(tmp_path))[-1].endswith("ckpt-000004")


def test_a_crash_between_a_checkpoint_and_its_steps_row_loses_no_row(ray_cluster, tmp_path):
    """Step k's row is logged after the checkpoint of step k+1: a driver dying in between
    leaves that row only in the checkpoint, and the resume logs it."""
    from launch.driver.trainer import Trainer

    class DiesAfterTheCheckpoint(Trainer):
        def checkpoint(self, step):
            took = super().checkpoint(step)
            if step == 2:
                raise KeyboardInterrupt  # the driver is gone before it logs step 1's row
            return took

    cfg = get_preset("tiny")
    cfg.run.steps, cfg.run.checkpoint_every = 3, 2
    trainer = DiesAfterTheCheckpoint(cfg, str(tmp_path))
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.run()
    finally:
        trainer.shutdown()
    assert [r["step"] for r in read_jsonl(str(tmp_path / "metrics.jsonl"))] == [0]
    assert resume_to_the_end(cfg, str(tmp_path)) == 2
    rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[1]["time/step_s"] > 0
