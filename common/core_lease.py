"""The learner's cores lent to the rollout workers on its node while it waits.

At staleness 1 on a CPU box the rollout of step k+1 runs beside the update of step k; a step's
update is usually the shorter, and its cores then sit idle until the next one. A CPU rollout
worker on the learner's node is therefore started on its own cores plus a share of the
learner's (`split_cores`), and before every decode step it runs on all of them while the
learner is idle and on its own while a learner step runs (`Borrower.before_step`). The learner
says which in a one-byte flag in a shared-memory file of its node (`LearnerFlag`), named after
the Ray node and job (`lease_key`), so a worker on another node never finds it and never
borrows, and a worker that finds no flag (yet) keeps to its own cores.

    flag = LearnerFlag(flag_path(lease_key()))     # the learner
    with flag.busy():
        ...                                        # an update: workers use their own cores
    borrower = Borrower(flag_path(lease_key()), own=1, lent=1, set_threads=...)
    borrower.before_step()                         # a worker, before each decode step
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
import tempfile
from collections.abc import Callable

BUSY, IDLE = b"\x01", b"\x00"


def flag_dir() -> str:
    """RAM-backed /dev/shm where there is one (a flag never touches a disk), else the temp dir."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def flag_path(key: str) -> str:
    """The flag file of `lease_key()` on this node."""
    return os.path.join(flag_dir(), f"homerl-learner-busy-{key}")


def remove_flag(key: str | None) -> None:
    """Remove the flag of `key` (a `lease_key()`) on this node, if there is one: the learner is
    killed, not closed, at the end of a run."""
    if key:
        with contextlib.suppress(FileNotFoundError):
            os.remove(flag_path(key))


def lease_key() -> str | None:
    """This process's Ray node and job (`<node id>-<job id>`): the learner and the workers of
    one run on one node share it, and two Ray clusters on one machine never do. None outside
    a Ray job."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        ctx = ray.get_runtime_context()
        return f"{ctx.get_node_id()[:16]}-{ctx.get_job_id()}"
    except Exception:  # noqa: BLE001 - no Ray, or no job context: nothing to share
        return None


def split_cores(cores: list[int], threads: int, index: int, workers: int,
                learner_threads: int) -> tuple[list[int], list[int]]:
    """(own, lent) cores of worker `index`: `threads` consecutive cores of `cores` each (wrapping
    round, as many workers as asked), and worker i's share of the cores no worker owns, which
    the learner uses: every `workers`-th of them from i, at most `learner_threads` in all."""
    own = [cores[(index * threads + j) % len(cores)] for j in range(min(threads, len(cores)))]
    free = cores[workers * threads:][:learner_threads]
    return own, free[index::workers]


class LearnerFlag:
    """The learner's side: a one-byte file, 1 while an update runs. Opened idle, in place: a
    replaced learner clears what a dead one left set, in the file the workers have mapped."""

    def __init__(self, path: str):
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, 1)
            self._map = mmap.mmap(fd, 1)
        finally:
            os.close(fd)  # the mapping keeps the file
        self._map[0:1] = IDLE

    @contextlib.contextmanager
    def busy(self):
        """Workers on this node keep to their own cores until the block ends."""
        self._map[0:1] = BUSY
        try:
            yield
        finally:
            self._map[0:1] = IDLE

    def close(self, remove: bool = True) -> None:
        self._map.close()
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)


class Borrower:
    """A worker's side: picks its thread count before each decode step from the learner's flag.

    own / lent: thread counts; set_threads: what changes the process's compute threads (torch's
    `set_num_threads` as it was before vLLM replaced it). `steps` counts decode steps per
    thread count (what tests and `stats` read).
    """

    def __init__(self, path: str | None, own: int, lent: int,
                 set_threads: Callable[[int], None]):
        self.path, self.own, self.lent, self.set_threads = path, own, lent, set_threads
        self._map = None
        set_threads(own)
        self.threads = own
        self.steps: collections.Counter[int] = collections.Counter()

    def learner_idle(self) -> bool:
        """The learner's flag reads idle; False while there is none (no learner on this node)."""
        if self._map is None:
            try:
                with open(self.path or "", "rb") as f:
                    self._map = mmap.mmap(f.fileno(), 1, access=mmap.ACCESS_READ)
            except (OSError, ValueError):  # no learner here (yet), or its file is still empty
                return False
        return self._map[0:1] == IDLE

    def pick(self) -> int:
        """Set the thread count the learner's flag allows now (all while it is idle); returns
        it. A weight load calls this too: it runs beside the learner's update."""
        want = self.own + self.lent if self.lent and self.learner_idle() else self.own
        if want != self.threads:
            self.set_threads(want)
            self.threads = want
        return want

    def before_step(self) -> None:
        self.steps[self.pick()] += 1

    def stats(self) -> dict:
        """Share of decode steps that ran on borrowed cores (since the last call)."""
        total = sum(self.steps.values())
        lent = sum(n for t, n in self.steps.items() if t > self.own)
        self.steps.clear()
        return {"lent_steps": lent, "steps": total}

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
