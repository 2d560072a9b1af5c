"""The card check: the gpu-8gb preset's step measured on a bare GPU box, in one call.

    python -m tools.card_check --out card-check.json            # a GPU box, ~5 min
    python -m tools.card_check --cpu --out card-check.json      # the same code, tiny, CPU
    python -m tools.card_check --cpu --shape qwen/qwen2.5-1.5b-instruct --layers 2 \\
        --skip-trl --skip-nf4                                   # the preset's widths on a CPU

Needs PyTorch, transformers and peft; bitsandbytes for NF4 (without it the base is 16-bit LoRA,
said in the output) and trl for the comparison. No Ray, no vLLM, no download: the model is a
random one of the preset model's exact shape and vocabulary (common/shapes.py) with a
character-level tokenizer (common/tiny_model.py), so every prompt is exactly the preset's
prompt length and, with 151,936 ids to draw from, almost no completion stops early. Random
weights earn no reward, so each completion's reward is drawn at random: every sequence trains.
It measures time and memory, not learning.

In order, each in a process of its own so that each one's memory is its own:

1. ours: the one-copy mode (launch/driver/one_copy.py, the class the Ray actor runs) for `--steps`
   steps of G x prompts completions: generate, rewards, the driver's advantages
   (learner/advantages.py), the learner's step. Per phase (load, rollout, learn) the peak
   memory against the plan (launch/plan/card.py): on a GPU torch's peak reserved and allocated
   bytes and the device's used memory (every CUDA context included, as nvidia-smi shows it),
   on a CPU the process's peak resident set (which stands in for the card); s/step split into
   generation and learning; `policy/logp_diff` (on-policy at staleness 0).
2. TRL: `trl.GRPOTrainer` on the same model, prompts, G, lengths and LoRA (QLoRA with
   bitsandbytes), `use_vllm=False`, capped to the same memory (tools/card_check/trl_side.py).
3. NF4: do the CPU's and the card's 4-bit kernels agree (tools/card_check/nf4.py), if time is left.

It prints each result as it comes and rewrites `--out` after each one, so a time-out loses
nothing measured; `--time-limit` (default 480 s) is shared by the three.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata as md
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from common.device import compute_dtype, cuda_dtype, probe_cuda
from common.models import load_tokenizer
from common.presets import get_preset
from common.shapes import KNOWN, Shapes, build_random_model
from common.tiny_model import build_tiny_tokenizer, finish_generation_config
from launch.plan import card
from tasks.prompts import prompt_text
from tools.card_check.nf4 import run_compare
from tools.card_check.ours import spawn_ours
from tools.card_check.trl_side import spawn_trl

GiB = 2**30
TINY = "tiny"
"""--shape tiny: a two-layer model with the character tokenizer's 100-token vocabulary"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tools.card_check",
                                description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true",
                   help="run on the CPU (default shape tiny): the code path, the JSON keys")
    p.add_argument("--shape", default=None,
                   help=f"model shape: {TINY}, {', '.join(KNOWN)} (default: the preset's model "
                        "on a GPU, tiny with --cpu)")
    p.add_argument("--layers", type=int, default=0, help="override the shape's layer count")
    p.add_argument("--gpu-memory-gb", type=float, default=8.0, help="the cap, both sides")
    p.add_argument("--steps", type=int, default=3, help="steps of ours (and of TRL's)")
    p.add_argument("--group", type=int, default=0, help="G (default: the preset's)")
    p.add_argument("--prompts", type=int, default=0, help="prompts a step (default: preset's)")
    p.add_argument("--prompt-tokens", type=int, default=0, help="default: the preset's")
    p.add_argument("--new-tokens", type=int, default=0, help="default: the preset's")
    p.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp16", "fp32"),
                   help="model.dtype (auto: the card's; on a CPU fp32)")
    p.add_argument("--layout", default="one-copy", choices=("one-copy", "two-process"),
                   help="ours: one-copy (the preset's) or two-process (a learner and an HF "
                        "engine process taking turns on the card, tools/card_check/two_process.py)")
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--skip-nf4", action="store_true")
    p.add_argument("--time-limit", type=float, default=480.0, help="seconds for everything")
    p.add_argument("--out", default="card-check.json", help="the JSON file, rewritten as it goes")
    args = p.parse_args(argv)
    args.shape = (args.shape or (TINY if args.cpu else None))
    if args.shape and args.shape != TINY and args.shape.lower() not in KNOWN:
        p.error(f"--shape {args.shape!r}: allowed: {TINY}, {', '.join(KNOWN)}")
    if args.steps < 1 or args.layers < 0:
        p.error("need --steps >= 1 and --layers >= 0")
    return args


