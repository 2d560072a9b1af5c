"""The ``python-tests`` verifier: run a reply's Python code against the task's unit tests.

What passes. The sample's answer field holds the tests: Python source (at most
`MAX_TESTS_CHARS` characters) of plain ``assert`` statements and/or pytest-style
``def test...():`` functions without arguments. The reply's code is its last fenced
```` ```python ```` block (also ``py``, ``python3``); else its first fenced block of any
language; else the whole reply if it parses as Python; else error ``no_code``. The code runs
as a fresh module named ``solution`` in one process (the candidate); the tests run in another
(the judge), where the names they use but do not define are the module's, and then each
top-level ``test...`` function of the tests is called in order (`rewards.sandbox.harness`;
values cross between the two as copies or handles, `rewards.sandbox.wire`). The tests' ``==``
is checked: a value of a built-in type equals only a value of the same type
(`rewards.sandbox.asserts`). Score 1.0 when all of that ends without an exception within the
limits (`Limits`), and the candidate's process lived to the end, else 0.0; ``parsed`` is
"pass" or "fail". Format score: 1.0 for a ``python`` block, 0.5 for another fenced block, 0
for unfenced code.

Where it runs. Never in the verifier process: every item gets a fresh child process
(`run_tests`), by default isolated by `rewards.sandbox.jail` (new network, mount, PID, IPC and UTS
namespaces, a new root holding only the system's ``/usr`` and the interpreter, an
unprivileged uid, resource limits; its docstring is the full list). Where that isolation
cannot be set up, the verifier refuses: each item gets error ``no_sandbox`` (the probe is
tried again after `PROBE_RETRY_S`), and `require_isolation` (for the start-up of anything
that may run python-tests) raises `IsolationError` with one line saying why.
``reward.unsandboxed_code`` (`configure(unsandboxed=True)`) runs the code anyway, with a
one-time warning, under `rewards.sandbox.reaper`: the resource limits, an empty scratch
directory as cwd, a minimal environment (its parent's too), isolated interpreter flags, and
every process it leaves killed at the end: same user, same network, same files.

Only the judge can report a pass, with a nonce the candidate never sees: nothing the
candidate's code does passes the tests but answering them right (docs/tasks.md, Verifiers,
lists what is defended and what is not).
"""

from __future__ import annotations

import ast
import functools
import glob
import json
import logging
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rewards.result import (
    BAD_REFERENCE,
    NO_CODE,
    NO_SANDBOX,
    TIMEOUT,
    VERIFIER_CRASH,
    RewardResult,
    error_result,
)
from rewards.sandbox import harness
from rewards.verifiers.text import checked_text

logger = logging.getLogger(__name__)

ITEM_TIMEOUT_S = 10.0
"""the verifier pool's per-item limit for this verifier (the code's own limits are below)"""
MAX_TESTS_CHARS = 100_000
SETUP_FAILED = 125  # rewards.sandbox.jail's exit status when the isolation could not be set up
TIMED_OUT = 124  # rewards.sandbox.reaper's exit status when the code ran past its limit
PROBE_RETRY_S = 30.0
"""after a failed isolation probe, items are refused for this long before it is tried again"""
UNSANDBOXED_GRACE_S = 5.0
"""unisolated: how long past the wall-clock limit the reaper gets to clean up"""
_SANDBOX = Path(__file__).resolve().parents[1] / "sandbox"
_JAIL, _REAPER = _SANDBOX / "jail.py", _SANDBOX / "reaper.py"
"""run as programs (by path, standard library only), never imported"""
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""what the isolated child holds anyway"""
_FENCE_RE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)(?:```|\Z)", re.S)
_PYTHON_TAGS = frozenset({"python", "py", "python3"})
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "2"}


class IsolationError(RuntimeError):
    """The code of completions cannot be isolated here, and running it unisolated is off."""


@dataclass(frozen=True)
class Limits:
    """What one run of a reply's code may use."""

    wall_s: float = 6.0
    cpu_s: int = 5
    """CPU seconds per process (then SIGKILL one second later)"""
    memory_bytes: int = 512 * 2**20
    """address space per process (RLIMIT_AS)"""
    processes: int = 8
    """processes and threads of the run's own uid (RLIMIT_NPROC)"""
    file_bytes: int = 2**20
    """largest file it may write, its captured output included (RLIMIT_FSIZE)"""
    open_files: int = 64
    scratch_bytes: int = 16 * 2**20
    """size of its /tmp (isolated runs)"""
    output_chars: int = 4000
    """the tail of its stdout and stderr kept in `CodeRun.output`"""


