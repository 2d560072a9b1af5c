"""What the web app lets a page do: the server's policy, set by `python -m launch.app` flags.

The app starts processes and reads files on the server, so whoever reaches the page acts as
the user who runs it. By default it is closed:

* it serves on loopback; another address needs a login (`--auth-file` or HOMERL_APP_AUTH:
  never on the command line, where `ps` shows it to every local user), rate-limited per client
  (`launch/app/login.py`);
* run directories are the app's runs folder's runs (marked by homerl); models are the embedded
  ones and the runs' checkpoints; datasets come from `--data-dir` or the page's uploads (kept in
  the runs folder's `.uploads/`, which is never a run, under names the server chooses);
  anything else, a hub id or a path elsewhere, only with `--allow-any-path`;
* reward functions are code run on the server: only the `module:function` specs the server
  lists with `--reward-fn` (the built-in verifiers need no listing); `reward.unsandboxed_code`
  never; Resume checks a run's config.json as Start checks a form;
* every input is capped: an upload's size and the uploads' total, the Try prompt, pass@k
  samples, problems per set, and runs going at once (one by default).

Each check raises `PolicyError` with one line naming the field, the limit and the flag that
lifts it. No Gradio here: `launch/app/ui.py` builds a `Policy` and the callbacks enforce it.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from common.config import VERIFIERS, Config
from rewards.byvalue import is_by_value

EMBEDDED = ("smollm2-135m-instruct", "tiny-random-llama")
"""the models that ship with the project (always allowed)"""
UPLOADS = ".uploads"
"""the uploads' folder in the runs folder: a dot-folder, which no run list shows"""
AUTH_ENV = "HOMERL_APP_AUTH"
"""the environment variable holding the login as user:password"""


class PolicyError(ValueError):
    """A page asked for something the server's policy does not allow: one line."""


