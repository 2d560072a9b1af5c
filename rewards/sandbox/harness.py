"""The program that runs a reply's code against its unit tests (`rewards.verifiers.python_tests`).

`program()` is its source: this module and the ones it uses (`wire`, `asserts`, `candidate`,
`judge`), loaded from text, since the child sees no files of the repository. It runs as
``python -I -S -c <program> PAYLOAD_FD REPORT_FD`` inside the isolated child that
`rewards.sandbox.jail` sets up (or, unisolated, under `rewards.sandbox.reaper`). Standard library
only.

Two processes. The harness forks at once, before it reads anything:

* the candidate (`rewards.sandbox.candidate`), which closes both descriptors, gets the reply's
  code and runs it, then answers requests on its objects;
* the judge (`rewards.sandbox.judge`): this process. It makes itself undumpable (so the
  candidate, its own uid, cannot ptrace it or read its memory), reads the nonce from the report
  file (the verifier wrote it there; the judge truncates it), reads the payload (JSON:
  ``code``, ``tests``, ``processes``), sends the candidate the code and runs the tests against
  it: the tests' statements, then each top-level ``def test...`` function in order.

Only when all of that ends without an exception, the candidate's process lived to the end and
exited cleanly, does the judge write ``passed <nonce>`` to REPORT_FD. As PID 1 of the jail's PID
namespace it cannot be killed from inside; unisolated, a killed judge reports nothing.
"""

import json
import os
import signal
import sys
import time
import traceback

from rewards.sandbox import candidate, judge, wire

MODULES = ("wire", "asserts", "candidate", "judge", "harness")
"""this package's modules the program holds, in the order they load"""
PR_SET_DUMPABLE = 4
GRACE_S = 0.5
"""after a fail, how long the candidate gets to exit (and flush what it printed)"""
_BOOT = '''import sys, types
def _load(sources):
    for name in ("rewards", "rewards.sandbox"):
        package = types.ModuleType(name)
        package.__path__ = []
        sys.modules[name] = package
    for name, source in sources:
        module = types.ModuleType(name)
        sys.modules[name] = module
        setattr(sys.modules["rewards.sandbox"], name.rsplit(".", 1)[1], module)
        exec(compile(source, name.replace(".", "/") + ".py", "exec", dont_inherit=True),
             module.__dict__)
_load(%r)
del _load
sys.modules["rewards.sandbox.harness"].main(sys.argv[1:])
'''


def program() -> str:
    """The harness program's source (for ``python -I -S -c``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sources = []
    for name in MODULES:
        with open(os.path.join(here, f"{name}.py"), encoding="utf-8") as f:
            sources.append((f"rewards.sandbox.{name}", f.read()))
    return _BOOT % (sources,)


def _read_all(fd):
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8")


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed stream: nothing to flush
            pass


def _lock_down():
    """Undumpable (no ptrace, no reading this memory from the candidate's uid); SIGINT back
    to its default, which PID 1 of a namespace ignores from inside it."""
    import ctypes  # only the judge needs it, and only here: not loaded with the verifier

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def _take_nonce(report_fd):
    nonce = os.pread(report_fd, 256, 0).decode("ascii", "replace").strip()
    os.ftruncate(report_fd, 0)
    if not nonce.isalnum():
        raise ValueError("no nonce in the report file")
    return nonce


def _let_go(down_w, child):
    """After a fail: tell the candidate to exit and give it `GRACE_S` to do so."""
    try:
        os.write(down_w, wire.frame(["exit"]))
    except OSError:
        pass
    end = time.monotonic() + GRACE_S
    try:
        while time.monotonic() < end and os.waitpid(child, os.WNOHANG)[0] == 0:
            time.sleep(0.005)
    except ChildProcessError:  # already reaped
        pass


def main(argv):
    """The harness: fork the candidate, judge it, report; never returns."""
    payload_fd, report_fd = int(argv[0]), int(argv[1])
    down_r, down_w = os.pipe()  # judge -> candidate
    up_r, up_w = os.pipe()  # candidate -> judge
    child = os.fork()
    if child == 0:
        for fd in (payload_fd, report_fd, down_w, up_r):
            os.close(fd)
        candidate.main(down_r, up_w)
    os.close(down_r)
    os.close(up_w)
    passed, nonce = False, None
    try:
        _lock_down()
        nonce = _take_nonce(report_fd)
        data = json.loads(_read_all(payload_fd))
        passed = judge.judge(judge.connect(up_r, down_w), data["code"], data["tests"],
                             int(data["processes"]), child)
    except BaseException:  # noqa: BLE001 - any failure of the code or its tests is a fail
        traceback.print_exc()
    if not passed:
        _let_go(down_w, child)
    _flush()
    if passed:
        os.pwrite(report_fd, f"passed {nonce}\n".encode(), 0)
    os._exit(0 if passed else 1)
