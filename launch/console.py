"""A quiet console for long jobs: the job's own lines, progress bars and warnings on the
terminal; everything else in a log file.

Libraries talk a lot on a CPU run (vLLM's platform and Triton notices, Ray's start-up lines,
torch deprecations, the actors' own logs that Ray forwards to the driver, C++ libraries writing
straight to file descriptor 2). `QuietConsole` points the process's stdout and stderr to the
log, as file descriptors (C code, child processes) and as Python's `sys.stdout`/`sys.stderr`,
so all of that lands there; the job writes to `console.stream`, a duplicate of the terminal
taken before. `homerl` warnings are
shown on both. With `verbose` nothing is redirected.

    with QuietConsole("runs/x/demo.log", verbose=False) as console:
        console.say("training ...")
        for _ in tqdm(range(10), file=console.stream): ...
"""

from __future__ import annotations

import logging
import os
import sys


class QuietConsole:
    """Context manager: stdout/stderr to `log_path` (appended) unless `verbose`."""

    def __init__(self, log_path: str, verbose: bool = False):
        self.log_path, self.verbose = log_path, verbose
        self.stream = sys.stdout
        """where the job's own output goes: the terminal"""
        self._saved: list[int] = []
        self._streams = (sys.stdout, sys.stderr)
        self._handlers: list[logging.Handler] = []
        self._root_level = logging.WARNING

    def __enter__(self) -> QuietConsole:
        if self.verbose:
            return self
        os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = [os.dup(1), os.dup(2)]
        self.stream = os.fdopen(os.dup(self._saved[0]), "w", buffering=1)
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        # Python-level writers too, where sys.stdout is not file descriptor 1 (a test's capture)
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = sys.stderr = open(self.log_path, "a", buffering=1)  # noqa: SIM115
        self._log_records()
        return self

    def _log_records(self) -> None:
        """Every logger's records (INFO up) and Python warnings into the log; homerl's
        warnings on the terminal too."""
        logging.captureWarnings(True)
        root = logging.getLogger()
        to_log = logging.StreamHandler(sys.stderr)
        to_log.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
        shown = logging.StreamHandler(self.stream)
        shown.setLevel(logging.WARNING)
        shown.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root.addHandler(to_log)
        logging.getLogger("homerl").addHandler(shown)
        self._handlers = [to_log, shown]
        self._root_level = root.level
        root.setLevel(min(root.level, logging.INFO))

    def say(self, *parts, **kw) -> None:
        """print() to the terminal."""
        print(*parts, file=self.stream, flush=True, **kw)

    def __exit__(self, *exc) -> None:
        if self.verbose or not self._saved:
            return
        logging.captureWarnings(False)
        logging.getLogger().removeHandler(self._handlers[0])
        logging.getLogger("homerl").removeHandler(self._handlers[1])
        logging.getLogger().setLevel(self._root_level)
        sys.stdout.close()
        sys.stdout, sys.stderr = self._streams
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self.stream.close()
        self.stream = sys.stdout
        self._saved = []