@dataclass(frozen=True)
class Policy:
    runs_root: str = "runs"
    """the app's runs folder: run directories, checkpoints and uploads live here"""
    data_dir: str = ""
    """a server folder whose datasets the Train tab lists (empty: uploads only)"""
    any_path: bool = False
    """allow any model (hub ids too), dataset and run directory the page names"""
    reward_fns: tuple[str, ...] = ()
    """`module:function` reward functions the page may pick (built-in verifiers always)"""
    max_upload_mb: float = 20.0
    """largest upload (a dataset or an evaluation file), MB"""
    max_uploads_mb: float = 0.0
    """the kept uploads' total, MB (0: 10 x max_upload_mb)"""
    max_prompt_chars: int = 2000
    """longest Try prompt, characters"""
    max_samples: int = 16
    """most pass@k samples per question"""
    max_eval_n: int = 1000
    """most problems per built-in evaluation set"""
    max_runs: int = 1
    """training runs going at once"""

    @property
    def uploads_dir(self) -> str:
        return os.path.join(self.runs_root, UPLOADS)

    @property
    def uploads_quota_mb(self) -> float:
        return self.max_uploads_mb or 10 * self.max_upload_mb

    def _inside(self, path: str, *roots: str) -> bool:
        real = os.path.realpath(path)
        return any(r and os.path.commonpath([real, os.path.realpath(r)]) == os.path.realpath(r)
                   for r in roots)

    def check_run_dir(self, run_dir: str) -> str:
        """A run directory inside the runs folder (symlinks resolved), never the uploads."""
        if self._inside(run_dir, self.uploads_dir):
            raise PolicyError(f"run: {run_dir} is in the app's uploads folder, which holds "
                              "datasets, never a run")
        if not self.any_path and not self._inside(run_dir, self.runs_root):
            raise PolicyError(f"run: {run_dir} is outside the app's runs folder "
                              f"{self.runs_root} (the server's --allow-any-path lifts this)")
        return run_dir

    def check_model(self, name: str, checkpoints: list[str]) -> str:
        """An embedded model or one of the runs' checkpoints."""
        if self.any_path or name in EMBEDDED:
            return name
        if name in checkpoints and self._inside(name, self.runs_root):
            return name
        raise PolicyError(f"model: {name!r} is not one the app lists (embedded: "
                          f"{', '.join(EMBEDDED)}; or a run's final/); the server's "
                          "--allow-any-path allows other paths and hub ids")

    def check_data(self, path: str) -> str:
        """A dataset in --data-dir or among the uploads."""
        if self.any_path or self._inside(path, self.data_dir, self.uploads_dir):
            return path
        where = f"{self.data_dir} or " if self.data_dir else ""
        raise PolicyError(f"dataset: {path} is not in {where}the app's uploads; upload it, or "
                          "the server's --data-dir / --allow-any-path")

    def check_reward_fns(self, specs: list[str]) -> list[str]:
        """Built-in verifiers and the server's listed `module:function` specs only; never a
        `by-value:` function (its code is a pickle in the run directory)."""
        for spec in specs:
            if is_by_value(spec):
                raise PolicyError(f"reward functions: {spec!r} is a function packed into the run "
                                  "directory by homerl.GRPOTrainer (loading it runs its code); "
                                  "the app does not run those: resume it from Python")
            if spec not in VERIFIERS and spec not in self.reward_fns:
                allowed = ", ".join([*VERIFIERS, *self.reward_fns])
                raise PolicyError(f"reward functions: {spec!r} is not on the server's list "
                                  f"({allowed}); the server adds one with --reward-fn")
        return specs

    def check_config(self, cfg: Config, checkpoints: list[str]) -> Config:
        """A run's config as Start and Resume allow it: its model, datasets and reward
        functions, and no `reward.unsandboxed_code`."""
        self.check_model(cfg.model.name, checkpoints)
        for path in filter(None, (cfg.curriculum.data_path, cfg.curriculum.heldout_path)):
            self.check_data(path)
        self.check_reward_fns(cfg.reward.fns())
        if cfg.reward.unsandboxed_code:
            raise PolicyError("reward.unsandboxed_code: must be false in a run the app starts "
                              "(it runs completions' code without isolation); run "
                              "launch.train from a shell for that")
        return cfg

    def check_upload(self, path: str) -> str:
        size_mb = os.path.getsize(path) / 1e6
        if size_mb > self.max_upload_mb:
            raise PolicyError(f"upload: {os.path.basename(path)} is {size_mb:.1f} MB; at most "
                              f"{self.max_upload_mb:g} MB (the server's --max-upload-mb)")
        return path

    def check_uploads_total(self, kept_bytes: int, new_bytes: int) -> None:
        """Room in the uploads folder for `new_bytes` more."""
        total_mb = (kept_bytes + new_bytes) / 1e6
        if total_mb > self.uploads_quota_mb:
            raise PolicyError(f"uploads: {kept_bytes / 1e6:.1f} MB kept + {new_bytes / 1e6:.1f} "
                              f"MB is over the total of {self.uploads_quota_mb:g} MB; remove "
                              f"old files from {self.uploads_dir} (or the server's "
                              "--max-uploads-mb)")

    def check_prompt(self, prompt: str) -> str:
        if len(prompt) > self.max_prompt_chars:
            raise PolicyError(f"prompt: {len(prompt)} characters; at most "
                              f"{self.max_prompt_chars}")
        return prompt

    def check_eval(self, n: int, samples: int) -> None:
        if n > self.max_eval_n:
            raise PolicyError(f"problems per set: {n}; at most {self.max_eval_n}")
        if samples > self.max_samples:
            raise PolicyError(f"samples for pass@k: {samples}; at most {self.max_samples}")

    def check_capacity(self, running: int) -> None:
        if running >= self.max_runs:
            raise PolicyError(f"runs: {running} already running; at most {self.max_runs} at once "
                              "(stop one, or the server's --max-runs)")


def is_loopback(host: str) -> bool:
    """Does `host` serve this machine only (127.0.0.0/8, ::1, localhost)?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_auth(auth_file: str, env_value: str = "") -> tuple[str, str] | None:
    """(user, password) from the first line of `--auth-file` or from HOMERL_APP_AUTH's value;
    None when neither is given. Raises PolicyError on an unreadable file or a malformed value."""
    text, source = env_value.strip(), AUTH_ENV
    if auth_file:
        try:
            with open(auth_file) as f:
                text, source = f.readline().strip(), "--auth-file"
        except OSError as e:
            raise PolicyError(f"--auth-file: {auth_file}: {e.strerror}") from None
    if not text:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or len(password) < 8:
        raise PolicyError(f"{source}: must be user:password with a password of 8 or more "
                          "characters")
    return user, password
