"""Where a vLLM worker writes each pushed LoRA adapter for the engine to read (adapter mode).

vLLM loads an adapter from a peft directory, so every push is written to files first: ~74 MB
(fp32) for r=16 on all seven linears of a 1.5B Qwen2. `/dev/shm` (RAM) is tried first, so no
disk is touched; Docker gives a container a 64 MB `/dev/shm` by default, too small for one.
Each push checks the room it needs:

* room for the new adapter beside the held one: the new one is written, then the old one is
  dropped (the engine serves a complete adapter at every moment);
* room for one only, where the held one is: the old one is dropped first, then the new one
  is written (nothing generates in between: a worker runs one call at a time);
* no room in `/dev/shm`: a directory on disk (`tempfile.gettempdir()`), checked the same way;
* nowhere: a one-line `AdapterRoomError` naming the fix (`--shm-size`, or
  `HOMERL_ADAPTER_DIR`, which, when set, is the only place used).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable

import numpy as np

SHM = "/dev/shm"
MARGIN = 8 * 2**20
"""bytes kept free beyond an adapter's tensors (its config and the file system's own)"""
MB = 2**20


class AdapterRoomError(RuntimeError):
    """No directory has room for a pushed adapter."""


def free_bytes(path: str) -> int:
    """Free bytes of the file system holding `path` (what an unprivileged writer may use)."""
    return shutil.disk_usage(path).free


def adapter_bytes(update) -> int:
    """Bytes the adapter directory of a LoRA `update` takes: its tensors in fp32."""
    return sum(np.asarray(v).size * 4 for v in update.tensors.values()) + 64 * 1024


def default_roots() -> list[str]:
    """HOMERL_ADAPTER_DIR alone when set; else /dev/shm, then the temp dir on disk."""
    if os.environ.get("HOMERL_ADAPTER_DIR"):
        return [os.environ["HOMERL_ADAPTER_DIR"]]
    return [SHM, tempfile.gettempdir()]


class AdapterFiles:
    """The adapter directories of one worker: one held by the engine, the next being written."""

    def __init__(self, name: str, roots: list[str] | None = None,
                 free: Callable[[str], int] = free_bytes):
        self.name, self.free = name, free
        self.roots = roots or default_roots()
        self.dirs: dict[str, str] = {}  # root -> this worker's temp dir under it
        self.current: str | None = None
        """the adapter directory the engine loaded last"""
        self.current_bytes = 0
        self.seq = 0

    def write(self, update, write: Callable[[str], str], drop_old: Callable[[], None]) -> str:
        """Write `update` with `write(path) -> path` where there is room; `drop_old()` removes
        the held adapter from the engine (it is called before the write only when the held
        files must make room). Returns the new adapter's directory."""
        need = adapter_bytes(update)
        root, beside = self._place(need)
        if not beside:
            drop_old()
            self.remove_current()
        self.seq += 1
        out = write(os.path.join(self._dir(root), f"a{self.seq}"))
        drop_old()
        self.remove_current()
        self.current, self.current_bytes = out, need
        return out

    def _place(self, need: int) -> tuple[str, bool]:
        """(root, room for both old and new) of the first root with room for `need`."""
        seen = []
        for root in self.roots:
            if not os.path.isdir(root):
                continue
            free = self.free(root)
            seen.append(f"{root} has {free / MB:.0f} MB free")
            if free >= need + MARGIN:
                return root, True
            if self._holds_current(root) and free + self.current_bytes >= need + MARGIN:
                return root, False
        raise AdapterRoomError(
            f"{self.name}: no room for a {need / MB:.0f} MB LoRA adapter ("
            + (", ".join(seen) or f"none of {', '.join(self.roots)} exists")
            + "); give the container a bigger /dev/shm (docker run --shm-size=1g) or set "
            "HOMERL_ADAPTER_DIR to a directory with room")

    def _holds_current(self, root: str) -> bool:
        return self.current is not None and self.dirs.get(root) == os.path.dirname(self.current)

    def _dir(self, root: str) -> str:
        if root not in self.dirs:
            self.dirs[root] = tempfile.mkdtemp(prefix=f"homerl-{self.name}-lora-", dir=root)
        return self.dirs[root]

    def remove_current(self) -> None:
        """Delete the held adapter's files (the engine has already read them)."""
        if self.current is not None:
            shutil.rmtree(self.current, ignore_errors=True)
            self.current, self.current_bytes = None, 0

    def close(self) -> None:
        for d in self.dirs.values():
            shutil.rmtree(d, ignore_errors=True)
        self.dirs, self.current = {}, None
