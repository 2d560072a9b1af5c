"""The reward functions a run holds by value (rewards/byvalue.py):

    RUN_DIR/reward_fns/<name>.pkl     one packed function, named in reward.fn as by-value:<name>

`homerl.GRPOTrainer` writes them when it starts or resumes a run (a resume may bring new code
for the same name: the newest is used); the driver reads the ones its reward.fn names and hands
the bytes to every rollout worker, so a cluster's other nodes need no copy of the run
directory. Loading them runs their code: like a `module:function` spec, a run's reward_fns/
is trusted, and the web app refuses to start or resume such a run.
"""

from __future__ import annotations

import contextlib
import os

from common.config import ConfigError
from common.durable import fsync_dir, rename
from rewards.byvalue import is_by_value, name_of

FOLDER = "reward_fns"


def code_path(run_dir: str, name: str) -> str:
    return os.path.join(run_dir, FOLDER, f"{name}.pkl")


def write_reward_code(run_dir: str, packed: dict[str, bytes]) -> None:
    """Write {name: packed bytes} into the run, each file whole or not at all."""
    os.makedirs(os.path.join(run_dir, FOLDER), exist_ok=True)
    for name, blob in packed.items():
        path = code_path(run_dir, name)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            rename(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
    fsync_dir(os.path.join(run_dir, FOLDER))


def read_reward_code(run_dir: str, reward_cfg) -> dict[str, bytes]:
    """{spec: packed bytes} of every `by-value:` spec in `reward_cfg.fn`; a ConfigError (one
    line) naming a spec whose file is missing or unreadable."""
    code = {}
    for spec in reward_cfg.fns():
        if not is_by_value(spec):
            continue
        path = code_path(run_dir, name_of(spec))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                code[spec] = f.read()
        except OSError as e:
            raise ConfigError(f"reward.fn: {spec}: cannot read {path} ({e.strerror or e}); a "
                              "function passed by value lives there, written by "
                              "homerl.GRPOTrainer: pass it again with reward_funcs") from None
    return code
