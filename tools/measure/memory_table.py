"""Measured peak memory of finished runs next to the RAM plan of their config.

    python -m launch.train --preset cpu-demo --steps 8 --run-dir runs/mem-hf
    python -m tools.measure.memory_table runs/mem-hf

Per role, the largest PSS + (high-water RSS - RSS) over the run's steps (common/memory.py), the
plan's figure for the same config (launch/py) and their ratio; with several rollout
workers, each one's plan / measured (ratio); Ray's daemons as the run's first row recorded
them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from common import metrics as M
from common.config import Config
from common.memory import Footprint
from launch.plan.ram import GiB, budget, per_process
from launch.rundir.writer import read_jsonl

ROLES = {"driver": "memory/driver_", "learner": "memory/learner_", "workers": "memory/workers_"}


def _peak(rows: list[dict], prefix: str) -> float:
    """The largest peak PSS estimate over the steps of the process recorded under `prefix`."""
    return max(Footprint(r[prefix + "rss_gb"], r[prefix + "pss_gb"],
                         r[prefix + "peak_gb"]).peak_pss_gb for r in rows)


def measured(rows: list[dict]) -> dict[str, float]:
    """{role: peak PSS estimate over the steps} and the total."""
    out = {role: _peak(rows, prefix) for role, prefix in ROLES.items()}
    out["total"] = max(r[M.PEAK_PSS_GB] for r in rows)
    return out


def each_worker(rows: list[dict]) -> dict[str, float]:
    """{rollout-i: its peak PSS estimate over the steps}, verifier process included."""
    names = sorted({k[len(M.WORKER_MEMORY_PREFIX):-len("_pss_gb")] for k in rows[0]
                    if k.startswith(M.WORKER_MEMORY_PREFIX) and k.endswith("_pss_gb")})
    return {n: _peak(rows, f"{M.WORKER_MEMORY_PREFIX}{n}_") for n in names}


def planned(cfg: Config) -> dict[str, float]:
    """{role: planned peak PSS}, the total and each rollout worker's, GiB."""
    procs = {k: v / GiB for k, v in per_process(budget(cfg)).items()}
    workers = {k: v for k, v in procs.items() if k.startswith("rollout-")}
    return {"driver": procs["driver"], "learner": procs["learner"],
            "workers": sum(workers.values()), "total": sum(procs.values())} | workers


def table(run_dir: str) -> str:
    rows = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    with open(os.path.join(run_dir, "config.json")) as f:
        cfg = Config.from_dict(json.load(f))
    got, plan = measured(rows), planned(cfg)
    lines = [f"{run_dir}: {cfg.preset}, engine={cfg.rollout.engine}, {len(rows)} steps "
             "(GiB, peak PSS)", f"  {'role':<8} {'plan':>6} {'measured':>9} {'plan/meas':>10}"]
    lines += [f"  {k:<8} {plan[k]:6.2f} {got[k]:9.2f} {plan[k] / got[k]:10.2f}" for k in got]
    each = {k: (plan[k], v) for k, v in each_worker(rows).items() if k in plan}
    if len(each) > 1:  # per process, as the plan is made
        lines.append("  each rollout worker: " + ", ".join(
            f"{k} {p:.2f}/{m:.2f} ({p / m:.2f})" for k, (p, m) in each.items()))
    ray_total = rows[0].get(f"{M.RAY_MEMORY_PREFIX}total_pss_gb")
    if ray_total is not None:
        lines.append(f"  Ray's daemons (not in the total): {ray_total:.2f} GiB PSS")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.measure.memory_table",
                                description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", help="run directories with metrics.jsonl")
    args = p.parse_args(argv)
    for d in args.run_dirs:
        try:
            print(table(d))
        except (OSError, KeyError, ValueError) as err:
            print(f"error: {d}: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
