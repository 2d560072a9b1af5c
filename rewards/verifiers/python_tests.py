"""The ``python-tests`` verifier: run a reply's Python code against the task's unit tests.

What passes. The sample's answer field holds the tests: Python source (at most
`MAX_TESTS_CHARS` characters) of plain ``assert`` statements and/or pytest-style
``def test...():`` functions without arguments. The reply's code is its last fenced
```` ```python ```` block (also ``py``, ``python3``); else its first fenced block of any
language; else the whole reply if it parses as Python; else error ``no_code``. The code runs
in a fresh module named ``solution``, then the tests in that same namespace, then each
top-level ``test...`` function of the tests is called in order (`rewards.sandbox.harness`). Score
1.0 when all of that ends without an exception within the limits (`Limits`), else 0.0;
``parsed`` is "pass" or "fail". Format score: 1.0 for a ``python`` block, 0.5 for another
fenced block, 0 for unfenced code.

Where it runs. Never in the verifier process: every item gets a fresh child process
(`run_tests`), by default isolated by `rewards.sandbox.jail` (new network, mount, PID, IPC and UTS
namespaces, a new root holding only the system's ``/usr`` and the interpreter, an
unprivileged uid, resource limits; its docstring is the full list). Where that isolation
cannot be set up, the verifier refuses: each item gets error ``no_sandbox``, and
`require_isolation` (for the trainer's start-up) raises `IsolationError` with one line
saying why. ``reward.unsandboxed_code`` (`configure(unsandboxed=True)`) runs the code
anyway, with a one-time warning, in a child with only the resource limits, an empty scratch
directory as cwd, a minimal environment and isolated interpreter flags: same user, same
network, same files. The tests are a check of honest code, not a proof against code written
to forge its result (it runs in the process that reports it).
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
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
from rewards.verifiers.text import checked_text

logger = logging.getLogger(__name__)

ITEM_TIMEOUT_S = 10.0
"""the verifier pool's per-item limit for this verifier (the code's own limits are below)"""
MAX_TESTS_CHARS = 100_000
SETUP_FAILED = 125  # rewards.sandbox.jail's exit status when the isolation could not be set up
_SANDBOX = Path(__file__).resolve().parents[1] / "sandbox"
_JAIL, _HARNESS = _SANDBOX / "jail.py", _SANDBOX / "harness.py"
"""run as programs (by path, standard library only), never imported"""
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


def _set_limits(limits: Limits) -> None:
    """In the unisolated child, before exec: the resource limits alone."""
    import resource

    for which, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, limits.cpu_s),
                         (resource.RLIMIT_AS, limits.memory_bytes),
                         (resource.RLIMIT_NPROC, limits.processes),
                         (resource.RLIMIT_FSIZE, limits.file_bytes),
                         (resource.RLIMIT_NOFILE, limits.open_files)):
        hard = resource.getrlimit(which)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, hard))


def _python() -> str:
    """The base interpreter (a venv's python resolves to it): only its stdlib is needed."""
    return os.path.realpath(sys.executable)


def _exposed(python: str) -> list[str]:
    """Directories outside /usr the isolated child needs: the interpreter's install."""
    dirs = {sys.base_prefix, sys.base_exec_prefix, os.path.dirname(python)}
    return sorted(d for d in dirs if d not in ("/", "/usr") and not d.startswith("/usr/"))


def _command(isolated: bool, launcher: Sequence[str] | None, limits: Limits,
             fds: tuple[int, int], scratch: str | None) -> tuple[list[str], dict]:
    """(argv, extra Popen arguments) of one run."""
    python = _python()
    if not isolated:
        harness = _HARNESS.read_text()
        env = {**_ENV, "HOME": scratch, "TMPDIR": scratch}
        return ([python, "-I", "-S", "-c", harness, *map(str, fds)],
                {"cwd": scratch, "env": env, "preexec_fn": lambda: _set_limits(limits)})
    cfg = {"parent": os.getpid(), "python": python, "harness": str(_HARNESS), "root": "/tmp",
           "expose": _exposed(python), "payload_fd": fds[0], "report_fd": fds[1],
           "limits": asdict(limits)}
    argv = list(launcher) if launcher is not None else [python, "-I", "-S", str(_JAIL)]
    return [*argv, json.dumps(cfg)], {"cwd": "/", "env": dict(_ENV)}


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_tests(code: str, tests: str, limits: Limits | None = None, isolated: bool = True,
              launcher: Sequence[str] | None = None) -> CodeRun:
    """Run `code` then `tests` (`rewards.sandbox.harness`) in a fresh child (module docstring).
    `limits`: default `LIMITS`; `launcher`: the argv that starts the isolation (default
    `rewards.sandbox.jail`)."""
    limits = limits or LIMITS
    nonce = secrets.token_hex(16)
    payload = json.dumps({"code": code, "tests": tests, "nonce": nonce}).encode()
    scratch = None if isolated else tempfile.mkdtemp(prefix="homerl-code-")
    try:
        with tempfile.TemporaryFile() as pay, tempfile.TemporaryFile() as report, \
                tempfile.TemporaryFile() as out:
            pay.write(payload)
            pay.flush()
            pay.seek(0)
            fds = (pay.fileno(), report.fileno())
            argv, extra = _command(isolated, launcher, limits, fds, scratch)
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    pass_fds=fds, start_new_session=True, **extra)
            try:
                returncode, timed_out = proc.wait(limits.wall_s), False
            except subprocess.TimeoutExpired:
                returncode, timed_out = None, True
            _kill(proc)  # the run's process group: what is left of it (isolated: nothing)
            proc.wait()
            report.seek(0)
            said = report.read(512).decode("utf-8", "replace").split("\n", 1)[0]
            output = _tail(out, limits.output_chars)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    setup = (said.removeprefix("setup-error ").strip() or "no reason given"
             if returncode == SETUP_FAILED and not said.startswith("passed") else None)
    passed = not timed_out and returncode == 0 and said == f"passed {nonce}"
    return CodeRun(passed, timed_out, returncode, output, setup)


_unsandboxed = False
_launcher: Sequence[str] | None = None
_isolation_reason: list[str | None] = []  # cached check_isolation(): [] while unknown
_told: set[str] = set()


def configure(unsandboxed: bool = False, launcher: Sequence[str] | None = None) -> None:
    """Set this process's policy: `unsandboxed` runs code unisolated where isolation is
    unavailable (reward.unsandboxed_code); `launcher` replaces `rewards.sandbox.jail` (tests)."""
    global _unsandboxed, _launcher
    _unsandboxed, _launcher = unsandboxed, launcher
    _isolation_reason.clear()
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
    """For the trainer's start-up when a python-tests task is configured: raise
    `IsolationError` (one line) when code cannot be isolated here, unless `unsandboxed`
    (then a one-time warning)."""
    reason = check_isolation()
    if reason is None:
        return
    if not unsandboxed:
        raise IsolationError(reason)
    _tell_once("unsafe", logging.WARNING, "reward.unsandboxed_code: running completions' "
               f"code WITHOUT isolation: {reason}")


def _mode() -> bool | None:
    """True: run isolated; False: unisolated (allowed); None: refuse."""
    if not _isolation_reason:
        _isolation_reason.append(_why_not_isolated(_launcher))
    why = _isolation_reason[0]
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
