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
    lock_run,
    mark_run,
    record_history,
    why_not_new,
    why_not_run,
)
from launch.rundir.resume import resume_config
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


def _fail(message: str):
    print(f"launch.train: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def resolve_run(argv=None) -> tuple[Config, str, bool, dict]:
    """(config, run dir, resume, {field: [old, new]} a resume changed) from the CLI; with
    --resume the run's own config.json wins, changed only by the flags in RESUMABLE. Any user
    error is one line on stderr and exit 2; nothing is written."""
    cfg, args = parse_config(argv, prog="launch.train", extra=_extra_args)
    run_dir = (cfg.run.run_dir or default_run_dir()) if args.resume is None else args.resume
    if (why := unwritable(run_dir)) is not None:  # before any actor starts
        _fail(f"{'--resume' if args.resume is not None else '--run-dir'} {run_dir}: {why}")
    if args.resume is None:
        if (why := why_not_new(run_dir)) is not None:  # never append to a run or a model dir
            _fail(why)
        return _sized(cfg, args), run_dir, False, {}
    if (why := why_not_run(run_dir)) is not None:
        _fail(why)
    try:
        saved, changes = resume_config(args, cfg)
    except ConfigError as e:
        _fail(str(e))
    return saved, run_dir, True, changes


def _sized(cfg: Config, args: argparse.Namespace) -> Config:
    """`cfg` sized for the machine (launch/plan/sizing.py), saying how in one log line; a split
    given by hand wins over the preset's sizing, and together with --cores is one error line."""
    import logging

    hand = [f"--{f}" for f in SPLIT_FLAGS if getattr(args, f, None) is not None]
    if hand and getattr(args, "run.cores", None) not in (None, "0"):
        _fail(f"--cores sizes the run; it cannot be given with {', '.join(hand)} (use one)")
    if hand:
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, cores=0))
    try:
        cfg, why = size_run(cfg)
    except ConfigError as e:
        _fail(str(e))
    if why:
        logging.getLogger("homerl.sizing").info("sized: %s", why)
    return cfg


def open_run(argv=None) -> tuple[Config, str, bool, RunLock]:
    """`resolve_run`, then the run directory marked as a run and locked for this driver (a live
    driver already on it: one line naming it, exit 2), leftovers of killed writers removed, and
    the start or resume (with what it changed) added to its config history."""
    cfg, run_dir, resume, changes = resolve_run(argv)
    created = not os.path.exists(run_dir)
    try:
        mark_run(run_dir)
        lock = lock_run(run_dir)
        lock.created = created
    except RunBusyError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"{run_dir}: {e}")
    if not resume and (why := why_not_new(run_dir)) is not None:  # trained while we waited
        lock.release()
        _fail(why)
    remove_leftovers(run_dir)
    record_history(run_dir, "resume" if resume else "start",
                   list(sys.argv[1:] if argv is None else argv), changes)
    return cfg, run_dir, resume, lock
