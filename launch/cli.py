"""Command-line parsing shared by every entry point.

Every config field is a flag `--section.field VALUE` whose help is the field's docstring; the
common ones have short aliases (`--steps`, `--seed`, `--run-dir`, `--model`). Errors are one line:
`error: --rollout.group_size: must be an integer; got 'x'`, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import logging
import os
import sys
import typing

from common.config import Config, ConfigError
from common.presets import PRESETS, get_preset
from launch.plan.sizing import size_run
from launch.rundir.checkpoints import remove_leftovers
from launch.rundir.ownership import (
    RunBusyError,
    RunLock,
    flag,
    lock_run,
    mark_run,
    record_history,
    why_not_new,
    why_not_run,
)
from launch.rundir.resume import given_flags, resume_config
from launch.rundir.writer import default_run_dir

ALIASES = {
    "--steps": "run.steps",
    "--seed": "run.seed",
    "--run-dir": "run.run_dir",
    "--model": "model.name",
    "--wandb-project": "run.wandb_project",
    "--max-staleness": "rollout.max_staleness",
    "--steps-per-call": "rollout.steps_per_call",
    "--device": "model.device",
    "--gpu-memory-gb": "model.gpu_memory_gb",
    "--cores": "run.cores",
    "--ram-gb": "run.ram_gb",
}
SPLIT_FLAGS = ("rollout.num_workers", "rollout.threads_per_worker", "rollout.learner_threads")
"""set by hand, these are the run's split, in place of run.cores' sizing"""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports errors as one line (no usage dump) and exits with 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


@functools.cache
def field_docs(cls) -> dict[str, str]:
    """Map field name -> the string literal right below it in the class body."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
            docs[node.target.id] = str(nxt.value.value)
    return docs


def _sections():
    """(section name, dataclass) for each sub-config of Config."""
    for f in dataclasses.fields(Config):
        if f.default_factory is not dataclasses.MISSING:
            yield f.name, f.default_factory


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Add --preset, the aliases and one --section.field flag per config field."""
    parser.add_argument("--preset", default=None,
                        help=f"named preset to start from (default cpu-demo): "
                        f"{', '.join(PRESETS)}")
    docs = {f"{sec}.{k}": v for sec, cls in _sections() for k, v in field_docs(cls).items()}
    for alias, dest in ALIASES.items():
        parser.add_argument(alias, f"--{dest}", dest=dest, default=None, metavar="V",
                            help=docs[dest].replace("%", "%%"))
    for section, cls in _sections():
        group = parser.add_argument_group(section)
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            name = f"{section}.{f.name}"
            if any(dest == name for dest in ALIASES.values()):
                continue
            group.add_argument(f"--{name}", dest=name, default=None, metavar=hints[f.name].__name__,
                               help=docs.get(f.name, "").replace("%", "%%"))


def config_from_args(args: argparse.Namespace) -> Config:
    """Start from the preset, apply every flag given, validate. Raises ConfigError (one line)."""
    cfg = get_preset(args.preset or "cpu-demo").to_dict()
    for section, cls in _sections():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            raw = getattr(args, f"{section}.{f.name}", None)
            if raw is None:
                continue
            typ = hints[f.name]
            try:
                value = _parse_bool(raw) if typ is bool else typ(raw)
            except ValueError:
                msg = f"--{section}.{f.name}: must be {typ.__name__}; got {raw!r}"
                raise ConfigError(msg) from None
            cfg[section][f.name] = value
    return Config.from_dict(cfg)


def parse_config(argv=None, prog: str | None = None,
                 extra=None) -> tuple[Config, argparse.Namespace]:
    """Parse argv into a validated Config; on a user error print one line and exit 2.

    `extra(parser)` may add entry-point specific flags (such as --resume).
    """
    parser = OneLineParser(prog=prog, description="Flags default to the --preset's values; "
                           "--section.field VALUE overrides one field.")
    add_config_args(parser)
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    try:
        return config_from_args(args), args
    except ConfigError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def _extra_args(parser) -> None:
    parser.add_argument("--resume", default=None, metavar="RUN_DIR",
                        help="continue RUN_DIR from its last complete checkpoint")


def unwritable(run_dir: str) -> str | None:
    """Why a run cannot write `run_dir` (read-only file system, no permission, a file in the
    way), or None; nothing is created. The run's first existing ancestor is what is checked."""
    path = os.path.abspath(run_dir)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return f"{path} is a file, not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        st = os.statvfs(path)
        ro = st.f_flag & os.ST_RDONLY
        return f"{path} is not writable ({'a read-only file system' if ro else 'no permission'})"
    return None


def in_a_jobs_copy(path: str) -> str | None:
    """Why `path` (a run directory, any file a driver writes) would be lost, or None: a relative
    path in the driver of `ray job submit --working-dir` names a place in Ray's copy of that
    directory (the job's working directory, deleted with the cluster's session), not in the
    user's checkout."""
    if os.path.isabs(path):
        return None
    try:  # Ray hands a job's driver its runtime env in this variable
        env = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", ""))["runtime_env"]
    except (ValueError, KeyError, TypeError):
        return None
    if not (env or {}).get("working_dir"):
        return None
    return (f"a relative path in a Ray job is inside Ray's temporary copy of --working-dir "
            f"({os.getcwd()}), deleted with the cluster: give an absolute one ($PWD/{path})")


