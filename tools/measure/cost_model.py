"""A cost model of one GRPO step at staleness 1: what a box of C cores, or N such boxes on Ray,
should reach, from figures measured on this one.

    python -m tools.measure.cost_model  # the 14-core projection from this host's figures
    python -m tools.measure.cost_model --cores 14 --nodes 1 2 4 --box-bandwidth 60
    python -m tools.measure.cost_model --check runs/scale/a runs/scale/b     # predicted vs measured

The model (every assumption is a line of `ASSUMPTIONS`, printed with the table):

* a rollout worker's decode step costs a + b * B seconds for B rows at one thread (the line
  through `tools.measure.decode_profile`'s steps at B = 8 and 32); a rollout call costs `call_steps`
  such steps (its longest completion plus prefill and verification, fitted to a measured
  one-thread rollout of the demo's 16 rows);
* threads speed a worker and the learner up by Amdahl's law, the parallel fraction fitted to
  their 1- and 2-thread measurements;
* each decode step reads the weights once; all workers of a box together read no faster than
  the box's bandwidth (a decode step is at least workers x weight bytes / bandwidth);
* the learner's step grows in proportion to the completions it trains;
* a worker loads each pushed version between two calls: its cycle is load + rollout call;
* at staleness 1 a step costs max(load + rollout, learner) + sync (the export and the driver);
  more threads than cores stretch the step by threads / cores;
* core sharing (`rollout.share_cores`, on by default): once the faster role is done, the slower
  one runs the rest of its work on its own threads plus the idle role's (the learner takes every
  worker's of its box; a worker takes its share of the learner's, none for a worker on another
  box), sped up by Amdahl's law as above;
* on N boxes the learner runs on one, rollout workers on the rest of its cores and on every
  core of the others, and each push crosses the network (adapter bytes / network bandwidth) on
  top of the local sync.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import dataclass

ASSUMPTIONS = (
    "decode step = a + b * rows (1 thread); a rollout call = call_steps decode steps",
    "threads: Amdahl's law, parallel fraction fitted to the 1- and 2-thread measurements",
    "all workers of a box read the weights once per decode step, within the box's bandwidth",
    "learner step proportional to the completions it trains",
    "a worker's cycle = weight load + rollout call; step = max(load + rollout, learner) + sync "
    "(staleness 1); threads > cores stretch it by threads / cores",
    "core sharing: the rest of the slower role's work runs on its threads plus the idle role's "
    "(workers on other boxes borrow none)",
    "N boxes: the learner on one, workers on all its other cores and on every core of the "
    "others; each push also crosses the network",
)


MAY_BE_ZERO = ("load_s", "sync_s")
"""calibration figures that may be 0 (nothing to load, no overhead); the others must be > 0"""


@dataclass(frozen=True)
class Calibration:
    """Figures measured on one box. The defaults: 2 vCPUs of an AMD EPYC (Zen 4) host, fp32,
    SmolLM2-135M, cpu-demo (vLLM rollouts, packed learner forward) with core sharing off (run
    a-noshare: `launch.train --preset cpu-demo --rollout.share_cores false`, 1 worker x 1
    thread + learner 1 thread; docs/performance.md, "Scaling"), medians of steps 3-14."""

    decode_a_s: float = 0.0379
    """decode step at 1 thread, fixed part (s): `tools.measure.decode_profile --engines vllm
    --batches 8 16 32`, the line through B = 8 (68.9 ms) and 32 (162.1 ms)"""
    decode_b_s: float = 0.00388
    """decode step at 1 thread, per row (s)"""
    call_steps: float = 59.9
    """decode steps a rollout call costs (its longest completion + prefill + verification):
    run a-noshare's median rollout call (5.99 s, 16 rows, 40 new tokens at most) / step(16)"""
    rollout_speedup_2: float = 1.56
    """decode step at 1 thread / at 2 threads (`tools.measure.decode_profile --threads 2`, B = 16:
    95.8 / 61.4 ms)"""
    learner_s: float = 5.29
    """learner step at 1 thread for `completions` completions (s): run a-noshare's median"""
    learner_speedup_2: float = 1.40
    """learner step at 1 thread / at 2 threads (`tools.measure.learner_step --micro-batch 8`: 6.99 /
    4.99 s)"""
    completions: int = 16
    """completions per step of the learner figure"""
    load_s: float = 0.55
    """a worker's weight load per pushed version (s), between two of its rollout calls: run
    a-noshare's median `time/weight_load_s`"""
    sync_s: float = 0.29
    """per step beyond max(load + rollout, learner) (s): the export, the driver and Ray; run
    a-noshare's median step (6.83 s) - max(0.55 + 5.99, 5.29)"""
    weights_gb: float = 0.54
    """weight bytes one decode step reads (GB)"""
    adapter_mb: float = 19.5
    """bytes of one push (LoRA adapters, MB)"""


