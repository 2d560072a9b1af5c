"""Hard per-item time limits for reward verification.

sympy can run for minutes on adversarial completions, and math-verify's own
limit uses ``signal.alarm``, which only works on the main thread (not inside Ray
actors or trainer threads). So `VerifierPool` runs the verifier in one persistent
``spawn``-ed worker process, sends it a whole batch at once and reads results
back one by one, giving every item its own deadline. An item that overruns gets
a ``timeout`` result; the worker is killed and replaced, and the rest of the
batch is scored by the fresh worker.

Items may name a built-in verifier (`rewards.verifiers.registry`); the worker dispatches on the
name, and the item's deadline is that verifier's own where it needs longer (python-tests). The
worker runs under an address-space limit (RLIMIT_AS, `DEFAULT_MEMORY_BYTES`): an item that
exhausts it gets ``out_of_memory`` and the worker is replaced, like a timeout.

The same process calls a user's reward functions (`reward.fn`, TRL's convention,
`rewards.userfns`) with `VerifierPool.call_fn`: one call per batch, with a deadline of its own;
a call that overruns gets ``fn_timeout`` and one that runs out of memory ``out_of_memory`` (the
worker is replaced), one that raises ``fn_error``.

``spawn`` would re-import the parent's ``__main__`` module in the worker; the worker needs
none of it (in a Ray actor that is Ray's worker script: 0.08 GiB of imports for a verifier
that needs 0.02), so `_without_main` hides it while the worker starts.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import multiprocessing
import os
import resource
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection

from rewards.result import (
    FN_ERROR,
    FN_TIMEOUT,
    OUT_OF_MEMORY,
    TIMEOUT,
    VERIFIER_CRASH,
    RewardResult,
    error_result,
)
from rewards.userfns import FnCall, FnOutcome, failed, run_call
from rewards.verifiers import python_tests
from rewards.verifiers.reference import verify
from rewards.verifiers.registry import VERIFIERS, item_timeout

VerifyFn = Callable[..., RewardResult]  # (completion, answer[, style]) -> result

STARTUP_TIMEOUT_S = 60.0  # generous: a cold start imports sympy
DEFAULT_MEMORY_BYTES = 2 * 2**30
"""the verifier process's address-space limit (it needs ~0.1 GiB with sympy loaded)"""
KILL_GRACE_S = 0.5  # time between SIGTERM and SIGKILL
# Scored once at worker start so the sympy import is not charged to the first item.
_WARMUP_ITEM = ("\\boxed{\\sqrt{4}}", "2")


class _DropTimeoutNotice(logging.Filter):
    """Drop math-verify's "Timeout is disabled" warning: in the worker the pool enforces one."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


def _score_one(verify_fn: VerifyFn, completion: object, answer: object, style: str | None,
               verifier: str | None) -> RewardResult:
    """One item: by the named built-in verifier, else by the pool's `verify_fn`."""
    if verifier is not None:
        return VERIFIERS[verifier](completion, answer, style)
    # a style only when one was asked for: injected verify_fns take two arguments
    return verify_fn(completion, answer) if style is None else verify_fn(completion, answer, style)


def _limit_memory(limit_bytes: int | None) -> None:
    """Cap this process's address space at `limit_bytes` (never above the inherited cap)."""
    if limit_bytes is None:
        return
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY:
        limit_bytes = min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


def _worker_main(conn: Connection, verify_fn: VerifyFn, memory_bytes: int | None = None,
                 unsandboxed_code: bool = False) -> None:
    """Worker loop: warm up, say "ready", then score batches until the pipe closes (or an
    item runs out of memory: then it reports that item and exits, to be replaced)."""
    # Ctrl-C is the parent's business; it closes our pipe, which ends this loop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutNotice())
    _limit_memory(memory_bytes)
    python_tests.configure(unsandboxed=unsandboxed_code)
    verify_fn(*_WARMUP_ITEM)
    conn.send("ready")
    while True:
        try:
            batch = conn.recv()
        except EOFError:
            return
        if isinstance(batch, FnCall):
            if not _serve_fn(conn, batch):
                return
            continue
        for index, completion, answer, style, verifier in batch:
            try:
                result = _score_one(verify_fn, completion, answer, style, verifier)
            except MemoryError:
                result = None
            except Exception:  # noqa: BLE001 - an injected verify_fn may raise; report per item
                traceback.print_exc()
                result = error_result(VERIFIER_CRASH)
            if result is None:  # out of the frame that held the allocation: memory is back
                conn.send((index, error_result(OUT_OF_MEMORY)))
                return
            conn.send((index, result))


def _serve_fn(conn: Connection, call: FnCall) -> bool:
    """Answer one reward-function call; False when it ran out of memory (the worker then
    exits, to be replaced)."""
    try:
        outcome = run_call(call)
    except MemoryError:
        outcome = None
    if outcome is None:  # out of the frame that held the allocation: memory is back
        conn.send(failed(OUT_OF_MEMORY, "ran out of the verifier process's memory limit"))
        return False
    conn.send(outcome)
    return True