class RunRefused(Exception):
    """A user error of a run's directory or settings, before anything is written: one line."""


def _fail(message: str):
    raise RunRefused(message)


def plan_run(cfg: Config, run_dir: str, resume: bool, given: list[str] | tuple = (),
             preset: str | None = None, spell=flag) -> tuple[Config, dict]:
    """The config a run in `run_dir` trains with, and {field: [old, new]} that a resume
    changed: what every way of starting a run shares (the command line, `homerl.GRPOTrainer`).
    A new run is `cfg` sized for this machine; a resume is the run's own config.json changed
    only by the RESUMABLE fields among `given` (the `section.field` names the caller set;
    `preset` the preset it named). RunRefused (one line, each field spelt by `spell`) for a
    directory it cannot write, a new run where a run is, a resume where none is, or a change a
    resume may not make. Nothing is written."""
    where = spell("resume" if resume else "run.run_dir")
    for check in (in_a_jobs_copy, unwritable):  # before any actor starts
        if (why := check(run_dir)) is not None:
            _fail(f"{where} {run_dir}: {why}")
    if not resume:
        if (why := why_not_new(run_dir, spell)) is not None:  # never append to a run or a model
            _fail(why)
        return _sized(cfg, given, spell), {}
    if (why := why_not_run(run_dir, spell)) is not None:
        _fail(why)
    try:
        return resume_config(run_dir, cfg, list(given), preset, spell)
    except ConfigError as e:
        _fail(str(e))


def resolve_run(argv=None, prog: str = "launch.train", extra=None, check=None
                ) -> tuple[Config, str, bool, dict, argparse.Namespace]:
    """(config, run dir, resume, {field: [old, new]} a resume changed, parsed flags) from the
    command line of entry point `prog` (`extra(parser)` adds its own flags; `check(run_dir,
    resume)` returns why the entry point refuses that directory, or None): `plan_run` of the
    flags. Any user error is one line on stderr and exit 2; nothing is written."""
    def flags(parser):
        _extra_args(parser)
        if extra is not None:
            extra(parser)

    cfg, args = parse_config(argv, prog=prog, extra=flags)
    resume = args.resume is not None
    run_dir = args.resume if resume else (cfg.run.run_dir or default_run_dir())
    try:
        cfg, changes = plan_run(cfg, run_dir, resume, given_flags(args), args.preset)
        if check is not None and (why := check(run_dir, resume)) is not None:
            _fail(why)
    except RunRefused as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return cfg, run_dir, resume, changes, args


def _sized(cfg: Config, given, spell) -> Config:
    """`cfg` sized for the machine (launch/plan/sizing.py), saying how in one log line; a split
    given by hand wins over the preset's sizing, and together with run.cores is one error line."""
    hand = [spell(f) for f in SPLIT_FLAGS if f in given]
    if hand and "run.cores" in given and cfg.run.cores != 0:
        _fail(f"{spell('run.cores')} sizes the run; it cannot be given with {', '.join(hand)} "
              "(use one)")
    if hand:
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, cores=0))
    try:
        cfg, why = size_run(cfg)
    except ConfigError as e:
        _fail(str(e))
    if why:
        logging.getLogger("homerl.sizing").info("sized: %s", why)
    return cfg


def claim_run(run_dir: str, resume: bool, changes: dict, argv: list[str],
              spell=flag) -> RunLock:
    """Take `run_dir` for this driver: marked as a run and locked (a live driver already on
    it: RunRefused naming it), leftovers of killed writers removed, the start or resume (with
    what it changed, and `argv`, what asked for it) added to its config history. What every
    way of starting a run calls after `plan_run`; the caller releases the lock."""
    created = not os.path.exists(run_dir)
    try:
        mark_run(run_dir)
        lock = lock_run(run_dir)
        lock.created = created
    except RunBusyError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"{run_dir}: {e}")
    if not resume and (why := why_not_new(run_dir, spell)) is not None:  # trained meanwhile
        lock.release()
        _fail(why)
    remove_leftovers(run_dir)
    try:
        record_history(run_dir, "resume" if resume else "start", argv, changes)
    except OSError as e:
        lock.release()
        _fail(str(e))
    return lock


def open_run(argv=None, prog: str = "launch.train", extra=None, check=None
             ) -> tuple[Config, str, bool, RunLock, argparse.Namespace]:
    """What every entry point that writes a run directory calls first (`python -m
    launch.train`, `python -m launch.demo`): `resolve_run`, then `claim_run`. Returns (config,
    run dir, resume, the lock, the parsed flags); a user error is one line and exit 2."""
    cfg, run_dir, resume, changes, args = resolve_run(argv, prog, extra, check)
    try:
        lock = claim_run(run_dir, resume, changes, list(sys.argv[1:] if argv is None else argv))
    except RunRefused as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return cfg, run_dir, resume, lock, args