# ---- the setting -----------------------------------------------------------------------------
def shapes_for(args, preset_model: str):
    if args.shape == TINY:
        s = Shapes(layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1, head_dim=32,
                   vocab=100, tied=True)
    else:
        s = KNOWN[(args.shape or preset_model).lower()]
    if args.layers:
        s = dataclasses.replace(s, layers=args.layers, params=0)  # params recounted
    return s


def config(args, path: str, nf4: bool):
    """The gpu-8gb preset on the random model at `path`, on this device, with the lengths."""
    cfg = get_preset("gpu-8gb")
    cfg.model.name, cfg.model.gpu_memory_gb = path, args.gpu_memory_gb
    cfg.model.device = "cpu" if args.cpu else "cuda"
    cfg.lora.mode = "qlora" if nf4 else "lora"
    cfg.model.dtype = args.dtype
    r = cfg.rollout
    r.group_size = args.group or r.group_size
    r.prompts_per_step = args.prompts or r.prompts_per_step
    r.max_prompt_tokens = args.prompt_tokens or r.max_prompt_tokens
    r.max_new_tokens = args.new_tokens or r.max_new_tokens
    if args.cpu:
        r.learner_threads = os.cpu_count() or 1
    return cfg


def write_model(shapes, path: str) -> None:
    """A random model of `shapes` and the character tokenizer at `path`."""
    tok = build_tiny_tokenizer()
    model = build_random_model(shapes)
    finish_generation_config(model, tok)
    model.save_pretrained(path)
    tok.save_pretrained(path)


def exact_prompts(tok, n: int, tokens: int, seed: int) -> list[dict]:
    """`n` samples whose chat-formatted prompt is exactly `tokens` tokens (tasks/registry.py)."""
    import random


    def length(question: str) -> int:
        return len(tok(prompt_text(tok, {"question": question}),
                       add_special_tokens=False)["input_ids"])

    room = tokens - (length("x") - 1)
    if room < 1:
        raise ValueError(f"--prompt-tokens {tokens}: the chat template alone is longer")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        # letters only: transformers gives a Qwen2-typed model Qwen2's tokenizer class,
        # which drops the character vocabulary's spaces
        q = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(room))
        if length(q) != tokens:
            raise ValueError(f"a prompt of {length(q)} tokens, not {tokens}: this tokenizer "
                             "is not character-level")
        out.append({"question": q, "answer": "0", "id": f"card-{i}"})
    return out


# ---- the report ------------------------------------------------------------------------------
def plan_figures(cfg, shapes, dtype: str) -> dict:
    """The plan's phases (GiB) and each phase's part beyond the resident model."""
    rows = card.budget(cfg, shapes, dtype)
    phase = {k: v / GiB for k, v in card.phases(rows).items()}
    return {"phases_gb": phase, "above_start_gb": {
                "rollout": sum(v for p, _, v in rows if p == card.GEN) / GiB,
                "learn": sum(v for p, _, v in rows if p == card.STEP) / GiB},
            "peak_gb": max(phase.values())}


def summarise(ours: dict) -> None:
    """Medians over the steps, into `ours`."""
    steps = ours.get("steps", [])
    if not steps:
        return
    gen, learn = [s["gen_s"] for s in steps], [s["learn_s"] for s in steps]
    total = [g + lr for g, lr in zip(gen, learn)]
    ours["s_per_step"] = statistics.median(total)
    ours["s_range"] = [min(total), max(total)]
    ours["gen_s"], ours["learn_s"] = statistics.median(gen), statistics.median(learn)
    ours["completions_per_s"] = steps[0]["completions"] / ours["s_per_step"]
    for ph in ("rollout", "learn"):
        ours[f"{ph}_peak_gb"] = max(s["memory"][ph]["peak_gb"] for s in steps)
        ours[f"{ph}_above_start_gb"] = max(s["memory"][ph]["above_start_gb"] for s in steps)
    ours["logp_diff_max"] = max(abs(s["logp_diff"]) for s in steps)


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "peft", "bitsandbytes", "trl", "accelerate"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def bitsandbytes_works() -> bool:
    """bitsandbytes imports (a subprocess: no CUDA context here)."""
    probe = subprocess.run([sys.executable, "-c", "import bitsandbytes"], capture_output=True,
                           timeout=300)
    return probe.returncode == 0


class Report:
    """The JSON file, rewritten after every change, and the lines printed as they come."""

    def __init__(self, path: str, data: dict):
        self.path, self.data = path, data
        self.save()

    def save(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=2)
        os.replace(tmp, self.path)

    def say(self, line: str) -> None:
        print(f"card_check: {line}", flush=True)
        self.data.setdefault("lines", []).append(line)
        self.save()


