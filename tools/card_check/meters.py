"""How the card check measures memory: per phase (`PhaseMeter`, ours' steps), per process
(`Meter`, the two-process layout and TRL's side), and how far LoRA tensors moved
(`lora_snapshot`, `lora_change`). Torch is imported by the meters when they are built, in the
measured processes only."""

from __future__ import annotations

import threading
import time

from common.engine_budget import CUDA_CONTEXT

GiB = 2**30


class PhaseMeter:
    """One phase's peak memory. On CUDA: torch's peak reserved and allocated bytes and the
    device's used memory (the driver's count, every CUDA context included), sampled by a
    thread every 20 ms; on a CPU: the process's peak resident set (VmHWM, reset per phase),
    which stands in for the card."""

    def __init__(self, device: str):
        import torch

        self.torch, self.device = torch, device
        self.samples: list[float] = []
        self.running = False

    def _used(self) -> float:
        free, total = self.torch.cuda.mem_get_info()
        return float(total - free)

    def _sample(self) -> None:
        while self.running:
            self.samples.append(self._used())
            time.sleep(0.02)

    def start(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
            self.base = float(self.torch.cuda.memory_allocated())
            self.samples, self.running = [self._used()], True
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM back to VmRSS (Linux >= 4.0)
        except OSError:
            pass
        self.base = _status("VmRSS")

    def stop(self) -> dict:
        if self.device == "cuda":
            self.torch.cuda.synchronize()
            self.running = False
            self.thread.join()
            self.samples.append(self._used())
            peak = self.torch.cuda.max_memory_allocated()
            return {"peak_gb": max(self.samples) / GiB, "above_start_gb": (peak - self.base) / GiB,
                    "torch_reserved_gb": self.torch.cuda.max_memory_reserved() / GiB,
                    "torch_allocated_gb": peak / GiB, "device_used_gb": max(self.samples) / GiB}
        peak = _status("VmHWM")
        return {"peak_gb": peak / GiB, "above_start_gb": (peak - self.base) / GiB,
                "rss_gb": peak / GiB}


def _status(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return float(line.split()[1]) * 1024
    return 0.0


class Meter:
    """This process's memory on its device: on CUDA torch's reserved bytes plus one CUDA
    context (the plan's estimate: torch cannot see its own context); on a CPU the resident set
    (the peak reset per phase through /proc/self/clear_refs), which stands in for the card."""

    def __init__(self, device: str):
        import torch

        self.torch, self.device = torch, device

    def reset(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM back to VmRSS (Linux >= 4.0)
        except OSError:
            pass

    def now(self) -> float:
        if self.device == "cuda":
            return self.torch.cuda.memory_reserved() + CUDA_CONTEXT
        return _status("VmRSS")

    def peak(self) -> float:
        if self.device == "cuda":
            self.torch.cuda.synchronize()
            return self.torch.cuda.max_memory_reserved() + CUDA_CONTEXT
        return _status("VmHWM")


def lora_snapshot(named_params) -> dict:
    """A host copy of the trainable LoRA tensors (names holding "lora_") of `named_params`:
    off the device, so the device's memory figures do not count it."""
    return {n: p.detach().to("cpu", copy=True) for n, p in named_params
            if p.requires_grad and "lora_" in n}


def lora_change(before: dict, named_params) -> dict:
    """How far the LoRA tensors of `named_params` moved from `before` (`lora_snapshot`): the
    number of tensors compared, the largest and the summed absolute element change."""
    now = dict(named_params)
    diffs = [(now[n].detach().to("cpu").float() - b.float()).abs() for n, b in before.items()]
    top = max((float(d.max()) for d in diffs if d.numel()), default=0.0)
    return {"lora_tensors": len(diffs), "lora_max_abs_change": top,
            "lora_sum_abs_change": float(sum(float(d.sum()) for d in diffs)),
            "lora_changed": top > 0}