LIMITS = Limits()


@dataclass(frozen=True)
class CodeRun:
    """What one run of code and tests came to."""

    passed: bool
    timed_out: bool = False
    returncode: int | None = None
    output: str = ""
    """the tail of its stdout and stderr"""
    setup_error: str | None = None
    """why the isolation could not be set up (the code did not run)"""


def _is_python(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, OverflowError):
        return False
    return True


def extract_code(text: str) -> tuple[str | None, float]:
    """(the reply's code, format score): the last ```python block (1.0), else the first
    fenced block (0.5), else the whole reply if it parses as Python (0); None: no code."""
    blocks = [(tag.split()[0].casefold() if tag.split() else "", body)
              for tag, body in _FENCE_RE.findall(text)]
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    code, fmt = ((python[-1], 1.0) if python else (blocks[0][1], 0.5) if blocks
                 else (text, 0.0) if _is_python(text) else (None, 0.0))
    return (code, fmt) if code is not None and code.strip() else (None, fmt)


def parse_tests(answer: object) -> str | None:
    """The tests of a sample's answer field; None when unusable (not text, empty, too long,
    or not Python)."""
    if not isinstance(answer, str) or not answer.strip() or len(answer) > MAX_TESTS_CHARS:
        return None
    return answer if _is_python(answer) else None


def _tail(f, chars: int) -> str:
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - 4 * chars))
    return f.read().decode("utf-8", "replace")[-chars:]


def _python() -> str:
    """The base interpreter (a venv's python resolves to it): only its stdlib is needed."""
    return os.path.realpath(sys.executable)


def _is_system(path: str) -> bool:
    return path == "/" or any(path == d or path.startswith(d + "/") for d in _SYSTEM)


def _interpreter(python: str) -> tuple[list[str], list[str]]:
    """(paths the isolated child binds, directories it hides) so that the interpreter runs
    where it lives outside /usr (pyenv, conda: a home directory): its binary, the shared
    libraries of its lib directory, its standard library without site-packages; nothing else
    of its install prefix."""
    stdlib = os.path.dirname(os.__file__)
    paths = {python, stdlib, sysconfig.get_config_var("DESTSHARED") or stdlib}
    libdir = sysconfig.get_config_var("LIBDIR")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir:
        paths.update(p for p in glob.glob(os.path.join(glob.escape(libdir), "*.so*"))
                     if os.path.isfile(p))
    paths = {os.path.abspath(p) for p in paths if not _is_system(os.path.abspath(p))}
    expose = sorted(p for p in paths if not any(p.startswith(d + "/") for d in paths))
    hide = [d for d in (os.path.join(stdlib, "site-packages"),) if os.path.isdir(d)]
    return expose, hide


@functools.lru_cache(maxsize=1)
def _program() -> str:
    return harness.program()


