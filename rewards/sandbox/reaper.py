"""The launcher of a reply's code when it runs WITHOUT isolation (``reward.unsandboxed_code``).

Not imported: `rewards.verifiers.python_tests` runs ``python -I -S reaper.py CONFIG_JSON``
(standard library only) with the minimal environment the code gets, and the payload and report
descriptors passed open. It:

1. makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process the code starts
   whose parent exits (a double fork, a daemon, a new session) becomes its child, not init's;
2. starts the harness (``argv``) in ``cwd`` with the resource limits, and since its own
   environment is the minimal one, the code's parent and grandparent (``/proc/PPID/environ``)
   show nothing of the verifier's environment;
3. waits until the harness exits or ``wall_s`` passes, then stops (SIGSTOP, so nothing forks
   any more) and kills every process left below it, found through ``/proc``, and reaps them;
4. exits with the harness's status, 128 + its signal, or `TIMED_OUT`.

If the verifier dies it gets SIGTERM (``PR_SET_PDEATHSIG``) and does step 3 at once. Code that
kills this launcher first (it runs as the same user) can leave processes behind: unisolated
code is trusted code.
"""

import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

TIMED_OUT = 124
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
_LIMITS = (("RLIMIT_CORE", "core"), ("RLIMIT_CPU", "cpu_s"), ("RLIMIT_AS", "memory_bytes"),
           ("RLIMIT_FSIZE", "file_bytes"), ("RLIMIT_NOFILE", "open_files"))
_libc = ctypes.CDLL(None, use_errno=True)


class _Stop(Exception):
    """The verifier is gone (SIGTERM from PR_SET_PDEATHSIG)."""


def _set_limits(limits):
    """In the harness's process before exec; RLIMIT_NPROC the harness sets itself after it
    forked (the user's other processes count against it)."""
    for name, key in _LIMITS:
        which = getattr(resource, name)
        value = 0 if key == "core" else int(limits[key])
        hard = resource.getrlimit(which)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, hard))


def descendants(pid):
    """Pids of every process below `pid`, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _signal_all(pids, signum):
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _reap():
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def kill_descendants(group, deadline_s=5.0):
    """Stop every process below this one until no new one appears, then kill and reap them;
    without a readable /proc, the harness's process `group` alone."""
    try:
        descendants(os.getpid())
    except OSError:
        _signal_all([-group], signal.SIGKILL)
        return _reap()
    me, stopped, end = os.getpid(), set(), time.monotonic() + deadline_s
    while time.monotonic() < end:
        fresh = [p for p in descendants(me) if p not in stopped]
        if not fresh:
            break
        _signal_all(fresh, signal.SIGSTOP)
        stopped.update(fresh)
    _signal_all(stopped, signal.SIGKILL)
    while time.monotonic() < end:
        _reap()
        left = descendants(me)
        if not left:
            return
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.01)


def _wait(pid, wall_s):
    """The harness's exit status, or None when it ran past `wall_s`."""
    end = time.monotonic() + wall_s
    try:
        ready = select.poll()
        ready.register(os.pidfd_open(pid), select.POLLIN)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): look every 5 ms
        ready = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        left = end - time.monotonic()
        if left <= 0:
            return None
        if ready is not None:
            ready.poll(max(1, int(left * 1000)))
        else:
            time.sleep(min(left, 0.005))


def _on_term(signum, frame):
    raise _Stop


def main(cfg):
    signal.signal(signal.SIGTERM, _on_term)
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 \
            or _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        sys.exit(f"reaper: prctl: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != cfg["parent"]:
        sys.exit("reaper: the verifier process is gone")
    status = pid = None
    try:
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                os.chdir(cfg["cwd"])
                _set_limits(cfg["limits"])
                os.execve(cfg["argv"][0], cfg["argv"], dict(os.environ))
            finally:
                os._exit(127)
        status = _wait(pid, float(cfg["wall_s"]))
    except _Stop:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if pid is not None:
            kill_descendants(pid)
    if status is None:
        os._exit(TIMED_OUT)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
