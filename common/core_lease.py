"""Cores lent between the learner and the CPU rollout workers of its node while one waits.

At staleness 1 the rollout of step k+1 runs beside the update of step k, and whichever ends
first leaves its cores idle until the next step. So each role, before each piece of work (a
worker before every decode step, the learner before every micro-batch), runs on its own cores
plus those of the roles that are idle now (`Lease.pick`). A worker is started on its own cores
plus a share of the learner's (`split_cores`); the learner's process is not bound, so it can
take an idle worker's core as it is. Each role marks itself busy or idle, with the time, in
a slot of a shared-memory file of its node (slot 0 the learner, slot 1 + i worker i), named
after the Ray node and job (`lease_key`): a role on another node never finds it and never
lends or borrows, and a slot no role has marked yet counts as busy.

Why borrowing does not collide: the driver hands a worker new work (a weight push, a rollout
call) only between learner steps, so a worker idle during an update stays idle until it ends;
a worker drops borrowed cores within one decode step (~0.1 s) of a learner step starting. The
one race is at a step's start: the update begins a few ms after the rollout it trains on ends,
just before the worker takes its next queued call, so a role lends only once idle for
`MIN_IDLE_S`.

    lease = Lease(flag_path(lease_key()), slot=0, own=1, lenders={1: 1},
                  set_threads=set_torch_threads, slots=2)   # the learner makes the file
    with lease.busy():
        lease.pick()           # before each micro-batch: 1 thread, 2 while worker 0 is idle
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
import struct
import sys
import tempfile
import time
from collections.abc import Callable

ABSENT, BUSY, IDLE = 0, 1, 2
"""a slot's states: no role marked it yet (counts as busy), working, waiting"""
LEARNER = 0
"""the learner's slot; rollout worker i has slot 1 + i"""
SLOT = struct.Struct("<Bxxxxxxxd")
"""a slot: its state, then the CLOCK_MONOTONIC time it was marked (one clock per machine)"""
MIN_IDLE_S = 0.05
"""a role lends its cores once idle this long: a worker's back-to-back calls (a rollout, then
the next weight load) leave it idle for a few ms, and an update that starts then must not
take its core"""


def flag_dir() -> str:
    """RAM-backed /dev/shm where there is one (a flag never touches a disk), else the temp dir."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def flag_path(key: str) -> str:
    """The flag file of `lease_key()` on this node."""
    return os.path.join(flag_dir(), f"homerl-cores-{key}")


def remove_flag(key: str | None) -> None:
    """Remove the flag file of `key` (a `lease_key()`) on this node, if there is one: the
    learner is killed, not closed, at the end of a run."""
    if key:
        with contextlib.suppress(FileNotFoundError):
            os.remove(flag_path(key))


def lease_key() -> str | None:
    """This process's Ray node and job (`<node id>-<job id>`): the learner and the workers of
    one run on one node share it, and two Ray clusters on one machine never do. None outside
    a Ray job (a process that never imported Ray is in none: it is not imported here)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        ctx = ray.get_runtime_context()
        return f"{ctx.get_node_id()[:16]}-{ctx.get_job_id()}"
    except Exception:  # noqa: BLE001 - no Ray, or no job context: nothing to share
        return None


def set_torch_threads(n: int) -> None:
    """torch's intra-op threads, through the builtin itself: vLLM's CPU worker replaces
    `torch.set_num_threads` in its process with a no-op that only warns."""
    import torch

    torch._C.set_num_threads(n)


def split_cores(cores: list[int], threads: int, index: int, workers: int,
                learner_threads: int) -> tuple[list[int], list[int]]:
    """(own, lent) cores of worker `index`: `threads` consecutive cores of `cores` each (wrapping
    round, as many workers as asked), and worker i's share of the cores no worker owns, which
    the learner uses: every `workers`-th of them from i, at most `learner_threads` in all."""
    own = [cores[(index * threads + j) % len(cores)] for j in range(min(threads, len(cores)))]
    free = cores[workers * threads:][:learner_threads]
    return own, free[index::workers]


