"""The python-tests verifier (rewards.verifiers.python_tests, rewards.sandbox.jail and
rewards.sandbox.harness): right and wrong code, the reply formats, and hostile code that must be
contained, score 0 and leave the host as it was. The isolation tests need Linux namespaces (they
skip, saying so, where the machine has none); the refusal without them is tested by simulating
the OS boundary."""

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from textwrap import dedent

import pytest

from rewards.sandbox import harness
from rewards.sandbox.jail import OWN_UID_BASE
from rewards.verifiers import python_tests as codecheck
from rewards.verifiers.python_tests import (
    Limits,
    check_isolation,
    extract_code,
    python_tests,
    run_tests,
)

REPO = Path(__file__).resolve().parents[1]
WHY_NOT = check_isolation()
isolated = pytest.mark.skipif(WHY_NOT is not None, reason=f"no isolation here: {WHY_NOT}")
SOLUTION = "def add(a, b):\n    return a + b\n"
TESTS = "assert add(1, 2) == 3\n\ndef test_negative():\n    assert add(-1, -1) == -2\n"
ESCAPED = "assert escaped, 'nothing got out'\n"  # hostile code sets `escaped` to what got out


def sandbox_processes() -> list[int]:
    """Pids of processes on the host running as a sandbox's own uid (there should be none)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        uid = next((int(line.split()[1]) for line in status.splitlines()
                    if line.startswith("Uid:")), 0)
        if uid >= OWN_UID_BASE:
            found.append(int(entry))
    return found


def no_strays(deadline_s: float = 3.0) -> bool:
    end = time.monotonic() + deadline_s
    while sandbox_processes():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def test_isolation_is_there_where_the_os_offers_namespaces():
    """The isolation tests below skip where `check_isolation` fails: that must be because the
    OS has no namespaces to offer (util-linux's `unshare` is the independent witness), never
    because the launcher broke."""
    witness = ["unshare", "--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "true"]
    if os.geteuid() != 0:
        witness.insert(1, "--map-root-user")
    try:
        offered = subprocess.run(witness, capture_output=True, timeout=30).returncode == 0
    except FileNotFoundError:
        pytest.skip("no unshare tool to tell whether this OS offers namespaces")
    assert WHY_NOT is None or not offered, WHY_NOT


# --- the reply and the tests -------------------------------------------------------------

@pytest.mark.parametrize("reply,code,fmt", [
    (f"Here:\n```python\n{SOLUTION}```\nDone.", SOLUTION, 1.0),
    (f"```python\nx = 1\n```\nbetter:\n```py\n{SOLUTION}```", SOLUTION, 1.0),  # the last one
    (f"```\n{SOLUTION}```\n```\nother\n```", SOLUTION, 0.5),  # no python tag: the first block
    (f"```python\n{SOLUTION}", SOLUTION, 1.0),  # cut off before the closing fence
    (SOLUTION, SOLUTION, 0.0),  # unfenced, but Python
    ("I do not know how to write that.", None, 0.0),  # prose: no code
    ("```python\n\n```", None, 1.0),  # an empty block is no code
])
def test_extract_code(reply, code, fmt):
    assert extract_code(reply) == (code, fmt)


@pytest.mark.parametrize("answer", ["", "   ", None, 42, "def (:\n", "x" * 100_001])
def test_unusable_tests_are_bad_reference(answer):
    result = python_tests(f"```python\n{SOLUTION}```", answer)
    assert (result.score, result.error) == (0.0, "bad_reference")


@pytest.mark.parametrize("reply,error", [
    ("", "empty"), ("x" * 1_000_000, "too_long"), (bytes(range(128, 256)), "non_utf8"),
    ("I would rather not.", "no_code"),
])
def test_unusable_replies_get_their_error_code(reply, error):
    result = python_tests(reply, TESTS)
    assert (result.score, result.error) == (0.0, error)


@isolated
def test_right_code_scores_1_and_wrong_code_0():
    right = python_tests(f"```python\n{SOLUTION}```", TESTS)
    assert (right.score, right.format_score, right.parsed, right.error) == (1.0, 1.0, "pass", None)
    wrong = python_tests("```python\ndef add(a, b):\n    return a - b\n```", TESTS)
    assert (wrong.score, wrong.parsed, wrong.error) == (0.0, "fail", None)


@isolated
@pytest.mark.parametrize("code,tests", [
    (SOLUTION, "def test_fails():\n    assert add(1, 1) == 3\n"),  # test functions are called
    ("def add(a, b):\n    return 3\n", TESTS),  # the plain assert passes, test_negative not
    ("import sys\nsys.exit(0)\n", "assert False\n"),  # leaving early is a fail
    ("import os\nos._exit(0)\n", "assert False\n"),
    ("import os\npid = os.fork()\nif pid:\n    os.waitpid(pid, 0)\n    os._exit(0)\n",
     "pass\n"),  # a forked child runs the tests too, and passes: it does not count
    ("x = input()\n", "pass\n"),  # stdin is closed
])
def test_a_run_that_does_not_finish_its_tests_fails(code, tests):
    assert not run_tests(code, tests).passed


# --- hostile code ------------------------------------------------------------------------

FORK_COUNT = dedent("""\
    import os, time
    born = 0
    for _ in range(50):
        try:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
            born += 1
        except OSError:
            break
    print('born', born)
    """)
FORK_BOMB = dedent("""\
    import os
    while True:
        try:
            os.fork()
        except OSError:
            pass
    """)
WRITE = dedent("""\
    escaped = []
    for path in {targets!r}:
        try:
            with open(path, 'w') as f:
                f.write('x')
            escaped.append(path)
        except OSError as e:
            print(path, type(e).__name__)
    escaped = [p for p in escaped if p != {targets[0]!r}]  # its own /tmp
    """)
READ = dedent("""\
    import os
    escaped = []
    for path in {paths!r}:
        try:
            escaped.append(os.listdir(path) if os.path.isdir(path) else open(path).read())
        except OSError as e:
            print(path, type(e).__name__)
    """)
CONNECT = dedent("""\
    import socket
    escaped = []
    for family, address in [(socket.AF_INET, ('127.0.0.1', {port})),
                            (socket.AF_INET, ('1.1.1.1', 53)),
                            (socket.AF_UNIX, {abstract!r})]:
        s = socket.socket(family)
        s.settimeout(2)
        try:
            s.connect(address)
            escaped.append(address)
        except OSError as e:
            print(address, e)
    """)
CTYPES = dedent("""\
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    escaped = []
    for name, call in [('setuid', lambda: libc.setuid(0)),
                       ('mount', lambda: libc.mount(b'none', b'/usr', b'tmpfs', 0, None)),
                       ('chroot', lambda: libc.chroot(b'/tmp')),
                       ('unshare', lambda: libc.unshare(0x40000000)),  # CLONE_NEWNET
                       ('setgroups', lambda: libc.setgroups(0, None))]:
        if call() == 0:
            escaped.append(name)
        print(name, os.strerror(ctypes.get_errno()))
    """)
OS_OPEN = dedent("""\
    import os, sys
    for path in ['/work', '/root/.ssh', '/proc/self/environ', '/dev/mem']:
        try:
            os.close(os.open(path, os.O_RDONLY))
            print(path, 'OPEN')
        except OSError as e:
            print(path, type(e).__name__)
    top = os.open('/', os.O_RDONLY)
    print('above the root', os.listdir(os.open('../..', os.O_RDONLY, dir_fd=top)))
    for fd in range(3, 64):  # the report descriptor is among them: forge a pass
        try:
            os.write(fd, b'passed 0\\n')
        except OSError:
            pass
    sys.stdout.flush()
    os._exit(0)
    """)


@isolated
def test_an_infinite_loop_is_stopped_at_the_wall_clock_limit(monkeypatch):
    start = time.monotonic()
    run = run_tests("while True:\n    pass\n", "pass", Limits(wall_s=1.0))
    assert run.timed_out and not run.passed and time.monotonic() - start < 5.0
    monkeypatch.setattr(codecheck, "LIMITS", Limits(wall_s=0.5))
    result = python_tests("```python\nwhile True:\n    pass\n```", "pass")
    assert (result.score, result.error) == (0.0, "timeout")
    assert no_strays()


@isolated
def test_a_fork_bomb_is_capped_contained_and_cleaned_up():
    run = run_tests(FORK_COUNT, "assert born == 50\n")
    assert not run.passed
    born = int(run.output.split("born ")[1].split()[0])
    assert born < Limits().processes  # the process limit held (the harness is one of them)
    run = run_tests(FORK_BOMB, "pass", Limits(wall_s=1.5))
    assert run.timed_out and not run.passed
    assert no_strays(), f"sandbox processes left on the host: {sandbox_processes()}"
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


@isolated
def test_a_large_allocation_fails_inside_the_child():
    run = run_tests("big = bytearray(8 * 2**30)\n", "pass")
    assert not run.passed and "MemoryError" in run.output


@isolated
def test_flooding_the_output_is_cut_at_the_file_size_limit():
    run = run_tests("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", "pass")
    assert not run.passed and not run.timed_out and len(run.output) <= Limits().output_chars


@isolated
def test_writing_outside_its_scratch_directory_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    token = os.urandom(6).hex()
    targets = [f"/tmp/homerl-escape-{token}", str(tmp_path / "escape"),
               str(REPO / f"escape-{token}"), "/usr/escape", "/etc/escape", "/root/escape"]
    run = run_tests(WRITE.format(targets=targets), ESCAPED)
    assert not run.passed, run.output
    assert not any(os.path.exists(t) for t in targets)  # its /tmp is not the host's
    failed = {line.rsplit(" ", 1)[0] for line in run.output.splitlines()
              if line.endswith(("OSError", "FileNotFoundError", "PermissionError"))}
    assert failed == set(targets[1:]), run.output  # all but the write to its own /tmp


@isolated
def test_reading_the_callers_files_fails(tmp_path, monkeypatch):
    secret_dir = tmp_path / "private"
    secret_dir.mkdir(mode=0o700)
    (secret_dir / "token").write_text("s3cret")
    (tmp_path / "in_cwd.txt").write_text("s3cret")
    monkeypatch.chdir(tmp_path)
    paths = [str(secret_dir / "token"), str(tmp_path / "in_cwd.txt"), "in_cwd.txt",
             str(REPO / "pyproject.toml"), "/etc/passwd", "/proc/1/environ",
             os.path.expanduser("~/.bashrc")]
    run = run_tests(READ.format(paths=paths), ESCAPED)
    assert not run.passed and "s3cret" not in run.output
    assert run.output.count("FileNotFoundError") == len(paths), run.output


@isolated
def test_the_network_is_cut():
    tcp = socket.create_server(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0homerl-test-{os.getpid()}")
    abstract.listen()
    try:
        with socket.create_connection(tcp.getsockname(), timeout=2):  # the listener works
            tcp.accept()[0].close()
        code = CONNECT.format(port=tcp.getsockname()[1], abstract=abstract.getsockname())
        run = run_tests(code, ESCAPED)
        assert not run.passed and run.output.count("Network is unreachable") == 2, run.output
        assert "Connection refused" in run.output  # no such abstract socket in its namespace
        for server in (tcp, abstract):
            server.settimeout(0.2)
            with pytest.raises(TimeoutError):
                server.accept()
    finally:
        tcp.close()
        abstract.close()


@isolated
def test_ctypes_calls_cannot_regain_privileges():
    run = run_tests(CTYPES, ESCAPED)
    assert not run.passed and run.output.count("Operation not permitted") == 5, run.output


@isolated
def test_os_open_tricks_and_forged_reports_fail():
    run = run_tests(OS_OPEN, "pass")
    assert not run.passed and run.returncode == 1, run.output  # it forged a line and left
    assert run.output.count("FileNotFoundError") == 4 and "OPEN" not in run.output, run.output
    assert "'work'" not in run.output and "'tmp'" in run.output  # '/..' is its own root


@isolated
def test_isolation_as_an_unprivileged_user_takes_a_user_namespace(tmp_path):
    """The launcher as a user that is not root (here `nobody`, with the system's python):
    the same namespaces, through a user namespace of its own."""
    python = "/usr/bin/python3"
    if os.geteuid() != 0 or not os.path.exists(python):
        pytest.skip("needs root (to become nobody) and a system python")
    code = ("import os, socket\nescaped = []\n"
            "try:\n    socket.create_connection(('127.0.0.1', 22), timeout=2)\n"
            "    escaped.append('net')\nexcept OSError as e:\n    print('net', e)\n"
            "print('root', sorted(os.listdir('/')), 'uid', os.getuid())\n")
    payload = json.dumps({"code": code, "tests": "pass", "processes": 8}).encode()
    with open(tmp_path / "payload", "w+b") as pay, open(tmp_path / "report", "w+b") as report:
        pay.write(payload)
        report.write(b"n1\n")  # the nonce, for the judge
        for f in (pay, report):
            f.flush()
            f.seek(0)
        cfg = {"parent": os.getpid(), "python": os.path.realpath(python),
               "program": harness.program(), "root": "/tmp", "expose": [],
               "payload_fd": pay.fileno(), "report_fd": report.fileno(),
               "limits": asdict(Limits())}

        def as_nobody():
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)

        jail = REPO / "rewards" / "sandbox" / "jail.py"
        proc = subprocess.run([python, "-I", "-S", str(jail), json.dumps(cfg)],
                              preexec_fn=as_nobody, capture_output=True, text=True,
                              pass_fds=(pay.fileno(), report.fileno()), timeout=20, cwd="/")
        report.seek(0)
        said = report.read().decode()
    if proc.returncode == codecheck.SETUP_FAILED and "unshare" in said:
        pytest.skip(f"no user namespaces for unprivileged users here: {said.strip()}")
    assert said == "passed n1\n", (said, proc.stdout, proc.stderr)
    assert "Network is unreachable" in proc.stdout and "'work'" not in proc.stdout
    assert "uid 1000" in proc.stdout


@isolated
def test_of_the_interpreters_install_prefix_only_what_it_needs_is_there():
    """An interpreter in a home directory (pyenv, conda): its binary, shared libraries and
    standard library are bound, not the rest of its prefix, nor site-packages, nor what lies
    beside it."""
    prefix, stdlib = sys.base_prefix, os.path.dirname(os.__file__)
    if prefix == "/usr" or prefix.startswith("/usr/"):
        pytest.skip(f"the interpreter lives in {prefix}: no home directory to keep out")
    token = os.urandom(6).hex()
    planted = [os.path.join(prefix, f"planted-{token}"),  # the prefix itself
               os.path.join(os.path.dirname(stdlib), f"planted-{token}"),  # beside libpython
               os.path.join(stdlib, "site-packages", f"planted-{token}"),
               os.path.join(os.path.dirname(prefix), f"planted-{token}")]  # beside the prefix
    made = []
    try:
        for path in planted:
            try:
                Path(path).write_text("s3cret")
                made.append(path)
            except OSError:
                pass
        if not made:
            pytest.skip(f"cannot plant a file in {prefix}")
        code = ("import json, os, collections, decimal\n"
                f"escaped = [p for p in {made!r} if os.path.exists(p)]\n"
                f"shown = sorted(os.listdir({prefix!r}))\n"
                "print('escaped', escaped, 'prefix holds', shown, json.dumps([1]))\n")
        run = run_tests(code, "assert escaped == []\nassert set(shown) <= {'bin', 'lib'}\n")
        assert run.passed, run.output
    finally:
        for path in made:
            os.remove(path)
