"""Soak test (`make soak`, not in CI): the tiny preset for a long time, killing a worker often.

    python -m tools.ops.soak --minutes 30 --kill-every 180
    python -m tools.ops.soak --minutes 4 --kill-every 30 --warmup 60     # a quick check

Every `--kill-every` seconds a rollout worker's process gets SIGKILL (by PID, from this
process), at a random moment inside the next step (a timer thread), so kills land mid-rollout,
mid-sync or mid-learner-step, not only between steps. Every `--sample-every` seconds it keeps
one sample of each role's RSS (from the step's `memory/*` metrics: driver, learner, rollout
workers with their children, the verifier pool); it keeps samples, not rows, so its own
bookkeeping does not grow with the step count. At the end it prints steps, kills and restarts,
and per role the RSS at the start (mean over the minute before `--warmup` ends) and at the end
(mean over the last minute), and exits 1 if any role grew by more than `--max-growth`.
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

from common import metrics as M
from common.presets import get_preset
from launch.driver.trainer import Trainer

ROLES = {"driver": M.DRIVER_RSS_GB, "learner": M.LEARNER_RSS_GB,
         "workers": M.WORKERS_RSS_GB, "verifier": M.VERIFIER_RSS_GB, "total": M.RSS_GB}
WINDOW_S = 60.0  # the start and end figures are means over this long


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.minutes * 60 < args.warmup + 2 * WINDOW_S:
        sys.exit(f"tools.ops.soak: error: --minutes {args.minutes} leaves no end window after "
                 f"--warmup {args.warmup:g}s; allowed: minutes*60 >= warmup + {2 * WINDOW_S:g}")
    cfg = get_preset("tiny")
    cfg.run.steps = 10**7  # bounded by --minutes instead
    cfg.run.checkpoint_every = 50
    cfg.rollout.num_workers = args.workers
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="homerl-soak-")
    trainer = Trainer(cfg, run_dir)
    samples, steps, kills, restarts = _soak(trainer, args)
    report = {"minutes": args.minutes, "steps": steps, "kills": kills, "restarts": restarts,
              "warmup_s": args.warmup, "samples": len(samples), "run_dir": run_dir,
              "rss_gb": _growth(samples, args.warmup)}
    print(json.dumps(report, indent=2))
    print(f"{'role':<10}{'start GB':>10}{'end GB':>10}{'growth':>9}")
    for role, g in report["rss_gb"].items():
        print(f"{role:<10}{g['start']:>10.4f}{g['end']:>10.4f}{g['growth_pct']:>8.2f}%")
    worst = max(report["rss_gb"].items(), key=lambda kv: kv[1]["growth_pct"])
    ok_restarts = restarts >= kills
    ok_memory = worst[1]["growth_pct"] <= args.max_growth
    print(f"{steps} steps, {kills} kills, {restarts} restarts; largest growth: {worst[0]} "
          f"{worst[1]['growth_pct']:+.2f}% (limit {args.max_growth:g}%): "
          f"{'PASS' if ok_restarts and ok_memory else 'FAIL'}")
    return 0 if ok_restarts and ok_memory else 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools.ops.soak", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0, help="how long to run")
    p.add_argument("--kill-every", type=float, default=180.0, help="seconds between kills")
    p.add_argument("--warmup", type=float, default=150.0,
                   help="seconds before the start figure is taken (before the first kill)")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--max-growth", type=float, default=5.0, help="allowed RSS growth, percent")
    p.add_argument("--workers", type=int, default=1, help="rollout workers")
    p.add_argument("--run-dir", default=None, help="run directory (default: a temp dir)")
    return p


def _soak(trainer: Trainer, args) -> tuple[list, int, int, int]:
    """Steps until --minutes pass; returns ([(t, {role: GB})], steps, kills, restarts)."""
    rng = random.Random(0)
    t0 = time.monotonic()
    next_kill, next_sample = t0 + args.kill_every, t0
    samples, kills, k, row = [], 0, 0, {}
    try:
        while (now := time.monotonic()) - t0 < args.minutes * 60:
            if now >= next_kill:
                pid = rng.choice(trainer.pool.worker_pids())
                delay = rng.uniform(0.0, row.get(M.STEP_S, 1.0))
                threading.Timer(delay, _kill, (pid,)).start()
                kills += 1
                next_kill += args.kill_every
            row = trainer.step(k)
            k += 1
            if time.monotonic() >= next_sample:
                samples.append((time.monotonic() - t0, {r: row[key] for r, key in ROLES.items()}))
                next_sample += args.sample_every
    finally:
        trainer.shutdown()
    return samples, k, kills, int(row.get(M.RESTARTS, 0))


def _growth(samples: list, warmup: float) -> dict:
    """Per role: mean RSS over the minute before `warmup` and over the last minute, and growth."""
    t_end = samples[-1][0]
    first = [s for t, s in samples if warmup - WINDOW_S <= t < warmup]
    last = [s for t, s in samples if t >= t_end - WINDOW_S]
    out = {}
    for role in ROLES:
        a = sum(s[role] for s in first) / len(first)
        b = sum(s[role] for s in last) / len(last)
        out[role] = {"start": a, "end": b, "growth_pct": 100.0 * (b - a) / a if a else 0.0}
    return out


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone (replaced by an earlier recovery)
        pass


if __name__ == "__main__":
    sys.exit(main())
