"""Which directories are runs of this project, and which one driver writes a run.

    RUN_DIR/.homerl-run            marker: written when a run is created (by the driver, or by
                                   the web app before it spawns the driver)
    RUN_DIR/.homerl-lock           flock'ed by the driver writing the run; holds its pid, host
                                   and start time
    RUN_DIR/config-history.jsonl   one row per start or resume: when, the command line, and the
                                   settings the resume changed (`--steps 80`: run.steps 40 -> 80)

`--run-dir D` takes a new, empty or pre-created (marker, nothing trained yet) directory and
refuses any other in one line; `--resume D` refuses a directory that is not a run. A second
driver on a run gets one line naming the holder; a dead holder's lock (flock released with its
process, even after SIGKILL) is taken over. The lock and the history are never opened through a
symbolic link. Every entry point that writes a run directory opens it through
`launch.cli.plan_run` and `claim_run` (`launch.train` and `launch.demo` by `open_run`,
`homerl.GRPOTrainer.train` directly).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time

from common import durable

MARKER = ".homerl-run"
LOCK = ".homerl-lock"
HISTORY = "config-history.jsonl"
OWN_FILES = {MARKER, LOCK, HISTORY}
"""what this module writes; a directory holding only these is still empty"""
TRAINED = ("metrics.jsonl", "summary.json", "final")
"""a run that holds one of these (or a checkpoint) has trained: continue it with --resume"""


class RunBusyError(RuntimeError):
    """Another live driver holds the run's lock; the message is one line naming it."""


def mark_run(run_dir: str) -> None:
    """Create `run_dir` (if needed) as a run of this project (idempotent)."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, MARKER)
    if not os.path.exists(path):
        durable.write_file(path, json.dumps({"created": time.strftime("%Y-%m-%d %H:%M:%S")})
                           + "\n")


def trained_files(run_dir: str) -> list[str]:
    """What in `run_dir` shows a run trained there (metrics, checkpoints, final weights)."""
    names = sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else []
    return [n for n in names if n in TRAINED or n.startswith("ckpt-")]


def is_run(run_dir: str) -> bool:
    """A run of this project: its marker, or (runs made before the marker) what a run trains."""
    return os.path.exists(os.path.join(run_dir, MARKER)) or bool(trained_files(run_dir))


def _listing(names: list[str], n: int = 3) -> str:
    more = f", +{len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def flag(name: str) -> str:
    """How the command line spells config field (or option) `name`: what the messages here
    and in launch/rundir/resume.py call it unless their caller spells it otherwise."""
    return {"run.run_dir": "--run-dir", "run.cores": "--cores"}.get(name, f"--{name}")


def why_not_new(run_dir: str, spell=flag) -> str | None:
    """Why a new run cannot go into `run_dir` (one line), or None: it is missing, empty, or a
    run created but not trained yet (the web app's)."""
    if not os.path.isdir(run_dir):
        return None
    trained = trained_files(run_dir)
    where, resume = spell("run.run_dir"), spell("resume")
    if trained:
        what = "metrics.jsonl" if "metrics.jsonl" in trained else _listing(trained)
        return (f"{where} {run_dir} already holds a run ({what}): continue it with {resume} "
                f"{run_dir}, or pick another {where}")
    names = sorted(set(os.listdir(run_dir)) - OWN_FILES)
    if names and not os.path.exists(os.path.join(run_dir, MARKER)):
        return (f"{where} {run_dir} is not empty and is not a homerl run (it holds "
                f"{_listing(names)}): pick a new or empty directory; to continue a run of "
                f"this project use {resume} RUN_DIR")
    return None


def why_not_run(run_dir: str, spell=flag) -> str | None:
    """Why a resume of `run_dir` cannot continue it (one line), or None."""
    if not os.path.isdir(run_dir):
        return f"{spell('resume')} {run_dir}: no such directory"
    if not is_run(run_dir):
        return (f"{spell('resume')} {run_dir}: not a homerl run (no {MARKER}, metrics.jsonl "
                "or checkpoint)")
    return None


class RunLock:
    """The flock on RUN_DIR/.homerl-lock, held while this process drives the run."""

    def __init__(self, fd: int, path: str):
        self.fd, self.path = fd, path
        self.created = False
        """this driver made the directory (so a refused start may remove it again)"""

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def lock_run(run_dir: str) -> RunLock:
    """Take the run's lock (its file written with this process's pid, host and start time), or
    raise RunBusyError naming the live holder. The fd is not inherited by child processes, so
    the lock goes with this process however it ends."""
    path = os.path.join(run_dir, LOCK)
    fd = _open_own(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise RunBusyError(f"{run_dir} is being written by another driver ({holder}); wait for "
                           f"it, or stop it first (touch {os.path.join(run_dir, 'STOP')})"
                           ) from None
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
    os.fsync(fd)
    return RunLock(fd, path)


def remove_if_untouched(run_dir: str, also: frozenset[str] = frozenset()) -> None:
    """Remove `run_dir` when it holds only this module's files and `also` (the entry point's
    own log, say): a new run refused before it wrote anything (a config the machine cannot
    hold) leaves no directory behind; one that holds anything else keeps all of it."""
    names = set(os.listdir(run_dir)) if os.path.isdir(run_dir) else {""}
    if names <= OWN_FILES | also:
        for name in names:
            os.remove(os.path.join(run_dir, name))
        os.rmdir(run_dir)


def _holder(fd: int) -> str:
    """The lock holder as `pid 123 on host h since 2025-01-01 10:00:00` (retried briefly: the
    holder writes it right after taking the lock)."""
    for _ in range(20):
        with contextlib.suppress(ValueError, OSError):
            info = json.loads(os.pread(fd, 4096, 0))
            return f"pid {info['pid']} on host {info['host']} since {info['since']}"
        time.sleep(0.05)
    return "holder unknown"


def record_history(run_dir: str, event: str, argv: list[str], changes: dict) -> None:
    """Append a row to RUN_DIR/config-history.jsonl (fsync'ed): `event` start or resume, the
    command line, and {field: [old, new]} for each setting a resume changed."""
    row = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "event": event, "argv": argv,
           "changes": changes}
    fd = _open_own(os.path.join(run_dir, HISTORY), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _open_own(path: str, flags: int) -> int:
    """Open one of this module's files, never through a symbolic link: a link planted in the
    run directory would make the lock's truncation or the history's append write to its
    target. A link there is an OSError naming the file (one line where the caller reports)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{path} is a symbolic link; remove it (homerl never "
                                       "follows one there)") from None
        raise
