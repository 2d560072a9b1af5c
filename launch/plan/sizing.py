"""Size a CPU run from the machine: how many rollout workers, threads each, learner threads.

    python -m launch.plan --preset cpu-14core --cores 8 --ram-gb 16
    python -m launch.train --preset cpu-14core --cores 16          # or -1: every core here

`run.cores` (`--cores`) N > 0 sizes the run for N cores, -1 for the cores this process may use
(`os.sched_getaffinity`), 0 keeps the preset's own split (the `tiny` and `cpu-demo` presets;
`cpu-14core` sizes itself, -1). `run.ram_gb` (`--ram-gb`) is the memory to size for, 0 = what is
available now. The split, for N cores:

* the learner gets LEARNER_SHARE of the cores (its step is the larger half of a CPU step, as
  in the 14-core preset's 8 + 6), at least one;
* the rest go to rollout workers of one thread each (decode is memory-bound: a thread per
  worker uses the cores best, docs/performance.md), at most one worker per prompt of a step;
  cores a worker cannot use go back to the learner;
* the workers are then cut until the RAM plan (launch/plan/ram.py) fits, each remaining one
  taking the freed cores as threads.

A machine on which even one worker does not fit is refused in one line naming the largest
consumer and what to change (the RAM plan's own refusal).
"""

from __future__ import annotations

import dataclasses
import os

from common.config import Config, ConfigError
from launch.plan.ram import budget, refusal
from launch.plan.units import GiB

LEARNER_SHARE = 8 / 14
"""the learner's share of the cores (the 14-core preset's 8 of 14)"""


def machine_cores() -> int:
    """The cores this process may run on (a container's or taskset's limit included)."""
    return len(os.sched_getaffinity(0))


def available_gb() -> float:
    import psutil

    return psutil.virtual_memory().available / 2**30


def _with_split(cfg: Config, workers: int, threads: int, learner: int) -> Config:
    rollout = dataclasses.replace(cfg.rollout, num_workers=workers, threads_per_worker=threads,
                                  learner_threads=learner)
    return dataclasses.replace(cfg, rollout=rollout)


def split(cfg: Config, cores: int, ram_gb: float) -> tuple[Config, str]:
    """(`cfg` with the split for `cores` and `ram_gb`, one line saying what was chosen and
    why). Raises ConfigError (one line) when the machine cannot hold the run."""
    if cores < 2:
        raise ConfigError(f"run.cores {cores}: a run needs at least 2 cores (one for the "
                          "learner, one for a rollout worker)")
    learner = max(1, min(cores - 1, round(cores * LEARNER_SHARE)))
    rollout_cores = cores - learner
    cap = min(rollout_cores, cfg.rollout.prompts_per_step)
    why = (f"one worker per prompt of a step (prompts_per_step {cfg.rollout.prompts_per_step})"
           if cap < rollout_cores else "one thread per worker")
    for workers in range(cap, 0, -1):
        threads = rollout_cores // workers
        sized = _with_split(cfg, workers, threads, cores - workers * threads)
        need = sum(v for _, _, v in budget(sized)) / GiB
        if need <= ram_gb:
            if workers < cap:
                why = f"{cap} workers would need more than {ram_gb:.1f} GiB"
            return sized, (f"{cores} cores, {ram_gb:.1f} GiB: learner "
                           f"{sized.rollout.learner_threads} threads, {workers} rollout "
                           f"worker(s) x {threads} thread(s), {need:.2f} GiB planned ({why})")
    one = _with_split(cfg, 1, rollout_cores, learner)
    raise ConfigError(f"{cfg.preset} on {cores} cores: {refusal(one, ram_gb)}")


def size_run(cfg: Config) -> tuple[Config, str | None]:
    """`cfg` sized by its run.cores and run.ram_gb (unchanged when run.cores is 0 or the run
    uses a card), and the line saying why (None when unchanged)."""
    if cfg.run.cores == 0 or cfg.model.device == "cuda":
        return cfg, None
    cores = machine_cores() if cfg.run.cores < 0 else cfg.run.cores
    return split(cfg, cores, cfg.run.ram_gb or available_gb())


def sized(cfg: Config, cores: int | None, ram_gb: float) -> tuple[Config, str | None]:
    """`cfg` sized for `cores` (None: the preset's run.cores) and `ram_gb` (`size_run`)."""
    run = dataclasses.replace(cfg.run, ram_gb=ram_gb,
                              cores=cfg.run.cores if cores is None else cores)
    return size_run(dataclasses.replace(cfg, run=run))
