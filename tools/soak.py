"""Soak test (`make soak`, not in CI): the tiny preset for a long time, killing a worker often.

    python -m tools.soak --minutes 30 --kill-every 180
    python -m tools.soak --minutes 2 --kill-every 30        # a quick check

Every `--kill-every` seconds a rollout worker's process gets SIGKILL (by PID, from this
process), at a random moment inside the next step (a timer thread), so kills land mid-rollout,
mid-sync or mid-learner-step, not only between steps. At the end it prints steps completed,
restarts observed, and RSS growth (driver + learner + workers, first vs last 10% of steps).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time

import numpy as np

from common import metrics as M
from launch.presets import get_preset
from launch.train import Trainer


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.soak", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0, help="how long to run")
    p.add_argument("--kill-every", type=float, default=180.0, help="seconds between kills")
    p.add_argument("--workers", type=int, default=1, help="rollout workers")
    p.add_argument("--run-dir", default=None, help="run directory (default: a temp dir)")
    args = p.parse_args(argv)
    cfg = get_preset("tiny")
    cfg.run.steps = 10**7  # bounded by --minutes instead
    cfg.run.checkpoint_every = 50
    cfg.rollout.num_workers = args.workers
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="homerl-soak-")
    trainer = Trainer(cfg, run_dir)
    rng = random.Random(0)
    t0 = time.monotonic()
    next_kill, kills, rows = t0 + args.kill_every, 0, []
    try:
        k = 0
        while time.monotonic() - t0 < args.minutes * 60:
            if time.monotonic() >= next_kill:
                last_step_s = rows[-1][M.STEP_S] if rows else 1.0
                pid = rng.choice(trainer.pool.worker_pids())
                threading.Timer(rng.uniform(0.0, last_step_s), _kill, (pid,)).start()
                kills += 1
                next_kill += args.kill_every
            rows.append(trainer.step(k))
            k += 1
    finally:
        trainer.shutdown()
    tenth = max(1, len(rows) // 10)
    rss_first = float(np.mean([r[M.RSS_GB] for r in rows[:tenth]]))
    rss_last = float(np.mean([r[M.RSS_GB] for r in rows[-tenth:]]))
    report = {"minutes": args.minutes, "steps": len(rows), "kills": kills,
              "restarts": rows[-1][M.RESTARTS] if rows else 0,
              "rss_gb_first10pct": rss_first, "rss_gb_last10pct": rss_last,
              "rss_growth_gb": rss_last - rss_first, "run_dir": run_dir}
    print(json.dumps(report, indent=2))
    ok = report["restarts"] >= kills
    return 0 if ok else 1


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone (replaced by an earlier recovery)
        pass


if __name__ == "__main__":
    sys.exit(main())
