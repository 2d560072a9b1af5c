"""`python -m launch.plan`: the plan that binds a preset, before anything loads.

    python -m launch.plan --preset gpu-8gb --gpu-memory-gb 8    # host RAM, then the card
    python -m launch.plan --preset gpu-8gb --engine vllm        # the time-sliced layout
    python -m launch.plan --preset cpu-14core --cores 14 --ram-gb 16
    python -m launch.plan --preset cpu-demo                     # this machine's RAM

A CPU preset's plan is the machine's RAM (launch/plan/ram.py), sized for the cores it is given
(launch/plan/sizing.py); a GPU preset's is the host side of the run, then the card
(launch/plan/card.py), whose verdict is the last line. Exit 0: it fits; 1: it does not (the
last line says why and what would fit); 2: a bad flag.
"""

from __future__ import annotations

import argparse
import sys

import psutil

from common.config import Config, ConfigError
from common.device import WSL_FIX, wsl
from common.presets import PRESETS, get_preset
from launch.plan import card, ram
from launch.plan.sizing import sized
from launch.plan.units import GiB


def _capability(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="python -m launch.plan", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="gpu-8gb", help=f"one of {', '.join(PRESETS)}")
    ap.add_argument("--gpu-memory-gb", "--gpu-gb", dest="gpu_gb", type=float, default=8.0,
                    help="GPU memory to plan for, GiB")
    ap.add_argument("--capability", default=None,
                    help="the card's CUDA compute capability, e.g. 7.5 (picks fp16) or 8.6")
    ap.add_argument("--engine", choices=("learner", "hf", "vllm"), default=None,
                    help="rollout.engine: learner (one copy of the weights, one process) or a "
                         "rollout engine of its own, hf or vllm (default: the preset's)")
    ap.add_argument("--num-workers", type=int, default=None, help="rollout.num_workers")
    ap.add_argument("--group-size", type=int, default=None, help="override rollout.group_size")
    ap.add_argument("--no-checkpointing", action="store_true",
                    help="plan without gradient checkpointing")
    ap.add_argument("--ram-gb", type=float, default=None,
                    help="host RAM to plan for, GiB (default: available now)")
    ap.add_argument("--cores", type=int, default=None,
                    help="size a CPU run for N cores (-1: this machine's; launch/plan/sizing.py); "
                         "default: the preset's run.cores")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = get_preset(args.preset)
        r = cfg.rollout
        r.engine = args.engine or r.engine
        r.num_workers = args.num_workers or r.num_workers
        r.group_size = args.group_size or r.group_size
        if args.no_checkpointing:
            cfg.model.gradient_checkpointing = False
        text, fits = plans(Config.from_dict(cfg.to_dict()), args)  # validated again
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0 if fits else 1


def plans(cfg: Config, args) -> tuple[str, bool]:
    """The plans that bind `cfg`: a GPU preset's host side (RAM), then its card plan, whose
    verdict stays the last line; a CPU preset's RAM plan alone (it uses no card, so a card
    plan would only mislead)."""
    ram_gb = args.ram_gb if args.ram_gb is not None else psutil.virtual_memory().available / GiB
    if cfg.model.device != "cuda":
        try:
            cfg, why = sized(cfg, args.cores, ram_gb)
        except ConfigError as err:  # no split fits this machine: the verdict, not a bad flag
            return f"does not fit: {err}", False
        ram_text, ram_fits, _ = ram.report(cfg, ram_gb)
        how = f"sized: {why}\n" if why else ""
        return (f"{cfg.preset} runs on the CPU (model.device={cfg.model.device}): its plan is "
                f"the machine's RAM; no card is used\n{how}{ram_text}", ram_fits)
    ram_text, ram_fits, _ = ram.report(cfg, ram_gb, gpu=True)
    if wsl():  # Linux sees part of the PC's RAM: the plan above is against that part
        ram_text += f"\n  {WSL_FIX}"
    text, fits, _ = card.report(cfg, args.gpu_gb, capability=_capability(args.capability))
    return f"host memory:\n{ram_text}\n\nthe card:\n{text}", fits and ram_fits


if __name__ == "__main__":
    sys.exit(main())
