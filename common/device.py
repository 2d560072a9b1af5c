"""The one place that decides where each role runs: CPU, or the GPU Ray gave it.

`plan_devices(choice, cluster_gpus)` (the driver, before any actor starts) turns
`model.device` (auto | cpu | cuda) and the cluster's GPU count into each role's Ray request:

* no GPU wanted or none in the cluster: every role on CPU, no GPU requested;
* a GPU in one-copy mode (`rollout.engine=learner`, the gpu-8gb default): the learner asks for
  the whole card and its own model generates the rollouts (launch/driver/one_copy.py); one process,
  one CUDA context, one copy of the weights;
* a GPU with a rollout engine: the learner and every rollout worker ask Ray for a share of one card
  (`GPU_SHARE` each with one worker, so Ray puts them on the same card) and time-slice it: the
  rollout engine sleeps (vLLM's sleep mode frees its KV cache and moves its weights to host
  memory; the HF engine moves its model to host memory) while the learner steps, and wakes
  after the new weights are pushed (launch/train.py). README, "One 8 GB GPU", says why this
  design and not two resident processes.

Inside an actor, `actor_device()` names the device Ray assigned (`cuda` when it was given a
GPU, else `cpu`); models are built there and nothing else in the code picks a device.
`compute_dtype(model.dtype)` is the one dtype rule: on CUDA `auto` is bf16 on cards of compute
capability 8.0 or newer and fp16 on older ones (which have no bf16); on a CPU it is fp32, AMX or
not (`CPU_AUTO_DTYPE` says why). `cpu_info()` names the CPU and whether it has AMX, for every
benchmark's first line.

The driver imports no torch and must hold no CUDA context on the card the learner and engine
share: it asks a short-lived subprocess what torch sees (`probe_cuda`), which also finds the GPU
of WSL2 (`/dev/dxg`, no `/dev/nvidiaN` nodes).
"""

from __future__ import annotations

import functools
import glob
import json
import os
import subprocess
import sys
from dataclasses import dataclass

DEVICES = ("auto", "cpu", "cuda")
CPU_AUTO_DTYPE = "fp32"
"""`model.dtype auto` on a CPU. Measured on a 2-vCPU Intel host with AMX, `cpu-demo` with the
HF engine at staleness 0 in bf16 logged policy/logp_diff 0.028-0.037 (the two sides' bf16
kernels round differently; the tests' limit for a bf16 body is 0.005), and the 14-core split
planned 8.77 GiB; fp32 agrees to ~1e-7 and plans 6.80. Without AMX bf16 is also slower (bf16
`F.linear` ~80 GFLOP/s against ~130 in fp32 on one core).
`model.dtype bf16` remains, off-policy by that much."""
GPU_SHARE = 0.5
"""Ray GPU resource each of the learner and a rollout worker asks for on a shared card"""
BF16_CAPABILITY = (8, 0)
"""CUDA compute capability from which a card runs bf16 (Ampere); older cards compute in fp16"""
DTYPES = ("auto", "bf16", "fp16", "fp32")
PROBE_TIMEOUT_S = 60.0
"""the driver's torch probe (a subprocess importing torch and initialising CUDA) gives up here"""
_PROBE = ("import json, torch\n"
          "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
          "p = torch.cuda.get_device_properties(0) if n else None\n"
          "print(json.dumps({'count': n, 'name': p.name if p else '',\n"
          "                  'capability': [p.major, p.minor] if p else None,\n"
          "                  'total_gb': p.total_memory / 2**30 if p else 0.0}))\n")


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
    one_copy: bool = False
    """the learner's model generates (rollout.engine=learner): no rollout actor"""

    @property
    def shared_card(self) -> bool:
        """Learner and rollout worker time-slice one GPU (sleep / wake around each step)."""
        return self.device == "cuda" and not self.one_copy


def plan_devices(choice: str, cluster_gpus: float, num_workers: int = 1,
                 one_copy: bool = False) -> DevicePlan:
    """Each role's device and GPU request from `model.device` and the cluster's GPUs."""
    if choice not in DEVICES:
        raise DeviceError(f"model.device: must be one of {', '.join(DEVICES)}; got {choice!r}")
    if choice == "cpu" or (choice == "auto" and cluster_gpus < 1):
        return DevicePlan("cpu", 0.0, 0.0, one_copy)
    if cluster_gpus < 1:
        raise DeviceError("model.device=cuda: no CUDA GPU on this machine or Ray cluster; use "
                          "--model.device cpu (or a CPU preset such as cpu-demo)")
    if one_copy:
        return DevicePlan("cuda", 1.0, 0.0, True)
    if num_workers != 1:
        raise DeviceError(f"model.device=cuda shares one card between the learner and one "
                          f"rollout worker; got rollout.num_workers={num_workers} (set it to 1)")
    return DevicePlan("cuda", GPU_SHARE, GPU_SHARE)


