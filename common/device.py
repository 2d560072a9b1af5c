"""The one place that decides where each role runs: CPU, or the GPU Ray gave it.

`plan_devices(choice, cluster_gpus)` (the driver, before any actor starts) turns
`model.device` (auto | cpu | cuda) and the cluster's GPU count into each role's Ray request:

* no GPU wanted or none in the cluster: every role on CPU, no GPU requested;
* a GPU: the learner and every rollout worker ask Ray for a share of one card
  (`GPU_SHARE` each with one worker, so Ray puts them on the same card) and time-slice it: the
  rollout engine sleeps (vLLM's sleep mode frees its KV cache and moves its weights to host
  memory; the HF engine moves its model to host memory) while the learner steps, and wakes
  after the new weights are pushed (launch/train.py). README, "One 8 GB GPU", says why this
  design and not two resident processes.

Inside an actor, `actor_device()` names the device Ray assigned (`cuda` when it was given a
GPU, else `cpu`); models are built there and nothing else in the code picks a device.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

DEVICES = ("auto", "cpu", "cuda")
GPU_SHARE = 0.5
"""Ray GPU resource each of the learner and a rollout worker asks for on a shared card"""


class DeviceError(ValueError):
    """A device request the machine or cluster cannot meet; one line saying what to change."""


@dataclass(frozen=True)
class DevicePlan:
    """Where the roles run and what each asks Ray for."""

    device: str
    """'cpu' or 'cuda'"""
    learner_gpus: float
    """Ray num_gpus of the learner actor"""
    worker_gpus: float
    """Ray num_gpus of each rollout worker"""

    @property
    def shared_card(self) -> bool:
        """Learner and rollout worker time-slice one GPU (sleep / wake around each step)."""
        return self.device == "cuda"


def plan_devices(choice: str, cluster_gpus: float, num_workers: int = 1) -> DevicePlan:
    """Each role's device and GPU request from `model.device` and the cluster's GPUs."""
    if choice not in DEVICES:
        raise DeviceError(f"model.device: must be one of {', '.join(DEVICES)}; got {choice!r}")
    if choice == "cpu" or (choice == "auto" and cluster_gpus < 1):
        return DevicePlan("cpu", 0.0, 0.0)
    if cluster_gpus < 1:
        raise DeviceError("model.device=cuda: no CUDA GPU on this machine or Ray cluster; use "
                          "--model.device cpu (or a CPU preset such as cpu-demo)")
    if num_workers != 1:
        raise DeviceError(f"model.device=cuda shares one card between the learner and one "
                          f"rollout worker; got rollout.num_workers={num_workers} (set it to 1)")
    return DevicePlan("cuda", GPU_SHARE, GPU_SHARE)


def machine_gpus() -> int:
    """NVIDIA GPUs this machine shows this process (its /dev/nvidiaN nodes, narrowed by
    CUDA_VISIBLE_DEVICES), without importing torch: the driver asks, and it holds no model.
    Inside an actor `local_gpus` is the answer that counts (torch may be a CPU build)."""
    nodes = len(glob.glob("/dev/nvidia[0-9]*"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return nodes
    return min(nodes, len([v for v in visible.split(",") if v.strip() not in ("", "-1")]))


def local_gpus() -> int:
    """CUDA devices this process can see (0 without torch's CUDA build)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - any torch problem means no usable GPU
        return 0


def actor_device() -> str:
    """Inside a Ray actor (or a plain process): 'cuda' when a GPU is visible to it, else 'cpu'.

    Ray sets CUDA_VISIBLE_DEVICES to the GPUs an actor asked for, so an actor that asked for
    none sees none and stays on the CPU.
    """
    return "cuda" if local_gpus() > 0 else "cpu"


def card_gb() -> float:
    """GiB of memory on this process's first visible GPU (call only where one is visible)."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30


def cap_process_memory(gpu_memory_gb: float) -> None:
    """Hold this process to `gpu_memory_gb` of its card (torch's per-process fraction), so an
    8 GB card can be reproduced on a bigger one; a no-op on CPU or when 0."""
    if gpu_memory_gb <= 0 or local_gpus() == 0:
        return
    import torch

    torch.cuda.set_per_process_memory_fraction(min(1.0, gpu_memory_gb / card_gb()), 0)


def ray_placement() -> dict:
    """Where this process runs under Ray: `node_id` (None outside Ray) and `resources` (what
    Ray assigned this actor, e.g. a GPU share; empty outside an actor, where Ray refuses the
    question even when a cluster is up, as for a worker built in a test's own process)."""
    import ray

    if not ray.is_initialized():
        return {"node_id": None, "resources": {}}
    ctx = ray.get_runtime_context()
    in_actor = ctx.get_actor_id() is not None
    return {"node_id": ctx.get_node_id(),
            "resources": ctx.get_assigned_resources() if in_actor else {}}