def _command(isolated: bool, launcher: Sequence[str] | None, limits: Limits,
             fds: tuple[int, int], scratch: str | None) -> tuple[list[str], dict]:
    """(argv, extra Popen arguments) of one run."""
    python = _python()
    if not isolated:
        env = {**_ENV, "HOME": scratch, "TMPDIR": scratch}
        cfg = {"parent": os.getpid(), "cwd": scratch, "limits": asdict(limits),
               "wall_s": limits.wall_s,
               "argv": [python, "-I", "-S", "-c", _program(), *map(str, fds)]}
        return ([python, "-I", "-S", str(_REAPER), json.dumps(cfg)],
                {"cwd": scratch, "env": env})
    expose, hide = _interpreter(python)
    cfg = {"parent": os.getpid(), "python": python, "program": _program(), "root": "/tmp",
           "expose": expose, "hide": hide, "payload_fd": fds[0], "report_fd": fds[1],
           "limits": asdict(limits)}
    argv = list(launcher) if launcher is not None else [python, "-I", "-S", str(_JAIL)]
    return [*argv, json.dumps(cfg)], {"cwd": "/", "env": dict(_ENV)}


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait(proc: subprocess.Popen, timeout_s: float) -> int | None:
    """`proc`'s exit status, or None once `timeout_s` passed; woken by the exit itself (a
    pidfd) where Linux offers one: Popen.wait(timeout) polls, noticing an exit up to 50 ms
    late."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
    try:
        ready = select.poll()
        ready.register(fd, select.POLLIN)
        if not ready.poll(max(1, int(timeout_s * 1000))):
            return None
    finally:
        os.close(fd)
    return proc.wait()


def _start(argv: list[str], extra: dict, fds: tuple[int, int], out) -> subprocess.Popen:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                            pass_fds=fds, start_new_session=True, **extra)


def run_tests(code: str, tests: str, limits: Limits | None = None, isolated: bool = True,
              launcher: Sequence[str] | None = None) -> CodeRun:
    """Run `code` against `tests` (`rewards.sandbox.harness`) in a fresh child (module
    docstring). `limits`: default `LIMITS`; `launcher`: the argv that starts the isolation
    (default `rewards.sandbox.jail`)."""
    limits = limits or LIMITS
    nonce = secrets.token_hex(16)
    payload = json.dumps({"code": code, "tests": tests, "processes": limits.processes}).encode()
    scratch = None if isolated else tempfile.mkdtemp(prefix="homerl-code-")
    wait_s = limits.wall_s if isolated else limits.wall_s + UNSANDBOXED_GRACE_S
    try:
        with tempfile.TemporaryFile() as pay, tempfile.TemporaryFile() as report, \
                tempfile.TemporaryFile() as out:
            pay.write(payload)
            report.write(f"{nonce}\n".encode())  # for the judge alone (it truncates it)
            for f in (pay, report):
                f.flush()
                f.seek(0)
            fds = (pay.fileno(), report.fileno())
            proc = _start(*_command(isolated, launcher, limits, fds, scratch), fds, out)
            returncode = _wait(proc, wait_s)
            timed_out = returncode is None
            _kill(proc)  # the run's process group: what is left of it (isolated: nothing)
            proc.wait()
            timed_out = timed_out or (not isolated and returncode == TIMED_OUT)
            report.seek(0)
            said = report.read(512).decode("utf-8", "replace").split("\n", 1)[0]
            output = _tail(out, limits.output_chars)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    setup = None
    if returncode == SETUP_FAILED and not said.startswith("passed"):
        setup = (said.removeprefix("setup-error ").strip() if said.startswith("setup-error")
                 else "") or "no reason given"
    passed = not timed_out and returncode == 0 and said == f"passed {nonce}"
    return CodeRun(passed, timed_out, returncode, output, setup)


_unsandboxed = False
_launcher: Sequence[str] | None = None
_probe: list[tuple[str | None, float]] = []  # the last probe: (why not, when); [] while unknown
_told: set[str] = set()


def configure(unsandboxed: bool = False, launcher: Sequence[str] | None = None) -> None:
    """Set this process's policy: `unsandboxed` runs code unisolated where isolation is
    unavailable (reward.unsandboxed_code); `launcher` replaces `rewards.sandbox.jail` (tests)."""
    global _unsandboxed, _launcher
    _unsandboxed, _launcher = unsandboxed, launcher
    _probe.clear()
    _told.clear()


def _why_not_isolated(launcher: Sequence[str] | None) -> str | None:
    """None when a trivial run through the launcher passes, else why it did not."""
    run = run_tests("pass", "pass", Limits(wall_s=30.0), True, launcher or _launcher)
    if run.passed:
        return None
    if run.setup_error or run.timed_out:
        return run.setup_error or "the isolation probe timed out"
    last = (run.output.strip().splitlines() or ["no output"])[-1]
    return f"the isolation probe exited with {run.returncode}: {last}"


def check_isolation(launcher: Sequence[str] | None = None) -> str | None:
    """None when this machine can isolate completions' code, else one line saying why not
    and what to do. `launcher`: the argv that starts the isolation (default
    `rewards.sandbox.jail`)."""
    why = _why_not_isolated(launcher)
    return None if why is None else (
        f"python-tests: cannot isolate the code of completions here ({why}); "
        "--reward.unsandboxed_code true runs it without isolation "
        "(UNSAFE: only for code you trust)")


def _tell_once(key: str, level: int, line: str) -> None:
    if key not in _told:
        _told.add(key)
        logger.log(level, line)


def require_isolation(unsandboxed: bool = False) -> None:
    """For the start-up of anything that may run python-tests (a run whose curriculum or
    reward.fn names it, an evaluation of such a set): raise `IsolationError` (one line) when
    code cannot be isolated here, unless `unsandboxed` (then a one-time warning). Probes
    afresh each call."""
    reason = check_isolation()
    if reason is None:
        return
    if not unsandboxed:
        raise IsolationError(reason)
    _tell_once("unsafe", logging.WARNING, "reward.unsandboxed_code: running completions' "
               f"code WITHOUT isolation: {reason}")


def _mode() -> bool | None:
    """True: run isolated; False: unisolated (allowed); None: refuse. A passed probe holds
    for the process's life, a failed one for `PROBE_RETRY_S` (it may have been the load)."""
    if not _probe or (_probe[0][0] is not None
                      and time.monotonic() - _probe[0][1] >= PROBE_RETRY_S):
        _probe[:] = [(_why_not_isolated(_launcher), time.monotonic())]
    why = _probe[0][0]
    if why is None:
        return True
    if _unsandboxed:
        _tell_once("unsafe", logging.WARNING, "reward.unsandboxed_code: running completions' "
                   f"code WITHOUT isolation ({why})")
        return False
    _tell_once("refuse", logging.ERROR, f"python-tests: refusing to run completions' code: "
               f"cannot isolate it here ({why}); every item scores 0 (no_sandbox)")
    return None


