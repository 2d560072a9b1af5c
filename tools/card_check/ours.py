"""Ours' side of the card check (tools/card_check/__main__.py): the one-copy mode's steps in a
process of their own, and the meter of each phase's peak memory.

`spawn_ours(spec, timeout_s, on_message)` runs `run_ours` in a fresh process and hands each
result to `on_message` as soon as it is measured (the check writes it down at once, so a time
limit loses nothing measured). Only torch, transformers and peft (bitsandbytes for NF4) are
imported: no Ray, no vLLM.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import sys
import time

from tools.card_check.meters import PhaseMeter

GiB = 2**30


# ---- measuring a phase ---------------------------------------------------------------------
# ---- ours, in a process of its own -----------------------------------------------------------
def run_ours(spec: dict, send) -> None:
    """The one-copy mode's steps; each result is `send`-ed as it is measured."""
    import numpy as np
    import torch

    # in the child process only: the check's own process imports no model code and holds
    # no CUDA context (a context there would count against every measurement)
    from common.config import Config
    from common.types import RolloutCall, Sampling
    from launch.driver.one_copy import OneCopy
    from learner.advantages import plan_step

    cfg = Config.from_dict(spec["cfg"])
    meter = PhaseMeter(spec["device"])
    meter.start()
    t0 = time.perf_counter()
    one = OneCopy(cfg)
    send({"event": "loaded", "load_s": time.perf_counter() - t0, "memory": meter.stop(),
          "threads": torch.get_num_threads(), "pid": os.getpid(),
          "imported": sorted(m for m in ("ray", "vllm") if sys.modules.get(m) is not None)})
    rng = np.random.default_rng(spec["seed"])
    r = cfg.rollout
    for step in range(spec["steps"]):
        call = RolloutCall(spec["prompts"], r.group_size, Sampling(seed=spec["seed"] + step))
        meter.start()
        t0 = time.perf_counter()
        batch = one.generate(call)
        gen_s, rollout = time.perf_counter() - t0, meter.stop()
        batch = dataclasses.replace(batch, rewards=rng.random(len(batch.rewards)).astype(
            np.float32))  # random weights earn nothing: every sequence trains
        plan, _ = plan_step(batch.summary(), cfg)
        meter.start()
        t0 = time.perf_counter()
        learned = one.train_step(plan, batch)
        learn_s, learn = time.perf_counter() - t0, meter.stop()
        send({"event": "step", "step": step, "gen_s": gen_s, "learn_s": learn_s,
              "completions": len(batch.completion_ids),
              "completion_tokens": int(sum(len(c) for c in batch.completion_ids)),
              "prompt_tokens": [len(p) for p in batch.prompt_ids[:: r.group_size]],
              "memory": {"rollout": rollout, "learn": learn},
              "logp_diff": learned.logp_diff, "logp_diff_max": learned.logp_diff_max,
              "grad_norm": learned.grad_norm, "version": learned.version})


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the check's process ends (a time limit that
    kills the check must not leave a process holding the card)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _ours_child(conn, spec: dict) -> None:
    _die_with_parent()
    try:
        if spec["device"] == "cpu":
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        run_ours(spec, conn.send)
        conn.send({"event": "done"})
    except BaseException as err:  # noqa: BLE001 - an OOM at the cap is a result to report
        first = str(err).splitlines()[0][:300] if str(err) else ""
        conn.send({"event": "error", "error": f"{type(err).__name__}: {first}"})


def spawn_ours(spec: dict, timeout_s: float, on_message, target=_ours_child) -> None:
    """Run `run_ours` (`target`: a function of (connection, spec) that sends messages) in a
    fresh process, handing each message to `on_message` as it comes; after `timeout_s` an
    error message ends it and the process is killed."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, spec))  # not a daemon: it starts a verifier
    proc.start()
    child.close()
    deadline = time.monotonic() + timeout_s
    finished = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not parent.poll(left):
                on_message({"event": "error", "error": f"time limit ({timeout_s:.0f} s)"})
                return
            msg = parent.recv()
            on_message(msg)
            if msg["event"] in ("done", "error"):
                finished = True
                return
    except EOFError:
        proc.join(timeout=30)
        on_message({"event": "error", "error": f"the process died (exit code {proc.exitcode})"})
    finally:
        if finished:
            proc.join(timeout=30)  # it shuts its verifier down and exits
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=30)
