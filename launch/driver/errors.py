"""The errors a run reports to its user in one line, by what they leave behind.

    try:
        trainer = Trainer(cfg, run_dir)        # REFUSED: exit 2, nothing trained
        run_supervised(trainer)                # STOPPED: exit 1, checkpoints kept for --resume
    except REFUSED as e: ...

launch.train and launch.demo turn these into their one-line errors; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

from common.config import ConfigError
from common.device import DeviceError
from common.models import ModelNotFoundError
from common.state_io import CheckpointError
from launch.driver.checkpointing import CheckpointWriteError
from launch.driver.placement import CapacityLostError
from launch.driver.pool import WeightSyncError
from launch.driver.roles import ActorStartError
from launch.driver.supervise import LearnerLostError
from tasks import DatasetError

REFUSED = (ConfigError, ModelNotFoundError, DatasetError, CheckpointError, DeviceError,
           ActorStartError)
"""what stops a run before its first step: a config, model, dataset, checkpoint or device it
cannot use, or an actor that cannot start"""

STOPPED = (WeightSyncError, LearnerLostError, CheckpointWriteError, CapacityLostError,
           ActorStartError, DatasetError)
"""what stops a run part way: weights that cannot reach the workers, a learner that keeps
dying, a disk that cannot take a checkpoint, a lost node, replacement actors that cannot
start, a step whose every prompt was refused"""