@dataclass(frozen=True)
class CudaCard:
    """What torch in a subprocess saw: visible devices and the first one's properties."""

    count: int
    name: str = ""
    capability: tuple[int, int] | None = None
    total_gb: float = 0.0


@functools.lru_cache(maxsize=1)
def probe_cuda(timeout_s: float = PROBE_TIMEOUT_S) -> CudaCard | None:
    """Ask torch in a subprocess (`torch.cuda.device_count()` and the first card's compute
    capability and memory), so the driver neither imports torch nor holds a CUDA context on
    the card. None when the probe fails (no torch, an error, over `timeout_s`)."""
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                             timeout=timeout_s)
        got = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        got = None
    if got is None:
        return None
    cap = tuple(got["capability"]) if got.get("capability") else None
    return CudaCard(int(got["count"]), got.get("name", ""), cap, float(got.get("total_gb", 0)))


def machine_gpus() -> int:
    """CUDA GPUs this machine shows this process, as torch counts them (narrowed by
    CUDA_VISIBLE_DEVICES), asked in a subprocess (`probe_cuda`) and only where the machine has
    a GPU driver's device nodes: /dev/nvidiaN, or /dev/dxg under WSL2. Without them: 0 at
    once. Where the probe fails, the /dev/nvidiaN nodes are counted instead. Inside an actor
    `local_gpus` is the answer that counts."""
    nodes = len(glob.glob("/dev/nvidia[0-9]*"))
    if not nodes and not os.path.exists("/dev/dxg"):
        return 0
    card = probe_cuda()
    if card is not None:
        return card.count
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return nodes
    return min(nodes, len([v for v in visible.split(",") if v.strip() not in ("", "-1")]))


def wsl() -> bool:
    """Linux under Windows' WSL2 (its kernel says "microsoft"), where Linux sees only part of
    the PC's RAM: half of it by default (`memory=` in %UserProfile%\\.wslconfig)."""
    try:
        with open("/proc/sys/kernel/osrelease") as f:
            return "microsoft" in f.read().lower()
    except OSError:
        return False


WSL_FIX = ("WSL2 gives Linux half of the PC's RAM by default: to give it more, put `memory=NGB` "
           "under `[wsl2]` in %UserProfile%\\.wslconfig, then run `wsl --shutdown` in Windows")
"""the one line that says how to give WSL2's Linux more RAM"""


def driver_card() -> CudaCard | None:
    """The first visible card, for the driver's plan (no torch import here); None without."""
    return probe_cuda() if machine_gpus() else None


def cuda_dtype(choice: str, capability: tuple[int, int] | None) -> tuple[str, str]:
    """(dtype, why) of `model.dtype` on a CUDA card of compute `capability` (None: unknown).
    bf16 on a card without it is a one-line DeviceError naming fp16."""
    cap = f"{capability[0]}.{capability[1]}" if capability else None
    if choice == "bf16" and capability and tuple(capability) < BF16_CAPABILITY:
        raise DeviceError(f"model.dtype=bf16: this card (compute capability {cap}) has no bf16; "
                          "use --model.dtype fp16 or auto")
    if choice != "auto":
        return choice, "set by model.dtype"
    if capability is None:
        return "bf16", ("auto: no card seen here; bf16 from compute capability 8.0, fp16 "
                        "below, the same bytes")
    if tuple(capability) >= BF16_CAPABILITY:
        return "bf16", f"auto: compute capability {cap} >= 8.0 runs bf16"
    return "fp16", f"auto: compute capability {cap} < 8.0 has no bf16"


def compute_dtype(choice: str, device: str | None = None) -> str:
    """'fp32', 'bf16' or 'fp16' for this process's models from `model.dtype`: on CUDA by the
    card's compute capability (`cuda_dtype`), on a CPU `auto` is `CPU_AUTO_DTYPE` (fp32)."""
    if choice not in DTYPES:
        raise DeviceError(f"model.dtype: must be one of {', '.join(DTYPES)}; got {choice!r}")
    if (device or actor_device()) == "cuda":
        import torch

        return cuda_dtype(choice, tuple(torch.cuda.get_device_capability(0)))[0]
    return CPU_AUTO_DTYPE if choice == "auto" else choice


def torch_dtype(choice: str, device: str | None = None):
    """`compute_dtype` as a torch dtype."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16}[compute_dtype(choice, device)]


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


@functools.lru_cache(maxsize=1)
def cpu_info() -> tuple[str, bool]:
    """(CPU model name, has AMX-bf16) from /proc/cpuinfo; ("unknown CPU", False) elsewhere."""
    name, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown CPU":
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return name, "amx_bf16" in flags


def cpu_line() -> str:
    """'cpu: <model name>, N cores, AMX yes|no': figures from hosts with and without AMX differ
    (bf16 is fast only with it), so every benchmark prints this first."""
    name, amx = cpu_info()
    return f"cpu: {name}, {len(os.sched_getaffinity(0))} cores, AMX {'yes' if amx else 'no'}"
