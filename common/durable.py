"""Writes that survive a crash or a power cut, and the hook that tests cut them with.

    write_file(path, text)       temp file, fsync, rename, fsync the directory: whole or absent
    fsync_file(path) / fsync_dir(path) / fsync_tree(path)
    rename(src, dst) / remove_tree(path)   the same os calls, each followed by a cut point
    os_error(err, path)          an exception as an OSError with its errno (or None)
    disk_full(err)               ENOSPC or EDQUOT

A file renamed into place before its data reaches the disk can be empty after a power cut, and
a rename is not on disk until its directory is fsync'ed: checkpoints fsync each file, then the
directories, before anything older is removed.

Fault injection: every primitive here calls `cut(event, path)` after it acts. `HOOK`, when
set, is called with both (tests record the order of writes, fsyncs, renames and removals);
`HOMERL_CUT_AT=N` in the environment SIGKILLs this process at its Nth cut (tests sweep N over
every cut point of a checkpoint write and check that a whole checkpoint always survives).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
from collections.abc import Callable

CUT_ENV = "HOMERL_CUT_AT"
HOOK: Callable[[str, str], None] | None = None
"""called as HOOK(event, path) at every cut point: write, fsync, rename, remove"""
_cuts = 0
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def cut(event: str, path: str = "") -> None:
    """A cut point: report it to HOOK; with HOMERL_CUT_AT=N, SIGKILL this process at the Nth."""
    global _cuts
    if HOOK is not None:
        HOOK(event, path)
    at = os.environ.get(CUT_ENV)
    if at:
        _cuts += 1
        if _cuts == int(at):
            os.kill(os.getpid(), signal.SIGKILL)


def _fsync(path: str, flags: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    cut("fsync", path)


def fsync_file(path: str) -> None:
    _fsync(path)


def fsync_dir(path: str) -> None:
    """Make the entries of directory `path` (files created, renamed or removed) durable."""
    _fsync(path, getattr(os, "O_DIRECTORY", 0))


def fsync_tree(path: str) -> None:
    """fsync every file under `path`, then every directory, deepest first."""
    dirs = []
    for root, _, files in os.walk(path):
        dirs.append(root)
        for name in files:
            fsync_file(os.path.join(root, name))
    for d in reversed(dirs):
        fsync_dir(d)


def write_file(path: str, text: str) -> None:
    """Replace `path` with `text` whole or not at all, durably: a temp file beside it is
    written and fsync'ed, renamed over `path`, and the directory fsync'ed."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            cut("write", tmp)
            os.fsync(f.fileno())
        cut("fsync", tmp)
        rename(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
    fsync_dir(os.path.dirname(path) or ".")


def rename(src: str, dst: str) -> None:
    os.rename(src, dst)
    cut("rename", f"{src} -> {dst}")


def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    cut("remove", path)


_OS_ERROR = re.compile(r"\(os error (\d+)\)|code: (\d+)")


def os_error(err: BaseException, path: str) -> OSError | None:
    """`err` as an OSError naming `path`, with its errno: an OSError itself, or a library's
    wrapper that quotes the OS error (safetensors: `I/O error: No space left on device (os
    error 28)`). None for anything else (a bug, not the disk)."""
    if isinstance(err, OSError):
        code = err.errno
    else:
        found = _OS_ERROR.search(str(err))
        if found is None:
            return OSError(errno.EIO, f"{err}", path) if "I/O error" in str(err) else None
        code = int(found.group(1) or found.group(2))
    if code is None:
        return OSError(f"{path}: {err}")
    return OSError(code, os.strerror(code), path)


def disk_full(err: BaseException) -> bool:
    """A full disk or an exceeded quota, by errno (also through `os_error`'s wrappers)."""
    found = err if isinstance(err, OSError) else os_error(err, "")
    return found is not None and found.errno in DISK_FULL
