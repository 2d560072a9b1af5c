"""The program that runs a reply's code and its unit tests (`rewards.verifiers.python_tests`).

It is not imported: its source runs as ``python -I -S -c <this file> PAYLOAD_FD REPORT_FD``
inside the isolated child that `rewards.sandbox.jail` sets up (or, when isolation is switched off,
straight from `rewards.verifiers.python_tests`). Standard library only, and nothing from the
caller: the child sees no files of the repository.

The payload (JSON on PAYLOAD_FD: ``code``, ``tests``, ``nonce``) is read and the descriptor
closed before any of the reply's code runs, so the code finds neither the tests nor the
nonce in a file. Then, in one fresh module namespace named ``solution``:

1. the reply's code runs;
2. the tests run (compiled before the code ran, so the code cannot swap ``compile``);
3. every top-level ``def test...`` function of the tests is called, without arguments, in
   the order the tests define them.

Only when all of it finishes without an exception (``SystemExit`` included: a reply that
calls ``sys.exit`` fails) does this process, and not a child the code forked, write
``passed <nonce>`` to REPORT_FD. The code runs in this process, so code written to forge
the report (by reading this frame's locals) could; the nonce only stops a reply that
merely guesses the descriptor.
"""

import ast
import json
import os
import sys
import traceback


def _read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8")


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - the code may have closed or replaced them
            pass


def _main(payload_fd, report_fd):
    data = json.loads(_read_all(payload_fd))
    code, tests, nonce = data.pop("code"), data.pop("tests"), data.pop("nonce")
    run, write, getpid, exit_now = exec, os.write, os.getpid, os._exit
    pid = getpid()
    try:
        test_code = compile(tests, "tests.py", "exec", dont_inherit=True)
        names = [node.name for node in ast.parse(tests).body
                 if isinstance(node, ast.FunctionDef) and node.name.startswith("test")]
        namespace = {"__name__": "solution", "__builtins__": __builtins__}
        run(compile(code, "solution.py", "exec", dont_inherit=True), namespace)
        del code
        run(test_code, namespace)
        for name in names:
            namespace[name]()
    except BaseException:  # noqa: BLE001 - any failure of the code or its tests is a fail
        traceback.print_exc()
        _flush()
        exit_now(1)
    _flush()
    if getpid() == pid:  # a child the code forked runs on to here too: it reports nothing
        write(report_fd, f"passed {nonce}\n".encode())
    exit_now(0)


if __name__ == "__main__":
    _main(int(sys.argv[1]), int(sys.argv[2]))
