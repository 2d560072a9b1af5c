"""The training job: rollout actors + one learner actor, GRPO, on a local or existing Ray cluster.

Local run (starts a Ray cluster of its own):

    python -m launch.train --preset tiny --steps 4 --run-dir runs/tiny
    python -m launch.train --resume runs/tiny --steps 8      # continue from the last checkpoint

As a Ray job (the dashboard at http://127.0.0.1:8265 shows actors `learner`, `rollout-0`, ...):

    ray get-auth-token --generate >/dev/null && chmod 600 ~/.ray/auth_token   # once per machine
    export RAY_AUTH_MODE=token
    ray start --head --dashboard-host 127.0.0.1
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python -m launch.train --preset cpu-demo --run-dir $PWD/runs/demo

This module is the entry point: it opens the run directory (launch/cli.py), runs the driver
(launch/driver/trainer.py) under supervision (a dead learner is restored from its checkpoint)
and turns every user error into one line and an exit status: 0 done or stopped on request
(RUN_DIR/STOP, Ctrl-C, SIGTERM as `ray job stop`, `kill PID` or `docker stop` send it: after
the step in flight, with a checkpoint), 1 stopped with its checkpoints kept, 2 refused before
training, 130 a second Ctrl-C or SIGTERM, or a SIGTERM that also ended the local cluster
(stopped at once, keeping the last checkpoint).
"""

from __future__ import annotations

import json
import logging
import sys

from common.config import Config
from launch.cli import open_run
from launch.driver.errors import REFUSED, STOPPED
from launch.driver.placement import RayConnection
from launch.driver.supervise import run_supervised, stop_on_interrupt
from launch.driver.trainer import RunStopped, Trainer
from launch.rundir.ownership import remove_if_untouched, trained_files


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg, run_dir, resume, lock, _ = open_run(argv)  # one line and exit 2 on a user error
    rc = 1
    # a caller's own cluster (main() called in-process after ray.init) is kept
    with RayConnection() as conn:
        try:
            rc, error = _drive(cfg, run_dir, resume)
            if error:
                # Ray forwards a failed actor's traceback to this console a moment after the
                # driver has seen the actor die; leaving the cluster first drops what has not
                # arrived, so it cannot bury the line (the actor's log keeps it)
                conn.leave()
                print(error, file=sys.stderr)
            return rc
        finally:
            lock.release()
            if rc in (2, 130) and lock.created:  # refused or interrupted before training:
                remove_if_untouched(run_dir)      # no directory behind (one that trained stays)


def _drive(cfg: Config, run_dir: str, resume: bool) -> tuple[int, str | None]:
    """(exit status, the one-line error or None)."""
    try:
        trainer = Trainer(cfg, run_dir, resume)
    except REFUSED as e:
        return 2, f"launch.train: error: {e}"
    except KeyboardInterrupt:  # Ctrl-C while the actors start (leaving Ray ends them)
        return 130, "launch.train: interrupted before the first step"
    resume_hint = f"resume with --resume {run_dir} (from its last checkpoint)"
    try:
        with stop_on_interrupt("launch.train", sigterm=True, resume=resume_hint) as interrupted:
            summary = run_supervised(trainer, on_step=interrupted.on_step)
    except RunStopped as e:
        print(f"launch.train: {e}; resume with --resume {run_dir}")
        return 0, None
    except KeyboardInterrupt:  # the second Ctrl-C or SIGTERM: no checkpoint of this step
        return 130, f"launch.train: interrupted; {resume_hint}"
    except STOPPED as e:  # stop, keep the run
        if not trained_files(run_dir):
            return 1, f"launch.train: error: {e}; no step was trained"
        return 1, f"launch.train: error: {e}; checkpoints are kept: resume with --resume {run_dir}"
    print(json.dumps(summary, indent=2))
    print(f"run directory: {run_dir}")
    return 0, None


if __name__ == "__main__":
    sys.exit(main())
