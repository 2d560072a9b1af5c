"""Weight-sync cost at cpu-demo size: one LoRA update and one full-weight push to N workers.

    python -m tools.bench_sync                       # lora and full, 1 and 2 workers, 5 pushes
    python -m tools.bench_sync --modes lora --workers 1,2,4 --pushes 3
    python -m tools.bench_sync --engine vllm --modes lora --workers 1   # vLLM merges + reloads

The real path of a training step: the learner actor exports its update into Ray's object store
(`Learner.export`), then every rollout worker loads it (`set_weights`: fetch from the store,
merge LoRA into its base weights or copy the full state). Prints, per mode and worker count, the
bytes of one update and the median export and load times (load = until the last worker is done).
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray

from launch.presets import get_preset
from launch.train import rollout_worker_class
from learner.learner import Learner


def bench(mode: str, workers: int, pushes: int, engine: str = "hf") -> dict:
    cfg = get_preset("cpu-demo")
    cfg.lora.mode, cfg.rollout.engine = mode, engine
    cfg.rollout.num_workers, cfg.rollout.threads_per_worker = workers, 1
    learner = ray.remote(Learner).options(num_cpus=1, name=f"learner:sync-{mode}").remote(cfg)
    worker_cls = ray.remote(rollout_worker_class(cfg))
    pool = [worker_cls.options(num_cpus=1, name=f"rollout-{i}:sync").remote(
        cfg, name=f"rollout-{i}") for i in range(workers)]
    ray.get([w.ping.remote() for w in pool] + [learner.export.remote()])
    export_s, load_s, nbytes = [], [], 0
    try:
        for _ in range(pushes):
            t0 = time.perf_counter()
            ref = learner.export.remote()
            ray.wait([ref], fetch_local=False)
            t1 = time.perf_counter()
            ray.get([w.set_weights.remote(ref, 0) for w in pool])
            export_s.append(t1 - t0)
            load_s.append(time.perf_counter() - t1)
        nbytes = ray.get(ref).nbytes
    finally:
        for a in [learner, *pool]:
            ray.kill(a)
    return {"mode": mode, "workers": workers, "mb": nbytes / 1e6,
            "export_s": statistics.median(export_s), "load_s": statistics.median(load_s)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.bench_sync", description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="lora,full", help="comma-separated: lora, full")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    p.add_argument("--pushes", type=int, default=5, help="timed pushes per setting")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="rollout worker")
    args = p.parse_args(argv)
    counts = [int(x) for x in args.workers.split(",")]
    ray.init(address="local", num_cpus=max(counts) + 1, include_dashboard=False)
    try:
        for mode in args.modes.split(","):
            for n in counts:
                r = bench(mode, n, args.pushes, args.engine)
                print(f"{args.engine} {mode}: {r['mb']:.1f} MB to {n} worker(s): export "
                      f"{r['export_s']:.3f} s, load on all {r['load_s']:.3f} s "
                      f"(median of {args.pushes})", flush=True)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