def _map(path: str, slots: int = 0) -> mmap.mmap | None:
    """The flag file mapped for writing; `slots` > 0 creates it (in place: a replaced role
    keeps the file the others have mapped) with at least that many slots. None: no file yet."""
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if slots else 0), 0o600)
    except FileNotFoundError:
        return None
    try:
        size = max(os.fstat(fd).st_size, slots * SLOT.size)
        os.ftruncate(fd, size)  # new slots read ABSENT (zero)
        return mmap.mmap(fd, size) if size else None
    finally:
        os.close(fd)  # the mapping keeps the file


class Lease:
    """One role's side of its node's flag file.

    slot: this role's byte; own: its own threads; lenders: {slot: threads} of the roles whose
    cores it may borrow while they are idle; set_threads: what changes this process's compute
    threads; slots > 0 (the learner): create the file with that many slots now (others attach
    once it exists). `steps` counts `before_step` calls per thread count.
    """

    def __init__(self, path: str | None, slot: int, own: int, lenders: dict[int, int],
                 set_threads: Callable[[int], None], slots: int = 0):
        self.path, self.slot, self.own, self.lenders = path, slot, own, lenders
        self.set_threads = set_threads
        self._flags = _map(path, slots) if path and slots else None
        self._mark(IDLE)
        set_threads(own)
        self.threads = own
        self.steps: collections.Counter[int] = collections.Counter()

    def _attached(self) -> mmap.mmap | None:
        if self._flags is None and self.path:
            self._flags = _map(self.path)
        return self._flags

    def state(self, slot: int) -> tuple[int, float]:
        """(state, seconds since it was marked) of `slot`."""
        flags = self._attached()
        if flags is None or (slot + 1) * SLOT.size > len(flags):
            return ABSENT, 0.0
        state, since = SLOT.unpack_from(flags, slot * SLOT.size)
        return state, time.monotonic() - since

    def lends(self, slot: int) -> bool:
        """`slot`'s role has been idle for MIN_IDLE_S at least: its cores are free."""
        state, for_s = self.state(slot)
        return state == IDLE and for_s >= MIN_IDLE_S

    @contextlib.contextmanager
    def busy(self):
        """Marks this role busy for the block (the others keep off its cores), idle after."""
        self._mark(BUSY)
        try:
            yield
        finally:
            self._mark(IDLE)

    def _mark(self, state: int) -> None:
        flags = self._attached()
        if flags is not None and (self.slot + 1) * SLOT.size <= len(flags):
            SLOT.pack_into(flags, self.slot * SLOT.size, state, time.monotonic())

    def pick(self) -> int:
        """Set this role's threads to its own plus the idle lenders'; returns the count."""
        want = self.own + sum(n for s, n in self.lenders.items() if self.lends(s))
        if want != self.threads:
            self.set_threads(want)
            self.threads = want
        return want

    def before_step(self) -> None:
        self.steps[self.pick()] += 1

    def stats(self) -> dict:
        """Steps that ran on borrowed cores, of all (since the last call)."""
        total = sum(self.steps.values())
        lent = sum(n for t, n in self.steps.items() if t > self.own)
        self.steps.clear()
        return {"lent_steps": lent, "steps": total}

    def close(self, remove: bool = False) -> None:
        """Unmap (marking this role absent); `remove`: delete the file too."""
        self._mark(ABSENT)
        if self._flags is not None:
            self._flags.close()
            self._flags = None
        if remove and self.path:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)


class NoLease:
    """A role that shares no cores (a GPU, `rollout.share_cores` off, no core to lend, no Ray
    job): `Lease`'s methods, doing nothing, so callers never test for a lease."""

    def busy(self):
        return contextlib.nullcontext()

    def pick(self) -> int:
        return 0

    def before_step(self) -> None:
        pass

    def stats(self) -> dict:
        return {"lent_steps": 0, "steps": 0}

    def close(self, remove: bool = False) -> None:
        pass
