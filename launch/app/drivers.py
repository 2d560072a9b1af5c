"""Is a run's driver alive? Decided from the process table (Linux /proc), never from the files a
run writes (metrics.jsonl, samples):

* a driver the app started: RUN_DIR/app.json's pid, alive, of this user, started when the app
  started it (its start time, kept in app.json, tells a reused pid apart) and with the run
  directory on its command line;
* a run started from a shell: the pid that RUN_DIR/.homerl-lock names (the driver writes it when
  it takes the lock), alive on this host, of this user, a `launch.` command, started no later
  than it took the lock (a later process is a reused pid).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time

from launch.rundir.ownership import LOCK

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc(pid: int) -> tuple[list[str], int, int] | None:
    """(argv, uid, start time in clock ticks since boot) of a live, non-zombie process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    if fields[0] in ("Z", "X"):
        return None
    return argv, uid, int(fields[19])  # stat's field 22, starttime


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (None if it is gone)."""
    found = _proc(pid)
    return found[2] if found else None


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise OSError("/proc/stat: no btime")


def app_driver_alive(run_dir: str, info: dict) -> bool:
    """Is app.json's (`info`) process alive and the driver the app started for `run_dir`?"""
    pid = info.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    found = _proc(pid)
    if found is None:
        return False
    argv, uid, ticks = found
    if uid != os.getuid() or ("ticks" in info and info["ticks"] != ticks):
        return False
    real = os.path.realpath(run_dir)
    return "launch.train" in argv and any(os.path.realpath(a) == real for a in argv if a)


def lock_holder_alive(run_dir: str) -> bool:
    """Is the process named in RUN_DIR/.homerl-lock alive and a driver that took it?"""
    info = {}
    with contextlib.suppress(OSError, ValueError), open(os.path.join(run_dir, LOCK)) as f:
        info = json.load(f)
    if not isinstance(info, dict) or info.get("host") != socket.gethostname():
        return False
    pid = info.get("pid")
    found = _proc(pid) if isinstance(pid, int) and pid > 0 else None
    if found is None:
        return False
    argv, uid, ticks = found
    try:
        since = time.mktime(time.strptime(str(info.get("since")), "%Y-%m-%d %H:%M:%S"))
        started = _boot_time() + ticks / _CLOCK_TICKS
    except (OSError, ValueError, OverflowError):
        return False
    return uid == os.getuid() and started <= since + 2 and "launch." in " ".join(argv)
