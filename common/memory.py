"""How much memory a process (and its children) holds: resident, proportional and peak.

Summing RSS over a run's processes counts every shared page once per process that maps it:
libtorch's text (~0.2 GB) is in the driver, the learner and every worker, and a model file
mapped by two processes is counted twice. PSS (proportional set size, from the kernel's
`smaps_rollup`) splits each shared page among its sharers, so PSS adds up to what the machine
actually spends. We report both; totals and the plan's targets are PSS, the per-process peak is
the kernel's high-water RSS (`VmHWM`, a lifetime maximum, shared pages included).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

import psutil

from common import metrics as M

GB = 2**30

RAY_DAEMONS = ("gcs_server", "raylet", "dashboard", "log_monitor", "monitor.py", "agent",
               "runtime_env", "ray_client_server")
"""fragments of the command lines of Ray's own processes (not its actor/task workers)"""


@dataclass(frozen=True)
class Footprint:
    """Memory of one process and its children, GB."""

    rss_gb: float = 0.0
    """resident set, process + children (shared pages counted in each)"""
    pss_gb: float = 0.0
    """proportional set, process + children (shared pages split among sharers)"""
    peak_gb: float = 0.0
    """high-water resident set of each process (VmHWM), summed over process + children"""
    children_rss_gb: float = 0.0
    """the children's part of rss_gb (a worker's verifier process, vLLM's engine core)"""

    @property
    def peak_pss_gb(self) -> float:
        """Estimated peak PSS: the current PSS plus how far RSS once rose above today's (that
        excess was private memory, activations and the like, which PSS counts in full)."""
        return self.pss_gb + max(0.0, self.peak_gb - self.rss_gb)

    def __add__(self, other: Footprint) -> Footprint:
        return Footprint(self.rss_gb + other.rss_gb, self.pss_gb + other.pss_gb,
                         self.peak_gb + other.peak_gb,
                         self.children_rss_gb + other.children_rss_gb)


def _peak_bytes(pid: int) -> int:
    """VmHWM of `pid` in bytes (0 where /proc has no such line)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return 0


def _one(proc: psutil.Process) -> tuple[int, int, int]:
    """(rss, pss, peak) bytes of one process; pss falls back to rss where smaps is unreadable."""
    try:
        full = proc.memory_full_info()
        rss, pss = full.rss, getattr(full, "pss", full.rss)
    except psutil.AccessDenied:
        rss = proc.memory_info().rss
        pss = rss
    return rss, pss, _peak_bytes(proc.pid) or rss


def footprint(pid: int | None = None, children: bool = True) -> Footprint:
    """Footprint of `pid` (default: this process) and, with `children`, its descendants."""
    root = psutil.Process(pid)
    rss, pss, peak = _one(root)
    kid_rss = 0
    for child in root.children(recursive=True) if children else ():
        try:
            c_rss, c_pss, c_peak = _one(child)
        except psutil.Error:  # exited meanwhile
            continue
        rss, pss, peak, kid_rss = rss + c_rss, pss + c_pss, peak + c_peak, kid_rss + c_rss
    return Footprint(rss / GB, pss / GB, peak / GB, kid_rss / GB)


def _keys(prefix: str, fp: Footprint, peak: bool = True) -> dict[str, float]:
    out = {f"{prefix}rss_gb": fp.rss_gb, f"{prefix}pss_gb": fp.pss_gb}
    return out | ({f"{prefix}peak_gb": fp.peak_gb} if peak else {})


def memory_row(driver: Footprint, learner: Footprint, workers: dict[str, Footprint],
               verifiers: dict[str, Footprint]) -> dict[str, float]:
    """A step's memory metrics (common.metrics names) from each role's footprint."""
    total_w = sum(workers.values(), Footprint())
    total_v = sum(verifiers.values(), Footprint())
    run = driver + learner + total_w
    peak_pss = sum(f.peak_pss_gb for f in (driver, learner, *workers.values()))
    row = {M.RSS_GB: run.rss_gb, M.PSS_GB: run.pss_gb, M.PEAK_GB: run.peak_gb,
           M.PEAK_PSS_GB: peak_pss,
           M.DRIVER_RSS_GB: driver.rss_gb, M.DRIVER_PSS_GB: driver.pss_gb,
           M.DRIVER_PEAK_GB: driver.peak_gb,
           M.WORKERS_RSS_GB: total_w.rss_gb, M.WORKERS_PSS_GB: total_w.pss_gb,
           M.WORKERS_PEAK_GB: total_w.peak_gb,
           M.VERIFIER_RSS_GB: total_v.rss_gb, M.VERIFIER_PSS_GB: total_v.pss_gb}
    for name, fp in sorted(workers.items()):
        row |= _keys(f"{M.WORKER_MEMORY_PREFIX}{name}_", fp)
    return row


def ray_row() -> dict[str, float]:
    """Ray's daemons' memory (common.metrics.RAY_MEMORY_PREFIX keys), for a run's first row."""
    daemons = ray_daemons()
    row = {k: v for name, fp in sorted(daemons.items())
           for k, v in _keys(f"{M.RAY_MEMORY_PREFIX}{name}_", fp, peak=False).items()}
    row[f"{M.RAY_MEMORY_PREFIX}total_pss_gb"] = sum(daemons.values(), Footprint()).pss_gb
    return row