@dataclass(frozen=True)
class Layout:
    cores: int
    """cores per box"""
    workers: int
    """rollout workers on the learner's box (the other boxes: one per worker_threads cores)"""
    worker_threads: int
    learner_threads: int
    rows: int = 16
    """rows (completions) each worker decodes per step"""
    nodes: int = 1
    share: bool = True
    """core sharing between the learner and the workers of its box (`rollout.share_cores`)"""


@dataclass(frozen=True)
class Prediction:
    step_s: float
    rollout_s: float
    learner_s: float
    completions: int
    completions_per_s: float


def amdahl(speedup_2: float, threads: int) -> float:
    """Speed-up at `threads` threads from the one measured at 2 (parallel fraction fitted)."""
    p = min(1.0, max(0.0, 2.0 * (1.0 - 1.0 / speedup_2)))
    return 1.0 / ((1.0 - p) + p / threads)


def decode_step(cal: Calibration, rows: int, threads: int, floor_s: float) -> float:
    """One decode step of `rows` rows at `threads` threads, at least `floor_s` (the box's
    bandwidth)."""
    return max((cal.decode_a_s + cal.decode_b_s * rows)
               / amdahl(cal.rollout_speedup_2, threads), floor_s)


def shared(first_s: float, last_s: float, speedup: float) -> float:
    """Time of the slower role (`last_s` on its own threads) when the rest of its work after
    the faster role's `first_s` runs `speedup` times faster."""
    return first_s + (last_s - first_s) / speedup


def predict(cal: Calibration, lay: Layout, box_bandwidth_gb_s: float,
            network_gb_s: float = 1.25) -> Prediction:
    """Seconds per step and completions/s of `lay` (see the module docstring)."""
    others = lay.cores // lay.worker_threads if lay.nodes > 1 else 0  # workers per other box
    floor = max(lay.workers, others) * cal.weights_gb / box_bandwidth_gb_s  # the box's bandwidth
    step = decode_step(cal, lay.rows, lay.worker_threads, floor)
    rollout = cal.call_steps * step
    completions = (lay.workers + (lay.nodes - 1) * others) * lay.rows
    learner = (cal.learner_s * completions / cal.completions
               / amdahl(cal.learner_speedup_2, lay.learner_threads))
    cycle = cal.load_s + rollout  # the update starts as the worker starts loading its weights
    if lay.share and learner < cycle and lay.nodes == 1:  # workers borrow the learner's cores
        lent = lay.learner_threads // lay.workers  # the smallest share sets the call's end
        faster = decode_step(cal, lay.rows, lay.worker_threads + lent, floor)
        rollout = shared(max(learner - cal.load_s, 0.0), rollout, step / faster)
    elif lay.share and cycle < learner:  # the learner borrows its box's idle workers' cores
        own = amdahl(cal.learner_speedup_2, lay.learner_threads)
        more = amdahl(cal.learner_speedup_2, lay.learner_threads + lay.workers * lay.worker_threads)
        learner = shared(cycle, learner, more / own)
    threads = lay.workers * lay.worker_threads + lay.learner_threads
    stretch = max(1.0, threads / lay.cores)
    sync = cal.sync_s + (cal.adapter_mb / 1e3 / network_gb_s if lay.nodes > 1 else 0.0)
    step_s = max(rollout + cal.load_s, learner) * stretch + sync
    return Prediction(step_s, rollout * stretch, learner * stretch, completions,
                      completions / step_s)


def best_layouts(cal: Calibration, cores: int, box_bandwidth_gb_s: float, nodes: int = 1,
                 network_gb_s: float = 1.25, rows: int = 16, top: int = 3
                 ) -> list[tuple[Layout, Prediction]]:
    """The `top` layouts by completions/s of `nodes` boxes of `cores` cores: the learner's
    box as searched (threads = cores: no oversubscription), every other box all workers."""
    found = []
    for lt in range(1, cores):
        for wt in (1, 2, 4):
            w = (cores - lt) // wt
            if w < 1:
                continue
            lay = Layout(cores, w, wt, lt, rows, nodes)
            found.append((lay, predict(cal, lay, box_bandwidth_gb_s, network_gb_s)))
    found.sort(key=lambda x: -x[1].completions_per_s)
    return found[:top]


