"""Keep a run going when its learner dies: restore the last checkpoint and carry on.

    summary = run_supervised(Trainer(cfg, run_dir))     # what launch.train's main() runs

A dead learner (SIGKILL, out of memory, its node lost) shows as a failed call in the step
loop; `Trainer.learner_alive` then confirms it. The run's actors are replaced by a Trainer
resumed from the run directory, exactly as `launch.train --resume` would, so the steps after
the checkpoint are redone and `metrics.jsonl` keeps one row per step.

    with stop_on_interrupt("launch.train") as interrupted:   # Ctrl-C: stop after this step
        run_supervised(trainer, on_step=interrupted.on_step)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

log = logging.getLogger("homerl.train")


class LearnerLostError(RuntimeError):
    """The learner died more often than run.max_learner_restarts allows."""


def train_supervised(trainer, **run_kwargs):
    """`trainer.run()`, surviving the learner's death: the run's actors are replaced and it
    goes on from its last checkpoint (weights, optimizer, RNG, curriculum, the rollouts already
    made for later steps), so steps after that checkpoint are redone and metrics.jsonl keeps
    one row per step. Returns (the summary, the trainer that finished: the one given, or the
    one restored after a learner death) with its actors up, for the caller to use (the demo
    scores the trained policy on its worker) and shut down; raises with every trainer shut
    down. `run_kwargs` go to every `trainer.run` (its progress stream, its `on_step` hook)."""
    limit = trainer.cfg.run.max_learner_restarts
    while True:
        try:
            return trainer.run(**run_kwargs), trainer
        except BaseException as err:
            try:
                lost = isinstance(err, Exception) and not trainer.learner_alive()
            finally:
                trainer.shutdown()
            if not lost:
                raise
            restarts = trainer.learner_restarts + 1
            if restarts > limit:
                raise LearnerLostError(
                    f"the learner died {restarts} times (run.max_learner_restarts={limit})"
                ) from err
            log.warning("the learner died (%s); restoring the last checkpoint (restart %d "
                        "of at most %d)", type(err).__name__, restarts, limit)
            trainer = type(trainer)(trainer.cfg, trainer.run_dir, resume=True,
                                    learner_restarts=restarts,
                                    worker_restarts=trainer.pool.restarts)


def run_supervised(trainer, **run_kwargs) -> dict:
    """`train_supervised`, then shut down whichever trainer finished; returns the summary."""
    summary, trainer = train_supervised(trainer, **run_kwargs)
    trainer.shutdown()
    return summary


class Interrupted(threading.Event):
    """Set by the first Ctrl-C, or SIGTERM where asked (`stop_on_interrupt`); `reason` says
    which."""

    reason = "Ctrl-C"

    def on_step(self, k: int, row: dict) -> str | None:
        """Trainer.run's hook: once set, stop after this step, saying why."""
        return self.reason if self.is_set() else None


@contextlib.contextmanager
def stop_on_interrupt(prog: str, say=None, sigterm: bool = False, resume: str = ""):
    """The first Ctrl-C sets the event it yields (pass `on_step=event.on_step`: the run
    stops after its step, with a checkpoint, raising RunStopped); the second raises
    KeyboardInterrupt at once, keeping the last checkpoint. A terminal's Ctrl-C reaches the
    local cluster's processes too (one process group); Ray's daemons and actors ignore it, so
    they finish that step. With `sigterm`, SIGTERM does what Ctrl-C does: `ray job stop`,
    `kill PID` and `docker stop` send it, so a run stops with a checkpoint of its step when the
    sender waits long enough (`ray job stop`: 3 s unless the job's runtime env sets
    RAY_JOB_STOP_WAIT_TIME_S) and keeps its last checkpoint when it does not. A SIGTERM to the
    whole process group (`timeout`, systemd's stop) also ends a local cluster's daemons: see
    `exit_when_the_cluster_dies`; `resume` ends its line. Only in the main thread (signals go
    there); elsewhere the event is never set. `say(line)` tells the user (default: stderr)."""
    event = Interrupted()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return
    say = say or (lambda text: print(text, file=sys.stderr))
    done = threading.Event()
    signals = (signal.SIGINT, signal.SIGTERM) if sigterm else (signal.SIGINT,)
    previous = {signum: signal.getsignal(signum) for signum in signals}

    def handler(signum, frame):
        if event.is_set():
            raise KeyboardInterrupt
        event.reason = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        event.set()
        if signum == signal.SIGTERM:
            exit_when_the_cluster_dies(prog, say, resume, done)
        line = (f"\n{prog}: stopping after this step, with a checkpoint (Ctrl-C again: now, "
                "without one)" if signum == signal.SIGINT else
                f"\n{prog}: SIGTERM: stopping after this step, with a checkpoint (a second "
                "signal: now, without one)")
        try:
            say(line)
        except RuntimeError:  # the stream was mid-write (a reentrant call): stop all the same
            pass

    for signum in signals:
        signal.signal(signum, handler)
    try:
        yield event
    finally:
        done.set()
        for signum, before in previous.items():
            signal.signal(signum, before)


def exit_when_the_cluster_dies(prog: str, say, resume: str, done: threading.Event) -> None:
    """After a SIGTERM: a local cluster's daemons (this process's children) share its process
    group, so a SIGTERM sent to the group (`timeout`, systemd's stop, `kill -- -PGID`) ends
    them too; the step in flight can then never finish and leaving Ray would wait on a dead
    raylet (which takes ~10 s to exit). A thread watches them until `done`: once one is gone
    (Ray's log monitor goes at once), one line and exit 130, as a second signal does (the run
    keeps its last checkpoint). A SIGTERM to this process alone leaves them running and the
    run stops after its step. On a joined cluster there is nothing to watch."""
    import psutil
    import ray

    ray_dir = os.path.dirname(ray.__file__) + os.sep
    daemons = []  # Ray's own programs and scripts: raylet, gcs_server, dashboard.py, ...
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if any(part.startswith(ray_dir) for part in child.cmdline()):
                daemons.append(child)

    def gone(proc) -> bool:
        try:
            return proc.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def watch():
        while not done.wait(0.1):
            if any(gone(proc) for proc in daemons):
                with contextlib.suppress(Exception):
                    say(f"\n{prog}: SIGTERM reached the local Ray cluster too (a signal to "
                        f"the process group): stopped now{'; ' + resume if resume else ''}")
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(130)

    if daemons:
        threading.Thread(target=watch, name="cluster-watch", daemon=True).start()
