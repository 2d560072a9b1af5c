"""The launch layer: what turns a config into a run, and what users run.

* `launch/train.py`: `python -m launch.train`, the Ray job entry point; `launch/cli.py`: the
  command line every entry point shares; `launch/console.py`: a quiet console for long jobs;
  `launch/demo.py`: `make demo`.
* `launch/driver/`: the run itself: the trainer's step loop, the actors and their pool,
  placement, supervision, checkpoints as the driver takes them, the curriculum, metrics.
* `launch/rundir/`: the run directory: its files, checkpoints on disk, ownership, resume.
* `launch/plan/`: will it fit? the card, the RAM, and the split of a CPU box's cores.
* `launch/evaluate/`: held-out evaluation of saved models and of a run's own workers.
* `launch/app/`: the web app.
"""