def run_layout(run_dir: str, cores: int) -> tuple[Layout, dict[str, float]]:
    """(layout, medians of its step, rollout call, learner and weight load seconds; NaN where
    the run did not record one) of a `launch.train` run, warm-up steps (the first two) left
    out."""
    with open(os.path.join(run_dir, "config.json")) as f:
        r = json.load(f)["rollout"]
    rows = -(-r["prompts_per_step"] * r["group_size"] // r["num_workers"])
    lay = Layout(cores, r["num_workers"], r["threads_per_worker"], r["learner_threads"], rows,
                 share=r.get("share_cores", False))
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f if line.strip()][2:]
    if not steps:
        raise ValueError(f"{run_dir}: fewer than 3 steps in metrics.jsonl")
    got = {k: [x[f"time/{k}_s"] for x in steps if f"time/{k}_s" in x]
           for k in ("step", "rollout", "learner", "weight_load")}
    return lay, {k: statistics.median(v) if v else float("nan") for k, v in got.items()}


def describe(lay: Layout) -> str:
    others = (f" (+ {lay.cores // lay.worker_threads} on each other box)"
              if lay.nodes > 1 else "")
    return (f"{lay.nodes} x {lay.cores} cores: learner {lay.learner_threads} thread(s), "
            f"{lay.workers} worker(s){others} x {lay.worker_threads} thread(s), "
            f"{lay.rows} rows each{', sharing cores' if lay.share else ''}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.measure.cost_model",
                                description=__doc__.splitlines()[0])
    p.add_argument("--cores", type=int, default=14, help="cores per box")
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4], help="boxes on Ray")
    p.add_argument("--box-bandwidth", type=float, default=60.0,
                   help="GB/s all cores of a box can read (an assumption; 2-channel DDR5)")
    p.add_argument("--network", type=float, default=1.25, help="GB/s between boxes (10 GbE)")
    p.add_argument("--check", nargs="+", default=[], metavar="RUN_DIR",
                   help="launch.train runs on this box: predicted vs measured s/step")
    p.add_argument("--bandwidth", type=float, default=32.8,
                   help="--check: GB/s this box reads on all its cores (tools.measure.roofline)")
    for f in Calibration.__dataclass_fields__.values():
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    args = p.parse_args(argv)
    if args.cores < 2 or min(args.nodes) < 1 or args.box_bandwidth <= 0:
        p.error("--cores must be >= 2, --nodes >= 1 and --box-bandwidth > 0")
    bad = [f for f in Calibration.__dataclass_fields__
           if getattr(args, f) < 0 or (getattr(args, f) == 0 and f not in MAY_BE_ZERO)]
    if bad:
        p.error(f"--{bad[0].replace('_', '-')} must be > 0"
                + (" or 0" if bad[0] in MAY_BE_ZERO else ""))
    cal = Calibration(**{f: getattr(args, f) for f in Calibration.__dataclass_fields__})
    print("assumptions:\n" + "\n".join(f"  - {a}" for a in ASSUMPTIONS))
    if args.check:
        cores = len(os.sched_getaffinity(0))
        for run_dir in args.check:
            lay, got = run_layout(run_dir, cores)
            pr = predict(cal, lay, args.bandwidth)
            print(f"{run_dir}: {describe(lay)}: predicted {pr.step_s:.2f} s/step (rollout "
                  f"{pr.rollout_s:.2f} s, learner {pr.learner_s:.2f} s), measured "
                  f"{got['step']:.2f} s/step (rollout {got['rollout']:.2f} s, learner "
                  f"{got['learner']:.2f} s, load {got['weight_load']:.2f} s): "
                  f"{pr.step_s / got['step'] - 1:+.0%}")
        return 0
    for n in args.nodes:
        lay, pr = best_layouts(cal, args.cores, args.box_bandwidth, n, args.network, top=1)[0]
        print(f"{describe(lay)}: {pr.completions} completions/step, {pr.step_s:.2f} s/step, "
              f"{pr.completions_per_s:.1f} completions/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