@contextlib.contextmanager
def _without_main():
    """Start a spawned process without re-importing this process's ``__main__`` (spawn reads
    its ``__spec__`` and ``__file__`` when it starts a child; both are restored after)."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if main and k in main.__dict__}
    try:
        if main is not None:
            main.__spec__ = None
            main.__dict__.pop("__file__", None)
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


class VerifierPool:
    """One persistent verifier worker process with per-item hard time limits.

    Use as a context manager or call `close()`. Thread-safe: concurrent `score` and `call_fn`
    calls are serialised. `errors` counts "timeout", "out_of_memory" and "verifier_crash"
    results, and the reward functions' "fn_*" failures; `starts` counts worker (re)starts.
    """

    def __init__(self, verify_fn: VerifyFn = verify, startup_timeout_s: float = STARTUP_TIMEOUT_S,
                 memory_bytes: int | None = DEFAULT_MEMORY_BYTES, unsandboxed_code: bool = False):
        """`verify_fn` must be a picklable top-level function (it is sent to the worker).
        `memory_bytes`: the worker's address-space limit (None: none). `unsandboxed_code`:
        python-tests runs completions' code unisolated where it cannot be isolated
        (reward.unsandboxed_code; see `rewards.verifiers.python_tests`)."""
        self._verify_fn = verify_fn
        self._startup_timeout_s = startup_timeout_s
        self._memory_bytes, self._unsandboxed_code = memory_bytes, unsandboxed_code
        self._ctx = multiprocessing.get_context("spawn")
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.errors: collections.Counter[str] = collections.Counter()
        self.starts = 0

    @property
    def pid(self) -> int | None:
        """The worker process's pid while it runs (for memory accounting), else None."""
        proc = self._process
        return proc.pid if proc is not None and proc.is_alive() else None

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker. Idempotent; the pool cannot be used afterwards."""
        with self._lock:
            self._stop_worker()
            self._closed = True

    def score(
        self, completions: Sequence[object], answers: Sequence[object], timeout_s: float = 2.0,
        styles: Sequence[str | None] | None = None,
        verifiers: Sequence[str | None] | None = None,
    ) -> list[RewardResult]:
        """Score each completion against its reference, each within `timeout_s` seconds;
        `styles`: the answer style each prompt asked for (`rewards.styles`; None: the default);
        `verifiers`: each item's built-in verifier by name (`rewards.verifiers.registry`; None: this
        pool's `verify_fn`); a verifier with a longer limit of its own gets that limit.

        Results come back in input order. Items that overrun get error "timeout",
        items that exhaust the worker's memory "out_of_memory", items whose worker died
        "verifier_crash"; scoring then goes on in a fresh worker.
        """
        n = len(completions)
        styles = list(styles) if styles is not None else [None] * n
        verifiers = list(verifiers) if verifiers is not None else [None] * n
        for what, got in (("answers", answers), ("styles", styles), ("verifiers", verifiers)):
            if len(got) != n:
                raise ValueError(f"{n} completions but {len(got)} {what}")
        unknown = sorted({v for v in verifiers if v is not None and v not in VERIFIERS})
        if unknown:
            raise ValueError(f"unknown verifier(s) {unknown}; allowed: {', '.join(VERIFIERS)}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        timeouts = [item_timeout(v, timeout_s) for v in verifiers]
        with self._lock:
            if self._closed:
                raise RuntimeError("VerifierPool is closed")
            results: list[RewardResult | None] = [None] * n
            pending = list(range(n))
            while pending:
                conn = self._send_batch([(i, completions[i], answers[i], styles[i], verifiers[i])
                                         for i in pending])
                pending = self._collect(conn, pending, results, timeouts)
            return results  # type: ignore[return-value]  # every slot is filled

    def call_fn(self, spec: str, kwargs: dict | None, timeout_s: float,
                code: bytes | None = None) -> FnOutcome:
        """Call reward function `spec` ("module:function"; `code`: the bytes of a `by-value:`
        one) with `kwargs` (`rewards.userfns`) in the worker, within `timeout_s` seconds (its
        first import included); kwargs None: only load it, to check it. A fault of the
        function is an outcome, never an exception here: one that overruns gets "fn_timeout",
        one that exhausts the worker's memory "out_of_memory" (both replace the worker), one
        that raises "fn_error"."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        with self._lock:
            if self._closed:
                raise RuntimeError("VerifierPool is closed")
            conn = self._send_batch(FnCall(spec, kwargs, code))
            outcome = self._receive_fn(conn, timeout_s)
            if outcome.error == OUT_OF_MEMORY:  # the worker exits after it: reap it
                self._stop_worker()
            if outcome.error:
                self.errors[outcome.error] += 1
            return outcome

    def _receive_fn(self, conn: Connection, timeout_s: float) -> FnOutcome:
        """The worker's answer to a call; a worker that overran or died is stopped here."""
        if not conn.poll(timeout_s):
            self._stop_worker()
            return failed(FN_TIMEOUT, f"took over {timeout_s:g} s (reward.fn_timeout_s)")
        try:
            return conn.recv()
        except (EOFError, OSError):  # the worker died mid-call (os._exit, a crash in C code)
            process = self._process
            if process is not None:
                process.join(KILL_GRACE_S)
            code = process.exitcode if process is not None else None
            self._stop_worker()
            return failed(FN_ERROR, f"the verifier process died (exit code {code})")

    def _send_batch(self, batch: list[tuple] | FnCall) -> Connection:
        """Send `batch` to a live worker, restarting it once if it died while idle."""
        for attempt in range(2):
            conn = self._ensure_worker()
            try:
                conn.send(batch)
                return conn
            except (BrokenPipeError, ConnectionResetError):
                self._stop_worker()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _collect(
        self,
        conn: Connection,
        pending: list[int],
        results: list[RewardResult | None],
        timeouts: list[float],
    ) -> list[int]:
        """Receive results for `pending` in order; return the items still unscored.

        The worker handles items sequentially, so the gap between consecutive
        results is the time spent on one item: each wait gets that item's full budget.
        """
        for position, index in enumerate(pending):
            failure = None
            if not conn.poll(timeouts[index]):
                failure = TIMEOUT
            else:
                try:
                    got_index, result = conn.recv()
                except (EOFError, OSError):  # the worker died mid-item
                    failure = VERIFIER_CRASH
            if failure is not None:
                self._stop_worker()
                self.errors[failure] += 1
                results[index] = error_result(failure)
                return pending[position + 1 :]
            if got_index != index:
                raise RuntimeError(f"verifier worker answered item {got_index}, expected {index}")
            if result.error in (VERIFIER_CRASH, OUT_OF_MEMORY):
                self.errors[result.error] += 1
            results[index] = result
            if result.error == OUT_OF_MEMORY:  # the worker exits after it: score on in a new one
                self._stop_worker()
                return pending[position + 1 :]
        return []

    def _ensure_worker(self) -> Connection:
        """Return the connection to a live worker, starting one if needed."""
        if self._process is not None and self._process.is_alive() and self._conn is not None:
            return self._conn
        self._stop_worker()
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_worker_main,
            args=(child_conn, self._verify_fn, self._memory_bytes, self._unsandboxed_code),
            name="homerl-verifier",
            daemon=True,
        )
        with _without_main():
            process.start()
        # Drop our copy of the child's end so a dead worker reads as EOF here.
        child_conn.close()
        self._process, self._conn = process, parent_conn
        self.starts += 1
        try:
            ready = parent_conn.poll(self._startup_timeout_s) and parent_conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            exitcode = process.exitcode
            self._stop_worker()
            why = (
                f"exited with code {exitcode} (see its traceback above)"
                if exitcode is not None
                else f"was not ready within {self._startup_timeout_s:.0f} s"
            )
            raise RuntimeError(f"verifier worker {why}")
        return parent_conn

    def _stop_worker(self) -> None:
        """Terminate, then kill, the worker process if there is one."""
        process, conn = self._process, self._conn
        self._process, self._conn = None, None
        if conn is not None:
            conn.close()
        if process is None:
            return
        if process.is_alive():
            process.terminate()
            process.join(KILL_GRACE_S)
        if process.is_alive():
            process.kill()
        process.join()


_global_pool: VerifierPool | None = None
_global_pool_pid: int | None = None
_global_lock = threading.Lock()


def shared_pool() -> VerifierPool:
    """The process-global pool, created on first use (and again after a fork): one verifier
    process for every caller in this process (an evaluation's scoring, the app's verdicts),
    so that each call does not pay a process start (~1 s of imports and warm-up) of its own.
    Closed at exit."""
    global _global_pool, _global_pool_pid
    with _global_lock:
        if _global_pool is None or _global_pool_pid != os.getpid():
            # After a fork the inherited pool's pipe belongs to the parent: start afresh.
            _global_pool, _global_pool_pid = VerifierPool(), os.getpid()
            atexit.register(_global_pool.close)
        return _global_pool


def score_completions(
    completions: Sequence[object], answers: Sequence[object], timeout_s: float = 2.0,
    styles: Sequence[str | None] | None = None, verifiers: Sequence[str | None] | None = None,
) -> list[RewardResult]:
    """Score a batch with the lazily created process-global `VerifierPool`."""
    return shared_pool().score(completions, answers, timeout_s=timeout_s, styles=styles,
                                verifiers=verifiers)
