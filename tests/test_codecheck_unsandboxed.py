"""python-tests WITHOUT isolation (reward.unsandboxed_code; rewards.sandbox.reaper): the code
cannot read the caller's environment through its parents, and nothing it starts outlives the
run, not even a double-forked process in a session of its own."""

import os
import signal
import time
from textwrap import dedent

import pytest

from rewards.verifiers.python_tests import Limits, run_tests

# the user's other processes would count against a small RLIMIT_NPROC
LIMITS = Limits(wall_s=3.0, processes=4096)
READ_PARENTS = dedent("""\
    import os
    def parent(pid):
        with open(f'/proc/{pid}/stat') as f:
            return int(f.read().rsplit(')', 1)[1].split()[1])
    pid = os.getppid()
    for _ in range(2):  # the parent, then the grandparent
        with open(f'/proc/{pid}/environ', 'rb') as f:
            print(pid, f.read().replace(b'\\0', b' ').decode())
        pid = parent(pid)
    """)
SLEEPER = dedent("""\
    import os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open({pidfile!r}, 'w') as f:
                f.write(str(os.getpid()))
            time.sleep(60)
        os._exit(0)
    while not os.path.exists({pidfile!r}):
        time.sleep(0.01)
    """)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def pidfile(tmp_path):
    path = tmp_path / "sleeper.pid"
    yield path
    if path.exists() and alive(pid := int(path.read_text())):  # the test failed: clean up
        os.kill(pid, signal.SIGKILL)


def test_the_callers_environment_is_not_readable_through_the_parents(monkeypatch):
    secret = f"s3cret-{os.urandom(6).hex()}"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    run = run_tests(READ_PARENTS, "pass", LIMITS, isolated=False)
    assert run.passed, run.output
    assert run.output.count("PATH=/usr/bin:/bin") == 2, run.output  # it read both
    assert secret not in run.output and "WANDB_API_KEY" not in run.output, run.output


@pytest.mark.parametrize("tail,timed_out", [("", False), ("while True:\n    pass\n", True)],
                         ids=["run-ends", "time-limit"])
def test_a_double_forked_setsid_sleeper_is_gone_after_the_run(pidfile, tail, timed_out):
    start = time.monotonic()
    run = run_tests(SLEEPER.format(pidfile=str(pidfile)) + tail, "pass", LIMITS, isolated=False)
    assert run.timed_out == timed_out and run.passed != timed_out, run.output
    assert time.monotonic() - start < LIMITS.wall_s + 3.0
    pid = int(pidfile.read_text())
    assert not alive(pid), f"the sleeper {pid} outlived the run"
