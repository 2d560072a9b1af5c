"""Private fp32 copies of a bf16 checkpoint vs the machine's one shared fp32 conversion:
PSS per process and decode speed of the HF rollout engine, side by side.

    python -m tools.shape_model Qwen/Qwen2-0.5B-Instruct runs/models/qwen2-0.5b-shape
    python -m tools.bench_shared_weights --model runs/models/qwen2-0.5b-shape

Layouts (common/shared_weights.py; `HOMERL_SHARE_WEIGHTS` picks one per process):

* private: each process converts the bf16 file into its own fp32 copy; an HF worker keeps
  W0 of the adapted linears as bf16 and merges LoRA in place;
* shared: every process maps the model cache's one fp32 conversion; HF workers keep LoRA
  unmerged (actors/hf_worker.merges_lora).

Memory: one learner and `--workers` HF rollout workers, Ray actors as `launch.train` starts
them (a local Ray instance per layout). The learner trains one small batch and exports the
LoRA update; every worker loads it from the object store and generates, then each process's
PSS (with its verifier child) and the PSS of its model-file mappings are read from /proc and
set beside the RAM plan's resident rows (launch/ram_plan.py without the step's transient
activations, logits and KV cache).
Decode: one worker process at a time, per layout and thread count, on a synthetic update of
the preset's LoRA shape; a random model never samples EOS, so every completion is full length.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

GiB = 2**30
LAYOUTS = {"private": "0", "shared": "1"}
"""layout -> HOMERL_SHARE_WEIGHTS"""
TRANSIENT = ("step activations", "LM-head logits", "KV cache", "decode logits")
"""plan rows a process holds only inside a step, not after it"""
PROMPTS = [{"question": f"What is {a}+{b}?", "answer": str(a + b)}
           for a, b in ((2, 3), (7, 4), (11, 12), (9, 6))]


def bench_cfg(model: str, workers: int, threads: int = 1, max_new: int = 8):
    """cpu-14core on `model` with `workers` HF workers of `threads` threads each."""
    from launch.presets import get_preset

    cfg = get_preset("cpu-14core")
    cfg.model.name = model
    cfg.rollout.engine, cfg.rollout.num_workers = "hf", workers
    cfg.rollout.threads_per_worker = cfg.rollout.learner_threads = threads
    cfg.rollout.max_new_tokens = max_new
    return cfg


def random_batch(vocab: int):
    """Four short random sequences with non-zero advantages: one step moves LoRA's B off 0."""
    import numpy as np

    from common.types import TrainBatch

    rng, vocab = np.random.default_rng(0), min(1000, vocab)
    comps = [list(rng.integers(3, vocab, 12)) for _ in range(4)]
    return TrainBatch([list(rng.integers(3, vocab, 20)) for _ in comps], comps,
                      [np.full(len(c), -4.0, np.float32) for c in comps],
                      [np.ones(len(c), np.float32) for c in comps],
                      np.array([1.0, -1.0, 0.5, -0.5], np.float32))


def file_pss(pid: int) -> tuple[int, int]:
    """(Rss, Pss) bytes of `pid`'s mappings of safetensors files (/proc/PID/smaps)."""
    rss = pss = 0
    inside = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):  # a mapping's header line
                inside = line.rstrip().endswith(".safetensors")
            elif inside and first == "Rss:":
                rss += int(line.split()[1]) * 1024
            elif inside and first == "Pss:":
                pss += int(line.split()[1]) * 1024
    return rss, pss


