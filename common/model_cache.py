"""homerl's model cache: folders built once per machine and shared by every process.

    cache_dir()                      $HOMERL_CACHE or ~/.cache/homerl
    materialize(name, build, meta)   cache_dir()/models/NAME, built by build(tmp) if missing
    entries()                        (folder, marker) of every complete entry
    remove(name)                     delete an entry, under its build lock

A build the disk refuses (full, read-only, no permission) raises CacheWriteError: one line
naming the cache folder and what to do, for the actor that hit it to report.

A build writes into a temporary folder beside the final one, the completion marker goes in
last and the folder is renamed into place, so readers only ever see complete entries;
concurrent builders (Ray actors resolving one model at once) wait on a lock.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

try:  # Advisory locks only exist on POSIX; elsewhere concurrent builds just race harmlessly.
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None

# Bump when the recipe of a cached entry changes, so stale caches are rebuilt.
CACHE_FORMAT = 1
MARKER = ".homerl-complete"

class CacheWriteError(OSError):
    """A cache entry that could not be written; the message is one line saying what to do."""


def cache_dir() -> Path:
    """Root of homerl's cache: ``$HOMERL_CACHE`` or ``~/.cache/homerl``."""
    root = os.environ.get("HOMERL_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "homerl"


def models_dir() -> Path:
    return cache_dir() / "models"


def is_complete(path: Path) -> bool:
    """True when ``path`` holds a finished cache entry of the current format."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("format") == CACHE_FORMAT


@contextlib.contextmanager
def build_lock(parent: Path, name: str):
    """Serialise builds of one entry across processes (Ray actors resolving at once)."""
    if fcntl is None:  # pragma: no cover - non-POSIX
        yield
        return
    with open(parent / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def materialize(name: str, build, meta: dict | None = None,
                hint: Callable[[], str] = lambda: "") -> Path:
    """Return the cached entry ``name``, building it with ``build(tmp_dir)`` if missing.

    The build writes into a temp dir next to the final one; the marker (with ``meta`` in it)
    goes in last and the directory is renamed into place, so readers only ever see complete
    entries. A disk that refuses it (`REFUSED`) is a CacheWriteError, its message ending in
    ``hint()`` (called only then: it may stat the source).
    """
    final = models_dir() / name
    if is_complete(final):  # fast path: no lock, no imports
        return final
    try:
        return _build(final, build, meta)
    except OSError as e:
        if isinstance(e, CacheWriteError) or e.errno not in REFUSED:
            raise
        why = f"{e.strerror}: {e.filename}" if e.filename else e.strerror
        raise CacheWriteError(
            f"the model cache {final.parent} could not take {name} ({why}); free space there, "
            f"or set HOMERL_CACHE to a folder on a disk with room{hint()}") from e


REFUSED = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
"""the errors of a disk that will not take an entry (full, over quota, read-only, not ours)"""


def _build(final: Path, build, meta: dict | None) -> Path:
    name = final.name
    final.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(final.parent, name):
        if is_complete(final):  # another process finished while we waited
            return final
        if fcntl is not None:  # holding the lock, any temp dir left over is from a dead build
            for stale in final.parent.glob(f".{name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=final.parent))
        try:
            build(tmp)
            marker = {**(meta or {}), "format": CACHE_FORMAT, "name": name,
                      "created": time.time()}
            (tmp / MARKER).write_text(json.dumps(marker))
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the cache may be shared between users
            if final.exists():  # outdated or half-deleted entry: move aside, then replace
                _move_aside_and_delete(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _move_aside_and_delete(entry: Path) -> None:
    """Rename first (readers never see a half-deleted entry under its name), then delete. A
    process that has the files open or mapped keeps them: they are unlinked, not truncated."""
    old = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
    os.rename(entry, old / "old")
    shutil.rmtree(old, ignore_errors=True)


def entries() -> list[tuple[Path, dict]]:
    """(folder, marker) of every complete entry of the current format."""
    found = []
    for path in sorted(models_dir().glob("[!.]*")):
        try:
            marker = json.loads((path / MARKER).read_text())
        except (OSError, ValueError):
            continue
        if marker.get("format") == CACHE_FORMAT:
            found.append((path, marker))
    return found


def remove(name: str) -> None:
    """Delete the entry ``name`` (if it is there) under its build lock."""
    final = models_dir() / name
    with build_lock(final.parent, name):
        if final.exists():
            _move_aside_and_delete(final)
