"""What each fault costs a run (`make faults`, not in CI): the figures of docs/faults.md.

    python -m tools.ops.faults                      # the tiny preset, 16 steps, 3 clean runs
    python -m tools.ops.faults --preset cpu-demo --steps 12 --clean-runs 1

Runs the preset on a local Ray cluster with one fault injected before step `--at` (first life
of the run only, so a redone step is not hit again), through `run_supervised` as `launch.train`
does, and once or more with no fault. Per fault it prints: the steps in metrics.jsonl (each
must appear once), worker and learner restarts, checkpoint failures, and the time lost: the
faulty run's wall time minus the median clean run's (the run loop only; actor start-up before
it is the same in both). The timeouts for hung actors are set short here (`--timeout`), so the
hung rows' time lost is mostly that timeout: with the defaults (rollout.call_timeout_s 900,
run.learner_timeout_s 1800) a hang costs that long before it is acted on.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import ray

from common import metrics as M
from common.presets import get_preset
from launch.driver.checkpointing import Checkpointer
from launch.driver.supervise import run_supervised
from launch.driver.trainer import Trainer
from launch.rundir.checkpoints import checkpoint_tmp
from launch.rundir.writer import read_jsonl


def _workers(sig: int) -> Callable[[Trainer], None]:
    def inject(trainer: Trainer) -> None:
        for pid in trainer.pool.worker_pids():
            os.kill(pid, sig)
    return inject


def _learner(sig: int) -> Callable[[Trainer], None]:
    def inject(trainer: Trainer) -> None:
        os.kill(ray.get(trainer.learner.placement.remote())["pid"], sig)
    return inject


@dataclass(frozen=True)
class Fault:
    name: str
    """the docs/faults.md table's row"""
    how: str
    """how it is injected"""
    where: str = "step"
    """"step": before step --at; "update": as step --at's learner update starts;
    "checkpoint": the first checkpoint write after step --at fails"""
    inject: Callable[[Trainer], None] | None = None


FAULTS = [
    Fault("rollout worker SIGKILLed", "SIGKILL to every worker process before the step",
          inject=_workers(signal.SIGKILL)),
    Fault("rollout worker hung", "SIGSTOP to every worker process before the step",
          inject=_workers(signal.SIGSTOP)),
    Fault("learner SIGKILLed", "SIGKILL to the learner's process before the step",
          inject=_learner(signal.SIGKILL)),
    Fault("learner step hung", "SIGSTOP to the learner as its update starts", where="update",
          inject=_learner(signal.SIGSTOP)),
    Fault("disk full at a checkpoint", "the checkpoint write raises ENOSPC after its temp dir "
          "is made (the tests fill a real tmpfs)", where="checkpoint"),
]


class FullDiskOnce(Checkpointer):
    """Checkpoints whose next write, once `full` is set, fails as a full disk does."""

    full = False

    def write(self, step, state, writer) -> None:
        if self.full:
            self.full = False
            checkpoint_tmp(self.run_dir, step)
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        super().write(step, state, writer)


class FaultyTrainer(Trainer):
    """A Trainer that injects `FAULT` once, in the run's first life (before any restore)."""

    checkpointer_class = FullDiskOnce
    FAULT: Fault | None = None
    AT = 0

    def _first_life(self) -> bool:
        return self.learner_restarts == 0 and self.FAULT is not None

    def step(self, k: int) -> dict:
        if k == self.AT and self._first_life() and self.FAULT.where == "step":
            self.FAULT.inject(self)
        return super().step(k)

    def _learner_step(self, plan, batches):
        if (self.learner_version == self.AT and self._first_life()
                and self.FAULT.where == "update"):
            self.FAULT.inject(self)
        return super()._learner_step(plan, batches)

    def checkpoint(self, step: int) -> float:
        if step > self.AT and self._first_life() and self.FAULT.where == "checkpoint":
            self.FAULT = None  # once: this checkpoint's write finds the disk full
            self.ckpt.full = True
        return super().checkpoint(step)


def run_once(args, fault: Fault | None, run_dir: str) -> dict:
    cfg = get_preset(args.preset)
    cfg.run.steps, cfg.run.checkpoint_every = args.steps, args.checkpoint_every
    cfg.rollout.call_timeout_s = cfg.run.learner_timeout_s = args.timeout
    trainer = type("Injected", (FaultyTrainer,), {"FAULT": fault, "AT": args.at})(cfg, run_dir)
    t0 = time.perf_counter()
    summary = run_supervised(trainer)  # shuts the actors down
    wall = time.perf_counter() - t0
    rows = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    return {"wall_s": wall, "steps": [r[M.STEP] for r in rows],
            "worker_restarts": rows[-1][M.RESTARTS], "learner_restarts":
            summary["learner_restarts"], "checkpoint_failures": rows[-1][M.CHECKPOINT_FAILURES]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.ops.faults", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny", help="preset to run (default tiny)")
    p.add_argument("--steps", type=int, default=16, help="steps per run")
    p.add_argument("--checkpoint-every", type=int, default=4, help="run.checkpoint_every")
    p.add_argument("--at", type=int, default=9, help="the step the fault is injected at")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="rollout.call_timeout_s and run.learner_timeout_s for these runs")
    p.add_argument("--clean-runs", type=int, default=3, help="runs with no fault (median)")
    args = p.parse_args(argv)
    if not 0 < args.at < args.steps:
        p.error(f"--at {args.at}: allowed 0 < at < --steps ({args.steps})")
    root = tempfile.mkdtemp(prefix="homerl-faults-")
    os.environ["TQDM_DISABLE"] = "1"  # one table, not 7 progress bars
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
             log_to_driver=False)
    clean = [run_once(args, None, os.path.join(root, f"clean-{i}"))["wall_s"]
             for i in range(args.clean_runs)]
    base = statistics.median(clean)
    print(f"{args.preset}, {args.steps} steps, checkpoint every {args.checkpoint_every}, fault "
          f"at step {args.at}; clean run {base:.1f} s (median of {len(clean)}: "
          f"{min(clean):.1f}-{max(clean):.1f})")
    print("| fault | injected | steps logged once | worker restarts | learner restarts "
          "| checkpoint failures | time lost |\n|---|---|---|---|---|---|---|")
    ok = True
    for i, fault in enumerate(FAULTS):
        r = run_once(args, fault, os.path.join(root, f"fault-{i}"))
        once = r["steps"] == list(range(args.steps))
        ok &= once
        print(f"| {fault.name} | {fault.how} | {len(set(r['steps']))}/{args.steps}"
              f"{'' if once else ' (NOT once each)'} | {r['worker_restarts']} | "
              f"{r['learner_restarts']} | {r['checkpoint_failures']} | "
              f"{r['wall_s'] - base:+.1f} s |", flush=True)
    ray.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