def _python_tests(completion: object, answer: object) -> RewardResult:
    tests = parse_tests(answer)
    if tests is None:
        return error_result(BAD_REFERENCE)
    text, error = checked_text(completion)
    if error is not None:
        return error_result(error)
    code, fmt = extract_code(text)
    if code is None:
        return RewardResult(0.0, fmt, None, NO_CODE)
    isolated = _mode()
    if isolated is None:
        return RewardResult(0.0, fmt, None, NO_SANDBOX)
    run = run_tests(code, tests, isolated=isolated, launcher=_launcher)
    if run.setup_error is not None:
        logger.warning("python-tests: isolation failed on one item: %s", run.setup_error)
        return RewardResult(0.0, fmt, None, VERIFIER_CRASH)
    if run.timed_out:
        return RewardResult(0.0, fmt, "fail", TIMEOUT)
    return RewardResult(1.0 if run.passed else 0.0, fmt, "pass" if run.passed else "fail", None)


def python_tests(completion: object, answer: object, style: str | None = None) -> RewardResult:
    """Score a reply's code against the unit tests in `answer` (module docstring); `style`
    is ignored. Never raises (a MemoryError is left to the verifier pool)."""
    try:
        return _python_tests(completion, answer)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - contract: never raise; the code makes it visible
        logger.exception("python-tests verifier crashed")
        return error_result(VERIFIER_CRASH)
