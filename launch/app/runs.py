"""The web app's runs, without Gradio: start, check, resume and stop them, and say where each
stands (what a page shows of one, its curves and samples, is launch/app/views.py).

`launch/app/ui.py` lays these functions out in a page; tests call them directly. A run is the real
thing: `python -m launch.train` in its own process session (it outlives the page and the app),
on a local Ray cluster it starts, or on the cluster named by RAY_ADDRESS (`ray start --head`
prints one), writing the same run directory as the command line:

    RUN_DIR/app.json   how the app started it (command, pid, the process's start time)
    RUN_DIR/app.log    its stdout and stderr

The runs a page sees are the directories homerl marked as runs (launch/rundir/ownership.py);
a run is running while its driver process lives (launch/app/drivers.py); Start and Resume check
the server's policy on the config they would run, and count the running runs and start theirs
under one lock, so that two clicks at once cannot pass `--max-runs`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common import metrics as M
from common.config import Config, ConfigError
from common.models import ModelNotFoundError, resolve_model
from launch.app.drivers import app_driver_alive, lock_holder_alive, start_ticks
from launch.app.policy import Policy, PolicyError
from launch.cli import OneLineParser, add_config_args, config_from_args
from launch.rundir.checkpoints import list_checkpoints
from launch.rundir.ownership import MARKER, mark_run
from launch.rundir.resume import read_run_config
from launch.rundir.writer import clear_stop, read_jsonl, request_stop, stop_requested, write_json

FORM_FLAGS = {
    "preset": "--preset",
    "model": "--model.name",
    "engine": "--rollout.engine",
    "steps": "--run.steps",
    "group_size": "--rollout.group_size",
    "lr": "--grpo.lr",
    "lora_r": "--lora.r",
    "task": "--curriculum.task",
    "level": "--curriculum.level",
    "seed": "--run.seed",
    "data_path": "--curriculum.data_path",
    "verifier": "--curriculum.verifier",
    "prompt_field": "--curriculum.prompt_field",
    "answer_field": "--curriculum.answer_field",
    "reward_fn": "--reward.fn",
}
"""Train tab field -> launch.train flag (empty fields keep the preset's value)"""

_PROCS: dict[str, subprocess.Popen] = {}  # run dir -> the driver this app started (to reap it)


class FormError(ValueError):
    """A bad value in a form: one line naming the field."""


class _RaisingParser(OneLineParser):
    def error(self, message: str):
        raise FormError(message)


def _flag_value(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))  # Gradio's Number gives 4.0 for 4
    return str(value).strip()


def train_argv(form: dict) -> list[str]:
    """launch.train flags for a Train form; None or empty fields are left to the preset."""
    argv = []
    for key, value in form.items():
        if key not in FORM_FLAGS:
            raise FormError(f"unknown form field {key!r}; allowed: {', '.join(FORM_FLAGS)}")
        if isinstance(value, (list, tuple)):  # a multiselect: comma-separated, as on the CLI
            value = ",".join(str(v).strip() for v in value if str(v).strip())
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise FormError(f"{FORM_FLAGS[key]}: must be a finite number; got {value}")
        argv += [FORM_FLAGS[key], _flag_value(value)]
    return argv


def form_config(form: dict) -> Config:
    """The Config launch.train would run, validated by the same code as the CLI. Raises
    FormError with launch.train's one-line message."""
    parser = _RaisingParser(prog="launch.train")
    add_config_args(parser)
    args = parser.parse_args(train_argv(form))
    try:
        return config_from_args(args)
    except ConfigError as e:
        raise FormError(str(e)) from None


def check_form(form: dict) -> Config:
    """form_config, and its model found on this machine (embedded, local path or cached hub
    id): a missing model fails here, in one line, before a process starts."""
    cfg = form_config(form)
    try:
        resolve_model(cfg.model.name)
    except ModelNotFoundError as e:
        raise FormError(str(e)) from None
    return cfg


def _new_run_dir(root: str, preset: str) -> str:
    base = os.path.join(root, f"{time.strftime('%Y%m%d-%H%M%S')}-{preset}")
    path, i = base, 1
    while os.path.exists(path):
        path, i = f"{base}-{i}", i + 1
    return path