# ---- the three checks ------------------------------------------------------------------------
def check_ours(args, rep: Report, cfg, shapes, prompts: list[dict], left_s: float) -> None:
    ours = rep.data["ours"] = {"steps": []}
    spec = {"cfg": cfg.to_dict(), "device": "cpu" if args.cpu else "cuda", "seed": 0,
            "steps": args.steps, "prompts": prompts}
    plan = rep.data["plan"]

    def on_message(msg: dict) -> None:
        if msg["event"] == "loaded":
            ours["load"] = msg
            rep.say(f"ours: loaded in {msg['load_s']:.1f} s, {msg['memory']['peak_gb']:.2f} GiB "
                    f"(plan's start phase {plan['phases_gb']['start']:.2f})")
        elif msg["event"] == "step":
            ours["steps"].append(msg)
            rep.say(f"ours: step {msg['step']}: generate {msg['gen_s']:.1f} s "
                    f"({msg['completion_tokens']} tokens), learn {msg['learn_s']:.1f} s; "
                    + "; ".join(_against_plan(ph, msg["memory"][ph], plan, args.cpu)
                                for ph in ("rollout", "learn"))
                    + f"; logp_diff {msg['logp_diff']:.2e}")
        elif msg["event"] == "error":
            ours["error"] = msg["error"]
            rep.say(f"ours: FAILED: {msg['error']}")
        summarise(ours)
        rep.save()

    spawn_ours(spec, left_s, on_message)
    if "s_per_step" in ours:
        rep.say(f"ours: {ours['s_per_step']:.2f} s/step (median of {len(ours['steps'])}; "
                f"generate {ours['gen_s']:.2f} + learn {ours['learn_s']:.2f}), peak "
                f"{max(ours['rollout_peak_gb'], ours['learn_peak_gb']):.2f} GiB against the "
                f"plan's {plan['peak_gb']:.2f}")


def check_two_process(args, rep: Report, cfg, path: str, shapes) -> None:
    """The time-sliced layout: a learner process and an HF engine process (random prompts of
    the same lengths; tools/card_check/two_process.py prints its own table)."""
    # here, not at the top: the layout's module imports the learner's model code, which the
    # check's own process needs for this layout only
    from tools.card_check.two_process import report, run_two_process

    cfg.rollout.engine = "hf"
    rep.say("ours: two processes (learner + HF engine) taking turns ...")
    try:
        res = run_two_process(cfg, path, shapes, args.steps, args.gpu_memory_gb)
    except (EOFError, OSError) as err:  # a process died, e.g. out of memory at its cap
        res = {"error": f"a process died ({type(err).__name__}; its traceback is above)"}
    rep.data["ours"] = res
    for line in ([] if "error" in res else report(res).splitlines()):
        rep.say(f"ours: {line}")
    if "error" in res:
        rep.say(f"ours: FAILED: {res['error']}")


def _against_plan(phase: str, got: dict, plan: dict, cpu: bool) -> str:
    """A phase's memory beside the plan's: on a card the peak (contexts included); on a CPU,
    where the process's resident set holds the runtime too, what the phase added above its
    start against the plan's rows of that phase."""
    if cpu:
        return (f"{phase} +{got['above_start_gb']:.2f} GiB above its start (plan's "
                f"{phase} rows {plan['above_start_gb'][phase]:.2f})")
    return (f"{phase} peak {got['peak_gb']:.2f} GiB, torch reserved "
            f"{got['torch_reserved_gb']:.2f} (plan {plan['phases_gb'][phase]:.2f})")


def check_trl(args, rep: Report, cfg, path: str, prompts: list[str], dtype: str,
              left_s: float) -> None:
    r, lora = cfg.rollout, cfg.lora
    spec = {"path": path, "device": "cpu" if args.cpu else "cuda", "gpu_gb": args.gpu_memory_gb,
            "dtype": dtype, "nf4": lora.mode == "qlora", "group": r.group_size,
            "prompts": r.prompts_per_step, "prompt_tokens": r.max_prompt_tokens,
            "new_tokens": r.max_new_tokens, "warmup": 0, "steps": args.steps, "seed": 0,
            "lr": cfg.grpo.lr, "lora_r": lora.r, "lora_alpha": lora.alpha,
            "lora_modules": lora.modules(), "micro_batch": cfg.grpo.micro_batch,
            "threads": os.cpu_count() or 1, "prompt_texts": prompts}
    rep.say(f"TRL: GRPOTrainer, use_vllm=False, {'QLoRA' if spec['nf4'] else 'LoRA'}, same G, "
            "lengths, LoRA and cap ...")
    res = spawn_trl(spec, timeout_s=left_s)
    if "error" not in res:
        steps = res["step_s"]
        res |= {"s_per_step": statistics.median(steps), "s_range": [min(steps), max(steps)]}
        rep.say(f"TRL: {res['s_per_step']:.2f} s/step (median of {len(steps)}), peak "
                f"{res['peak_gb']:.2f} GiB (torch reserved + a CUDA context estimate on a GPU, "
                "peak RSS on a CPU)")
    else:
        rep.say(f"TRL: FAILED: {res['error']}")
    rep.data["trl"] = res
    rep.save()