def rollup_pss(pid: int) -> int:
    """Pss bytes of `pid` alone (/proc/PID/smaps_rollup)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("Pss:"))


def _start(ctx, target, *args):
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child))  # may spawn a verifier
    proc.start()
    return proc, parent


def measure_memory(model: str, workers: int, layout: str) -> dict[str, dict]:
    """{process: {pss, with_children, file_rss, file_pss}} bytes of Ray actors as a run starts
    them, after every worker loaded the learner's update (through the object store) and
    generated with it."""
    import ray

    from actors.hf_worker import HFRolloutWorker
    from common.memory import footprint
    from common.types import RolloutCall, Sampling
    from learner.learner import Learner

    cfg = bench_cfg(model, workers)
    ray.init(address="local", num_cpus=workers + 1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HOMERL_SHARE_WEIGHTS": LAYOUTS[layout]}})
    try:
        learner = ray.remote(Learner).options(num_cpus=1).remote(cfg)
        pids = {"learner": ray.get(learner.placement.remote())["pid"]}
        ray.get(learner.train_on.remote(random_batch(_vocab(model))))
        update = learner.export.remote()
        actors = [ray.remote(HFRolloutWorker).options(num_cpus=1).remote(cfg, name=f"rollout-{i}")
                  for i in range(workers)]
        version = ray.get(update).version
        ray.get([a.set_weights.remote(update, version) for a in actors])
        ray.get([a.generate.remote(RolloutCall(PROMPTS[:2], 2, Sampling(seed=0)))
                 for a in actors])
        for i, a in enumerate(actors):
            pids[f"rollout-{i}"] = ray.get(a.ping.remote())["pid"]
        out = {}
        for name, pid in pids.items():
            f_rss, f_pss = file_pss(pid)
            out[name] = {"pss": rollup_pss(pid), "file_rss": f_rss, "file_pss": f_pss,
                         "with_children": footprint(pid).pss_gb * GiB}
        return out
    finally:
        ray.shutdown()


def _vocab(model: str) -> int:
    import json

    with open(os.path.join(model, "config.json")) as f:
        return json.load(f)["vocab_size"]


def planned(model: str, workers: int, layout: str) -> dict[str, tuple[float, float]]:
    """{process: (resident, peak)} bytes the RAM plan gives the layout."""
    from launch import ram_plan

    os.environ["HOMERL_SHARE_WEIGHTS"] = LAYOUTS[layout]
    out: dict[str, tuple[float, float]] = {}
    for proc, name, v in ram_plan.budget(bench_cfg(model, workers)):
        resident = 0.0 if name.startswith(TRANSIENT) else v
        r, p = out.get(proc, (0.0, 0.0))
        out[proc] = (r + resident, p + v)
    return out


def memory_table(model: str, workers: int) -> list[str]:
    lines = ["| layout | process | PSS | + verifier | plan (resident) | plan (peak) | "
             "model-file Rss / Pss |", "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for layout in LAYOUTS:
        got, plan = measure_memory(model, workers, layout), planned(model, workers, layout)
        for name, m in got.items():
            resident, peak = plan[name]
            lines.append(f"| {layout} | {name} | {m['pss'] / GiB:.2f} | "
                         f"{m['with_children'] / GiB:.2f} | {resident / GiB:.2f} | "
                         f"{peak / GiB:.2f} | {m['file_rss'] / GiB:.2f} / "
                         f"{m['file_pss'] / GiB:.2f} |")
        total = sum(m["with_children"] for m in got.values())
        plan_total = sum(r for proc, (r, _) in plan.items() if proc != "driver")
        lines.append(f"| {layout} | **total** | | **{total / GiB:.2f}** | "
                     f"{plan_total / GiB:.2f} | | |")
        print("\n".join(lines[-len(got) - 1:]), flush=True)
    return lines


def synthetic_update(model, cfg, version: int = 1):
    """A LoRA update of the preset's shape (r, alpha, target modules), B small and non-zero."""
    import numpy as np

    from common.types import WeightUpdate

    rng, r, targets = np.random.default_rng(0), cfg.lora.r, set(cfg.lora.modules())
    tensors = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in targets:
            out_f, in_f = module.weight.shape
            tensors[f"{name}.lora_A"] = (rng.standard_normal((r, in_f)) * 0.01).astype(np.float32)
            tensors[f"{name}.lora_B"] = (rng.standard_normal((out_f, r)) * 0.01).astype(np.float32)
    return WeightUpdate("lora", version, tensors, scale=cfg.lora.alpha / r)


def _decode_main(cfg, prompts: int, group: int, reps: int, conn) -> None:
    """Child: one worker of the cfg's threads; timed generate calls after a warm-up."""
    from actors.hf_worker import HFRolloutWorker
    from common.types import RolloutCall, Sampling

    worker = HFRolloutWorker(cfg, name="rollout-0")
    worker.set_weights(synthetic_update(worker.model, cfg), 1)
    call = RolloutCall(PROMPTS[:prompts], group, Sampling(seed=0))
    worker.generate(RolloutCall(PROMPTS[:1], 1, Sampling(seed=0, max_new_tokens=2)))
    t0, tokens = time.perf_counter(), 0
    for _ in range(reps):
        tokens += sum(len(c) for c in worker.generate(call).completion_ids)
    conn.send((time.perf_counter() - t0, reps * prompts * group, tokens,
               worker.weights.merge))


def decode_table(model: str, threads: list[int], args) -> list[str]:
    lines = ["| layout | LoRA | threads | completions/s | tokens/s | tokens/s per core |",
             "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    ctx = mp.get_context("spawn")
    for layout in LAYOUTS:
        os.environ["HOMERL_SHARE_WEIGHTS"] = LAYOUTS[layout]
        for n in threads:
            cfg = bench_cfg(model, 1, threads=n, max_new=args.max_new_tokens)
            proc, conn = _start(ctx, _decode_main, cfg, args.prompts, args.group, args.reps)
            secs, comps, tokens, merged = conn.recv()
            proc.join(timeout=60)
            lines.append(f"| {layout} | {'merged' if merged else 'unmerged'} | {n} | "
                         f"{comps / secs:.2f} | {tokens / secs:.1f} | {tokens / secs / n:.1f} |")
            print(lines[-1], flush=True)
    return lines


def host() -> str:
    import psutil

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "unknown CPU")
    return (f"{cpu}, {os.cpu_count()} vCPUs, "
            f"{psutil.virtual_memory().total / GiB:.0f} GiB RAM")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.bench_shared_weights",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", default="runs/models/qwen2-0.5b-shape",
                   help="a bf16 checkpoint folder (tools.shape_model makes one)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--skip", choices=("memory", "decode"), action="append", default=[])
    args = p.parse_args(argv)
    if not os.path.isdir(args.model):
        p.error(f"--model {args.model}: no such folder; make it with python -m "
                f"tools.shape_model Qwen/Qwen2-0.5B-Instruct {args.model}")
    print(f"host: {host()}; model: {args.model}", flush=True)
    if "memory" not in args.skip:
        memory_table(args.model, args.workers)
    if "decode" not in args.skip:
        print(f"decode: {args.prompts} prompts x {args.group}, {args.max_new_tokens} new "
              f"tokens, {args.reps} calls", flush=True)
        decode_table(args.model, args.threads, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
