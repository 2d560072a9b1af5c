"""Ours' side of `make bench`, in a driver process of its own as `python -m launch.train` runs it.

    python -m tools.compare.ours_driver CONFIG.json OUT.json

The bench's own process has imported torch, transformers, TRL and vLLM and has run TRL (~2.9 GB
of RSS); were it ours' driver, all of that would count in ours' footprint, while a
`launch.train` driver imports neither torch nor transformers (0.09-0.10 GiB). So the bench
starts this module instead: it imports what `launch.train` imports, starts a local Ray cluster
of the config's threads, runs `Trainer.step(k)` for `run.steps` steps, timing each, and writes
OUT.json: per step the time, the completion tokens, the memory row (`memory/peak_gb`,
`memory/peak_pss_gb` and each role's peak PSS share) and the step's parts; and the set-up time.
"""

from __future__ import annotations

import json
import sys
import time

import ray

from common import metrics as M
from common.config import Config
from launch.driver.trainer import Trainer

ROLES = {"driver": M.DRIVER_PSS_GB, "learner": M.LEARNER_PSS_GB, "workers": M.WORKERS_PSS_GB}
"""each role's PSS in a step's row (the workers with their verifier and engine children)"""


def parts(row: dict) -> dict:
    """A step's time by part: the worker's generation and scoring (which overlap the
    learner's update at staleness >= 1), the learner, the weight export and push, and the
    driver's wait for the rollout."""
    return {"generation": round(row[M.ROLLOUT_S] - row[M.SCORE_S], 3),
            "scoring": round(row[M.SCORE_S], 3), "learning": round(row[M.LEARNER_S], 3),
            "weight sync": round(row[M.SYNC_S] + row[M.WEIGHT_LOAD_S], 3),
            "waiting for the rollout": round(row[M.ROLLOUT_WAIT_S], 3),
            "lent core share": round(row[M.ROLLOUT_LENT_SHARE], 3)}


def run(cfg: Config) -> dict:
    """Start Ray, run the Trainer for `cfg.run.steps` steps, stop both; the figures."""
    r = cfg.rollout
    ray.init(address="local", num_cpus=r.learner_threads + r.num_workers * r.threads_per_worker,
             include_dashboard=False, log_to_driver=False)
    out = {"step_s": [], "tokens": [], "peak_gb": [], "peak_pss_gb": [], "roles_pss_gb": [],
           "parts": []}
    try:
        t0 = time.perf_counter()
        trainer = Trainer(cfg, cfg.run.run_dir)
        out["setup_s"] = time.perf_counter() - t0
        try:
            for k in range(cfg.run.steps):
                t0 = time.perf_counter()
                row = trainer.step(k)
                out["step_s"].append(time.perf_counter() - t0)
                out["tokens"].append(int(row[M.ROLLOUT_TOKENS]))
                out["peak_gb"].append(float(row[M.PEAK_GB]))
                out["peak_pss_gb"].append(float(row[M.PEAK_PSS_GB]))
                out["roles_pss_gb"].append({n: float(row.get(key, 0.0))
                                            for n, key in ROLES.items()})
                out["parts"].append(parts(row))
                print(f"[bench] ours step {k + 1}: {out['step_s'][-1]:.2f} s", file=sys.stderr,
                      flush=True)
        finally:
            trainer.shutdown()
    finally:
        ray.shutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m tools.compare.ours_driver CONFIG.json OUT.json", file=sys.stderr)
        return 2
    with open(args[0]) as f:
        cfg = Config.from_dict(json.load(f))
    result = run(cfg)
    with open(args[1], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