# a submitted run's runtime env, as docs/cluster.md's: the checkout without what is local to it;
# `ray job stop` (the dashboard's Stop too) gives the driver 600 s, not 3, to end its step with a
# checkpoint before the SIGKILL
JOB_RUNTIME_ENV = {"excludes": [".venv", "runs", ".git"],
                   "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "600"}}


def _command(argv: list[str], root: str) -> list[str]:
    """`python -m launch.train argv`; under a dashboard RAY_ADDRESS (http://head:8265) the same
    command as a Ray job (`ray job submit`, as docs/cluster.md's "As a Ray job"), which this process
    follows to its end."""
    address = os.environ.get("RAY_ADDRESS", "")
    if not address.startswith(("http://", "https://")):
        return [sys.executable, "-m", "launch.train", *argv]
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    return [ray_cli, "job", "submit", "--address", address, "--working-dir", root,
            "--runtime-env-json", json.dumps(JOB_RUNTIME_ENV), "--", "python", "-m",
            "launch.train", *argv]


def _spawn(run_dir: str, argv: list[str]) -> str:
    """Start `launch.train argv` detached (own session: closing the page or stopping the app
    does not stop it), logging to RUN_DIR/app.log."""
    root = str(Path(__file__).resolve().parents[2])  # the checkout: launch/app/runs.py
    cmd = _command(argv, root)
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    with open(os.path.join(run_dir, "app.log"), "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    _PROCS[os.path.abspath(run_dir)] = proc
    with open(os.path.join(run_dir, "app.json"), "w") as f:
        json.dump({"pid": proc.pid, "ticks": start_ticks(proc.pid), "command": cmd,
                   "started": time.time()}, f)
    return run_dir


def allowed(cfg: Config, root: str, policy: Policy | None) -> Config:
    """`cfg` if the server's policy lets a page run it (its model, datasets and reward
    functions, no unsandboxed code), else FormError naming what is not allowed."""
    if policy is None:
        return cfg
    try:
        return policy.check_config(cfg, checkpoints(root))
    except PolicyError as e:
        raise FormError(str(e)) from None


def _check_room(root: str, policy: Policy | None) -> None:
    """FormError when --max-runs runs are going (call it under _spawn_lock)."""
    if policy is not None:
        try:
            policy.check_capacity(running_count(root))
        except PolicyError as e:
            raise FormError(str(e)) from None


@contextlib.contextmanager
def _spawn_lock(root: str):
    """One start or resume at a time in a runs folder, from any thread of this app or another
    app on the same folder: an flock on the folder itself (it adds no file to it)."""
    os.makedirs(root, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def running_count(root: str) -> int:
    """Runs under `root` whose driver is alive (a directory that is not a readable run counts
    as none)."""
    count = 0
    for run_dir in list_runs(root):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            count += run_status(run_dir).state == "running"
    return count


def start_run(form: dict, root: str = "runs", policy: Policy | None = None) -> str:
    """Validate the form (and, from the page, the server's policy) and start the run; returns
    its directory. Raises FormError."""
    cfg = allowed(check_form(form), root, policy)
    with _spawn_lock(root):
        _check_room(root, policy)
        run_dir = os.path.abspath(_new_run_dir(root, cfg.preset))  # a Ray job runs elsewhere
        os.makedirs(run_dir)
        mark_run(run_dir)  # a run of this project: the driver's --run-dir takes it (run_dir.py)
        # in the run lists at once, before Ray starts; the driver rewrites it (whole, as here)
        write_json(os.path.join(run_dir, "config.json"), cfg.to_dict())
        return _spawn(run_dir, [*train_argv(form), "--run-dir", run_dir])


def check_run(run_dir: str, policy: Policy | None = None) -> str:
    """`run_dir` if the page may act on it: inside the runs folder (the policy's), not the
    uploads, marked by homerl as a run and holding its config.json. Raises FormError."""
    if policy is not None:
        try:
            policy.check_run_dir(run_dir)
        except PolicyError as e:
            raise FormError(str(e)) from None
    if not os.path.isfile(os.path.join(run_dir, "config.json")):
        raise FormError(f"{run_dir}: not a run directory (no config.json)")
    if not os.path.exists(os.path.join(run_dir, MARKER)):
        raise FormError(f"{run_dir}: not a homerl run (no {MARKER} marker); the app shows "
                        "and resumes only the runs homerl made")
    return run_dir


def read_config(run_dir: str) -> Config:
    """The Config a resume of `run_dir` would run (its config.json). Raises FormError."""
    try:
        return read_run_config(os.path.join(run_dir, "config.json"))
    except ConfigError as e:
        raise FormError(str(e)) from None


def resume_run(run_dir: str, policy: Policy | None = None) -> str:
    """`launch.train --resume RUN_DIR` from its last checkpoint, its config.json checked against
    the server's policy as Start checks a form. Raises FormError."""
    check_run(run_dir, policy)
    root = policy.runs_root if policy is not None else os.path.dirname(os.path.abspath(run_dir))
    allowed(read_config(run_dir), root, policy)
    with _spawn_lock(root):
        _check_room(root, policy)
        state = run_status(run_dir).state
        if state in ("running", "finished"):
            raise FormError(f"{run_dir}: already {state}")
        clear_stop(run_dir)
        return _spawn(run_dir, ["--resume", os.path.abspath(run_dir)])


def stop_run(run_dir: str) -> str:
    """Ask a running run to checkpoint and stop after its current step."""
    if run_status(run_dir).state != "running":
        return f"{run_dir} is not running"
    request_stop(run_dir)
    return f"stop asked: {run_dir} checkpoints and stops after its current step"


def _alive(run_dir: str, info: dict) -> bool:
    proc = _PROCS.get(os.path.abspath(run_dir))
    if proc is not None and proc.pid == info.get("pid"):
        return proc.poll() is None  # also reaps it
    return app_driver_alive(run_dir, info)


@dataclass(frozen=True)
class RunStatus:
    state: str
    """running, finished, stopped (resumable) or failed"""
    step: int
    """steps done (rows in metrics.jsonl)"""
    total: int
    """run.steps"""
    message: str
    """one line for the page"""


def _last_line(path: str) -> str:
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        lines = [ln.strip() for ln in f.read().replace("\r", "\n").splitlines() if ln.strip()]
        errors = [ln for ln in lines if ": error:" in ln]
        return (errors or lines or [""])[-1]
    return ""


def run_status(run_dir: str) -> RunStatus:
    """Where a run stands: running while its driver process lives (the app's, or a shell's
    holding the run's lock), else from its directory."""
    with open(os.path.join(run_dir, "config.json")) as f:
        total = json.load(f)["run"]["steps"]
    rows = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    step = rows[-1][M.STEP] + 1 if rows else 0
    info = {}
    with contextlib.suppress(OSError, ValueError), open(os.path.join(run_dir, "app.json")) as f:
        info = json.load(f)
    info = info if isinstance(info, dict) else {}
    by_app = bool(info) and _alive(run_dir, info)
    if by_app or lock_holder_alive(run_dir):
        outside = "" if by_app else " (started outside the app)"
        stopping = " (stopping)" if stop_requested(run_dir) else ""
        return RunStatus("running", step, total,
                         f"running{outside}{stopping}: step {step} of {total}")
    if os.path.exists(os.path.join(run_dir, "summary.json")):
        return RunStatus("finished", step, total, f"finished: {step} steps")
    resumable = "resumable" if list_checkpoints(run_dir) else "no checkpoint yet"
    if stop_requested(run_dir) or not info:  # stopped by the page, or run elsewhere
        return RunStatus("stopped", step, total, f"stopped at step {step} of {total}: {resumable}")
    last = _last_line(os.path.join(run_dir, "app.log"))
    return RunStatus("failed", step, total,
                     f"ended at step {step} of {total} ({resumable}): {last}")


def list_runs(root: str = "runs") -> list[str]:
    """Runs under `root`, newest first: directories homerl marked as runs (launch/rundir/
    ownership.py) that hold a config.json; never a dot-folder (the uploads)."""
    if not os.path.isdir(root):
        return []
    runs = [os.path.join(root, d) for d in os.listdir(root) if not d.startswith(".")
            and os.path.isfile(os.path.join(root, d, MARKER))
            and os.path.isfile(os.path.join(root, d, "config.json"))]
    return sorted(runs, key=lambda d: os.path.getmtime(os.path.join(d, "config.json")),
                  reverse=True)


def checkpoints(root: str = "runs") -> list[str]:
    """Models a user can evaluate or try: every run's final/ adapter and checkpoints."""
    out = []
    for run in list_runs(root):
        final = os.path.join(run, "final")
        if os.path.exists(os.path.join(final, "homerl.json")):
            out.append(final)
    return out


def kill_run(run_dir: str, timeout_s: float = 60.0) -> None:
    """SIGINT the driver's process group and wait (tests' cleanup; the page uses stop_run)."""
    proc = _PROCS.get(os.path.abspath(run_dir))
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
