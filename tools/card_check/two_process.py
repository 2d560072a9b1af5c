"""Two processes on one device, as the time-sliced layout runs them (`--rollout.engine hf` on a
card): a harness for measuring sharing (`tools.card_check --layout two-process`).

    from tools.card_check.two_process import run_two_process
    result = run_two_process(cfg, model_dir, shapes, steps=3, gpu_gb=8.0)

A learner process (learner.learner.Learner: LoRA or NF4 QLoRA, gradient checkpointing, the
entropy mask) and an engine process (Hugging Face generate on the policy's base, as the HF
rollout worker holds it: the dequantised NF4 base with bitsandbytes, LoRA pushes as fp32
adapters beside it) take turns on the device. In the order the preset runs them: the learner
builds its model first and the engine starts after it; each step the engine samples, moves its
weights off the device (a host copy, the device's freed, as vLLM's sleep does), the learner
steps and exports its adapters, the engine moves its weights back and loads the push.

Each process holds to its share with torch's per-process memory fraction (the plan's caps,
launch/plan/card.py: the learner the card less the sleeping engine, the engine the card less
the idle learner) and measures itself per phase: on CUDA torch's peak reserved bytes plus one CUDA
context (the plan's estimate: torch cannot see its own context); on a CPU the process's
resident set (the peak reset per phase through /proc/self/clear_refs), which stands in for the
card, and the weights' move is simulated: the model's tensors are emptied and a copy kept
aside, an observable change, not a saving.

Per step the driver counts the completions the engine sampled and their tokens; after the
last step the learner says how far its LoRA tensors moved from a host copy taken before the
first (`lora_change`).

Only torch, transformers and peft are imported (bitsandbytes for NF4): no Ray, no vLLM.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import statistics
import sys
import time

from actors.hf_worker import load_base, worker_dtype
from actors.sampling import BehaviourRecorder, hf_generation_config
from actors.weights import WeightApplier
from common.config import Config
from common.device import actor_device
from common.lm_head import use_fp32_head
from common.types import TrainBatch
from launch.plan import card
from learner.learner import Learner
from tools.card_check.meters import Meter, lora_change, lora_snapshot

GiB = 2**30


def _cap(device: str, cap_bytes: float) -> None:
    if device == "cuda":
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), 0)


def _imported() -> list[str]:
    return sorted(m for m in ("ray", "vllm") if m in sys.modules)


def _learner_proc(conn, cfg_dict: dict) -> None:
    """The learner: builds its model (capping itself: learner.learner) and keeps a host copy of
    its LoRA tensors, then trains on what it is sent and returns its adapters; asked, it says
    how far its LoRA tensors moved from that copy."""
    cfg = Config.from_dict(cfg_dict)
    meter = Meter(actor_device())
    learner = Learner(cfg)
    before = lora_snapshot(learner.params.items())  # before the first step: on the host
    conn.send({"pid": os.getpid(), "now": meter.now()})
    while (msg := conn.recv())[0] != "stop":
        if msg[0] == "idle":
            conn.send({"now": meter.now()})
            continue
        if msg[0] == "lora_change":  # after the last step, outside every timed one
            conn.send(lora_change(before, learner.params.items()))
            continue
        meter.reset()
        t0 = time.perf_counter()
        learner.train_on(TrainBatch(**msg[1]))
        peak, s = meter.peak(), time.perf_counter() - t0
        conn.send({"s": s, "peak": peak, "now": meter.now(), "update": learner.export(),
                   "imported": _imported()})


class Engine:
    """The HF engine of one process: sample, weights off the device and back, load a push."""

    def __init__(self, cfg, path: str):
        import torch

        self.torch, self.cfg, self.device = torch, cfg, actor_device()
        self.model = load_base(cfg, path, worker_dtype(cfg.model.dtype, self.device))
        self.model = self.model.to(self.device).eval()
        use_fp32_head(self.model)
        self.weights = WeightApplier(self.model, merge=self.model.dtype == torch.float32)
        self.saved: dict = {}

    def tensors(self):
        return [*self.model.named_parameters(), *self.model.named_buffers()]

    def device_bytes(self) -> int:
        """Bytes of the model's weights on its device (0 while asleep)."""
        return sum(t.numel() * t.element_size() for _, t in self.tensors())

    def sleep(self) -> None:
        for name, t in self.tensors():
            self.saved[name] = t.data.to("cpu", copy=True)
            t.data = self.torch.empty(0, dtype=t.dtype, device=t.device)
        self.weights.to("cpu")
        if self.device == "cuda":
            self.torch.cuda.empty_cache()

    def wake(self) -> None:
        for name, t in self.tensors():
            t.data = self.saved.pop(name).to(self.device)
        self.weights.to(self.device)

    def generate(self, vocab: int, seed: int) -> dict:
        """G x prompts random prompts of max_prompt_tokens, sampled to max_new_tokens."""
        import numpy as np

        torch, r = self.torch, self.cfg.rollout
        gen = hf_generation_config(r.max_new_tokens, [vocab + 1], 0)  # an EOS never sampled
        gen.return_dict_in_generate = True
        rng = np.random.default_rng(seed)
        prompts = [rng.integers(4, vocab, r.max_prompt_tokens).tolist()
                   for _ in range(r.prompts_per_step)]
        ids = torch.tensor([p for p in prompts for _ in range(r.group_size)], device=self.device)
        torch.manual_seed(seed)
        with torch.no_grad():
            recorder = BehaviourRecorder(1.0)
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      generation_config=gen, logits_processor=[recorder])
            comps = out.sequences[:, ids.shape[1]:]
            logp, ent = recorder.finish(comps)
        n = len(comps)
        return {"prompt_ids": [prompts[i // r.group_size] for i in range(n)],
                "completion_ids": comps.cpu().tolist(),
                "old_logp": [x.float().cpu().numpy() for x in logp],
                "entropy": [x.float().cpu().numpy() for x in ent],
                "advantages": rng.normal(size=n).astype(np.float32)}


def _engine_proc(conn, cfg_dict: dict, path: str, cap_bytes: float, vocab: int) -> None:
    import torch

    cfg = Config.from_dict(cfg_dict)
    torch.set_num_threads(cfg.rollout.threads_per_worker)
    import actors.hf_worker  # noqa: F401 - imports overlap the learner's build; the model waits

    conn.recv()  # ("build",): the learner holds its model now
    device = actor_device()
    _cap(device, cap_bytes)
    meter, engine = Meter(device), Engine(cfg, path)
    conn.send({"pid": os.getpid(), "now": meter.now(), "weights": engine.device_bytes()})
    while (msg := conn.recv())[0] != "stop":
        cmd, t0 = msg[0], time.perf_counter()
        meter.reset()
        out = {}
        if cmd == "generate":
            out["batch"] = engine.generate(vocab, msg[1])
        elif cmd == "sleep":
            engine.sleep()
        elif cmd == "wake":
            engine.wake()
        elif cmd == "load":
            engine.weights.apply(msg[1])
        conn.send(out | {"s": time.perf_counter() - t0, "peak": meter.peak(),
                         "now": meter.now(), "weights": engine.device_bytes(),
                         "imported": _imported()})


def _ask(conn, *msg) -> dict:
    conn.send(msg)
    return conn.recv()


def _plan(cfg, shapes, gpu_gb: float) -> tuple[dict, dict]:
    """The plan's {phase: {process: bytes}} and per-process caps (launch/plan/card.py)."""
    rows = card.budget(cfg, shapes)
    return card.by_process(rows), card.caps(rows, gpu_gb)


def run_two_process(cfg, path: str, shapes, steps: int, gpu_gb: float) -> dict:
    """Run `steps` time-sliced steps in two processes; the figures as a dict (`summarise`)."""
    planned, caps = _plan(cfg, shapes, gpu_gb)
    ctx = mp.get_context("spawn")
    lconn, lchild = ctx.Pipe()
    econn, echild = ctx.Pipe()
    learner = ctx.Process(target=_learner_proc, args=(lchild, cfg.to_dict()), daemon=True)
    engine = ctx.Process(target=_engine_proc, daemon=True, args=(
        echild, cfg.to_dict(), path, caps["engine"], shapes.vocab))
    learner.start()
    engine.start()
    lchild.close()  # the children's ends live in the children: a child that dies (out of
    echild.close()  # memory at its cap) reads as EOFError here instead of a wait forever
    log = []
    try:
        first = {"learner": lconn.recv()}  # the learner holds its model before the engine builds
        first["engine"] = _ask(econn, "build")
        for k in range(steps):
            t0 = time.perf_counter()
            roll = _ask(econn, "generate", k)
            comps = roll["batch"]["completion_ids"]
            idle = _ask(lconn, "idle")
            asleep = _ask(econn, "sleep")
            learned = _ask(lconn, "train", roll.pop("batch"))
            awake = _ask(econn, "wake")
            loaded = _ask(econn, "load", learned.pop("update"))
            log.append({"step_s": time.perf_counter() - t0, "rollout": roll, "idle": idle,
                        "sleep": asleep, "learn": learned, "wake": awake, "load": loaded,
                        "completions": len(comps),
                        "completion_tokens": sum(len(c) for c in comps)})
        changed = _ask(lconn, "lora_change")
    finally:
        for conn in (econn, lconn):
            with contextlib.suppress(OSError):  # a dead child's pipe is broken
                conn.send(("stop",))
        for proc in (engine, learner):
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    return summarise(first, log, planned, caps, gpu_gb) | changed


def summarise(first: dict, log: list[dict], planned: dict, caps: dict, gpu_gb: float) -> dict:
    """Per phase and process: the measured peak (the largest over the steps) against the plan;
    each phase's two processes summed, and whether that stays under `gpu_gb`; per step the
    completions the engine sampled and their tokens."""
    measured = {"rollout": {"learner": max(s["idle"]["now"] for s in log),
                            "engine": max(s["rollout"]["peak"] for s in log)},
                "learn": {"learner": max(s["learn"]["peak"] for s in log),
                          "engine": max(s["sleep"]["now"] for s in log)}}
    phases = {ph: {p: {"peak_gb": measured[ph][p] / GiB, "plan_gb": planned[ph][p] / GiB}
                   for p in ("learner", "engine")} for ph in measured}
    phase_sum = {ph: sum(v["peak_gb"] for v in procs.values()) for ph, procs in phases.items()}
    need = {p: max(phases[ph][p]["peak_gb"] for ph in phases) for p in ("learner", "engine")}
    return {"mode": "two-process", "cap_gb": gpu_gb,
            "pids": {"driver": os.getpid(), **{p: first[p]["pid"] for p in ("learner", "engine")}},
            "phases": phases, "phase_sum_gb": phase_sum,
            "under_cap": max(phase_sum.values()) <= gpu_gb,
            "caps_gb": need, "fixed_shares_gb": sum(need.values()),
            "plan_caps_gb": {p: v / GiB for p, v in caps.items()},
            "engine_weights_bytes": [{"awake": s["rollout"]["weights"],
                                      "asleep": s["sleep"]["weights"],
                                      "woken": s["wake"]["weights"]} for s in log],
            "imported": sorted({m for s in log for part in ("learn", "load")
                                for m in s[part]["imported"]}),
            "step_s": [s["step_s"] for s in log],
            "completions_per_step": [s["completions"] for s in log],
            "completion_tokens_per_step": [s["completion_tokens"] for s in log],
            "s_per_step": statistics.median(s["step_s"] for s in log),
            "rollout_s": statistics.median(s["rollout"]["s"] for s in log),
            "learner_step_s": statistics.median(s["learn"]["s"] for s in log),
            "swap_s": statistics.median(s["sleep"]["s"] + s["wake"]["s"] for s in log),
            "push_s": statistics.median(s["load"]["s"] for s in log)}


def report(res: dict) -> str:
    """The lines the smoke prints for a two-process run."""
    lines = [f"{'phase':<8} {'process':<8} {'pid':>8} {'peak GiB':>9} {'plan GiB':>9} "
             f"{'diff':>6}"]
    for ph, procs in res["phases"].items():
        for p, v in procs.items():
            diff = 100 * (v["peak_gb"] - v["plan_gb"]) / max(v["plan_gb"], 1e-9)
            lines.append(f"{ph:<8} {p:<8} {res['pids'][p]:>8} {v['peak_gb']:9.2f} "
                         f"{v['plan_gb']:9.2f} {diff:+5.0f}%")
    sums = ", ".join(f"{ph} {v:.2f}" for ph, v in res["phase_sum_gb"].items())
    caps = res["caps_gb"]
    lines += [f"summed per phase (learner + engine, measured): {sums} GiB; under the "
              f"{res['cap_gb']:g} GiB cap: {'yes' if res['under_cap'] else 'NO'}",
              f"caps the measured peaks need: learner {caps['learner']:.2f}, engine "
              f"{caps['engine']:.2f} GiB (resident side by side they would need "
              f"{res['fixed_shares_gb']:.2f}); the plan's caps: learner "
              f"{res['plan_caps_gb']['learner']:.2f}, engine {res['plan_caps_gb']['engine']:.2f}",
              "engine weights on the device per step (awake -> asleep -> woken, MiB): "
              + "; ".join(f"{w['awake'] / 2**20:.1f} -> {w['asleep'] / 2**20:.1f} -> "
                          f"{w['woken'] / 2**20:.1f}" for w in res["engine_weights_bytes"]),
              f"s/step {res['s_per_step']:.1f} (median of {len(res['step_s'])}: rollout "
              f"{res['rollout_s']:.1f} + learner {res['learner_step_s']:.1f} + weights off "
              f"and back {res['swap_s']:.2f} + push {res['push_s']:.2f})"]
    return "\n".join(lines)