def check_nf4(args, rep: Report) -> None:
    rep.say("NF4: the CPU's and this device's 4-bit kernels on Qwen2-0.5B's shape ...")
    res = run_compare(cpu=args.cpu)
    rep.data["nf4"] = res
    rep.say("NF4: " + ", ".join(f"{k} {v}" for k, v in res.items()))


def machine_facts(args, card, nf4: bool, shapes, dtype: str) -> dict:
    """The report's header: the device, the code and library versions, what the run checks."""
    device = "cpu" if args.cpu else (f"{card.name} ({card.total_gb:.1f} GiB, compute capability "
                                     f"{card.capability[0]}.{card.capability[1]})")
    return {"tool": "tools.card_check", "device": device, "commit": commit(),
            "versions": versions(), "cap_gb": args.gpu_memory_gb, "dtype": dtype,
            "lora_mode": "qlora" if nf4 else "lora (bitsandbytes does not import)",
            "shape": dataclasses.asdict(shapes) | {"name": args.shape or "the preset's"}}


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    t_start = time.monotonic()

    card = None if args.cpu else probe_cuda()
    if not args.cpu and (card is None or not card.count):
        print("card_check: error: no CUDA GPU visible to PyTorch (--cpu runs the same code on "
              "the CPU)", file=sys.stderr)
        return 2
    nf4 = bitsandbytes_works()
    shapes = shapes_for(args, get_preset("gpu-8gb").model.name)
    dtype = (compute_dtype(args.dtype, "cpu") if args.cpu
             else cuda_dtype(args.dtype, card.capability)[0])
    data = machine_facts(args, card, nf4, shapes, dtype)
    rep = Report(args.out, data)
    with tempfile.TemporaryDirectory(prefix="homerl-card-") as path:
        write_model(shapes, path)
        cfg = config(args, path, nf4)
        r = cfg.rollout
        data["settings"] = dict(group=r.group_size, prompts=r.prompts_per_step,
                                prompt_tokens=r.max_prompt_tokens, new_tokens=r.max_new_tokens,
                                micro_batch=cfg.grpo.micro_batch, steps=args.steps,
                                kv_cache=r.kv_cache, lora_r=cfg.lora.r)
        data["plan"] = plan_figures(cfg, shapes, dtype)
        rep.say(f"{data['device']}, cap {args.gpu_memory_gb:g} GiB, {data['lora_mode']}, "
                f"{dtype}; {shapes.params / 1e9:.2f}B params, G={r.group_size} x "
                f"{r.prompts_per_step} prompts, {r.max_prompt_tokens} + {r.max_new_tokens} tokens; "
                f"plan peak {data['plan']['peak_gb']:.2f} GiB")

        samples = exact_prompts(load_tokenizer(path), r.prompts_per_step,
                                r.max_prompt_tokens, seed=0)

        def left() -> float:
            return args.time_limit - (time.monotonic() - t_start)

        if args.layout == "two-process":
            check_two_process(args, rep, cfg, path, shapes)
        else:
            check_ours(args, rep, cfg, shapes, samples, left())
        if args.skip_trl:
            data["trl"] = {"skipped": "--skip-trl"}
        elif left() < 30:
            data["trl"] = {"skipped": "no time left"}
        else:
            tok = load_tokenizer(path)  # TRL gets the chat-formatted text: the same tokens
            check_trl(args, rep, cfg, path, [prompt_text(tok, s) for s in samples], dtype,
                      left() - 15)
    if args.skip_nf4 or not nf4:
        data["nf4"] = {"skipped": "--skip-nf4" if args.skip_nf4 else "no bitsandbytes"}
    elif left() < 60:
        data["nf4"] = {"skipped": "no time left"}
    else:
        check_nf4(args, rep)
    data["elapsed_s"] = time.monotonic() - t_start
    rep.save()
    ok = "s_per_step" in data["ours"] and "error" not in data["ours"]
    rep.say(f"done in {data['elapsed_s']:.0f} s; ours {'ran' if ok else 'FAILED'}; figures in "
            f"{args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
