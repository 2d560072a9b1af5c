"""`launch.train --resume RUN_DIR [flags]`: the run's own config, and what a resume may change.

The run's config.json is the config; a flag on the command line either changes a setting in
RESUMABLE (recorded in RUN_DIR/config-history.jsonl, launch/rundir/ownership.py) or, if it would
change what is learnt or the data order (seed, lr, model, task, group size, ...), is refused in one
line. A flag equal to the run's own value changes nothing and is accepted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from common.config import Config, ConfigError
from launch.rundir.ownership import flag

RESUMABLE = ("run.steps", "run.checkpoint_every", "run.keep_checkpoints", "run.sample_every",
             "run.eval_n", "run.wandb_project", "run.max_learner_restarts",
             "run.learner_timeout_s", "run.checkpoint_fail_policy", "run.wait_for_capacity_s",
             "run.learner_tcmalloc", "rollout.call_timeout_s")
"""settings a resume may change: how long, how often it checkpoints and logs, where it
reports, how it survives faults. None of them changes the numbers a step computes."""


def read_run_config(path: str) -> Config:
    """The Config of a run's config.json; a ConfigError (one line naming the file) if it is
    missing, not JSON, or not a valid config."""
    try:
        with open(path) as f:
            saved = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"--resume: {path} not found") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"--resume: {path}: not valid JSON ({e})") from None
    if not isinstance(saved, dict) or not all(isinstance(v, dict) for k, v in saved.items()
                                              if k != "preset"):
        raise ConfigError(f"--resume: {path}: not a run's config (a JSON object of sections "
                          "such as model, run)")
    try:
        return Config.from_dict(saved)
    except (ConfigError, TypeError, ValueError) as e:
        raise ConfigError(f"--resume: {path}: {e}") from None


def given_flags(args: argparse.Namespace) -> list[str]:
    """The `section.field` of every config flag given on the command line."""
    return [f"{sec.name}.{f.name}" for sec in dataclasses.fields(Config)
            if sec.default_factory is not dataclasses.MISSING
            for f in dataclasses.fields(sec.default_factory)
            if getattr(args, f"{sec.name}.{f.name}", None) is not None]


def _get(cfg: Config, name: str):
    section, field = name.split(".")
    return getattr(getattr(cfg, section), field)


def resume_config(run_dir: str, flags_cfg: Config, given: list[str], preset: str | None = None,
                  spell=flag) -> tuple[Config, dict]:
    """(the run's config with the RESUMABLE fields among `given` applied, {field: [old, new]}).
    `flags_cfg` holds the given fields' typed values; `preset` the preset named, if any;
    `spell(name)` how the caller's user writes a field (a flag by default). A ConfigError (one
    line) for an unreadable config.json or a field a resume may not change."""
    saved = read_run_config(os.path.join(run_dir, "config.json"))
    refused, changes = [], {}
    if preset is not None and preset != saved.preset:
        refused.append(spell("preset"))
    for name in given:
        old, new = _get(saved, name), _get(flags_cfg, name)
        if name == "run.run_dir":
            if os.path.abspath(new) != os.path.abspath(run_dir):
                refused.append(spell(name))
        elif new != old:
            (changes.__setitem__(name, [old, new]) if name in RESUMABLE
             else refused.append(spell(name)))
    if refused:
        allowed = ", ".join(spell(n) for n in RESUMABLE)
        raise ConfigError(f"{spell('resume')} {run_dir}: {', '.join(refused)} cannot change on "
                          "resume (it would change what is learnt or the data order); drop it, or "
                          f"start a new run. A resume may change: {allowed}")
    cfg = saved.to_dict()
    for name, (_, new) in changes.items():
        section, field = name.split(".")
        cfg[section][field] = new
    try:
        return Config.from_dict(cfg), changes
    except (ConfigError, TypeError, ValueError) as e:
        raise ConfigError(f"{spell('resume')} {run_dir}: {e}") from None