def ray_daemons() -> dict[str, Footprint]:
    """{name: Footprint} of the Ray daemons (GCS, raylet, dashboard, agents...) of this
    process's cluster: its descendants when it started the cluster itself (a local run; other
    clusters on the machine are not counted), else every Ray daemon on this machine."""
    mine = psutil.Process().children(recursive=True)
    out = _daemons(mine)
    return out or _daemons(psutil.process_iter())


def _daemons(procs) -> dict[str, Footprint]:
    out: dict[str, Footprint] = {}
    for proc in procs:
        try:
            cmd = " ".join(proc.cmdline() or [])
            if "ray" not in cmd or proc.name().startswith("ray::") or proc.pid == os.getpid():
                continue
            name = next((d for d in RAY_DAEMONS if d in cmd), None)
            if name is not None:
                out[name] = out.get(name, Footprint()) + footprint(proc.pid, children=False)
        except (psutil.Error, TypeError):
            continue
    return out


def release_free_memory() -> bool:
    """Hand the C allocator's free blocks back to the OS (glibc `malloc_trim`), so a step's
    activations do not stay resident between steps. False where there is no glibc."""
    name = ctypes.util.find_library("c")
    try:
        return bool(ctypes.CDLL(name).malloc_trim(0)) if name else False
    except (OSError, AttributeError):
        return False


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20  # 1 MiB; measured against 128 KiB and 8 MiB (below)


def pin_mmap_threshold(nbytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Keep glibc's mmap threshold fixed (mallopt M_MMAP_THRESHOLD): every block above it is
    its own mapping, returned to the OS the moment it is freed. By default glibc raises the
    threshold (up to 32 MiB) each time such a block is freed; from then on a step's tensors
    come from the heap, and the freed ones stay there as fragments the next allocations cannot
    reuse. One learner micro-batch on the Qwen2-0.5B shape (16 x (70 + 128) tokens,
    checkpointed; autograd held 0.09 GiB) peaked 2.86 GiB above its start; pinned at 128 KiB
    0.54, at 1 MiB 0.60, at 8 MiB 3.25. On `cpu-demo` (small tensors) 1 MiB changes neither
    the peak nor the time (4.74 s/step), while 128 KiB costs +37% time (every mid-size tensor
    is mapped and zero-filled anew). The same as MALLOC_MMAP_THRESHOLD_=1048576 in the
    environment. False where there is no glibc."""
    name = ctypes.util.find_library("c")
    try:
        return bool(ctypes.CDLL(name).mallopt(M_MMAP_THRESHOLD, nbytes)) if name else False
    except (OSError, AttributeError):
        return False


def tcmalloc_env() -> dict | None:
    """Ray runtime_env that starts a process with tcmalloc as its allocator, or None where
    libtcmalloc_minimal is not installed. glibc malloc with the pinned mmap threshold (above)
    maps and zero-fills every freed-and-reallocated block over 1 MiB anew at each step;
    tcmalloc keeps such blocks for reuse: a cpu-demo learner step (16 sequences, 1 thread)
    4.20 -> 3.45 s and its peak above the model 0.99 -> 0.62 GiB (`tools.measure.learner_step`,
    README "Learner step"). A user's own LD_PRELOAD is kept after it."""
    lib = ctypes.util.find_library("tcmalloc_minimal")
    if not lib:
        return None
    preload = ":".join(x for x in (lib, os.environ.get("LD_PRELOAD", "")) if x)
    return {"env_vars": {"LD_PRELOAD": preload}}
