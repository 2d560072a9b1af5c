"""Scoring, for a script or a notebook: a model's held-out accuracy (`evaluate`) and a batch of
completions checked by a built-in verifier (`score`), the way training checks them.

    homerl.evaluate("runs/len/final", dataset)            # {"accuracy": ..., "format_rate": ...}
    homerl.evaluate("smollm2-135m-instruct", task="arith-1", n=100)
    homerl.score(["6 x 7 = 42\\nAnswer: 42"], ["42"])       # [1.0]
"""

from __future__ import annotations

import os
import tempfile

import torch

from common.config import ConfigError
from common.task_config import VERIFIERS
from homerl import data as run_data
from launch.evaluate.saved_models import evaluate_many
from launch.evaluate.sets import heldout_sets
from rewards.sandbox.pool import score_completions
from tasks.file_rows import read_table
from tasks.file_task import FileOptions, to_samples


def evaluate(model: str, dataset=None, *, task: str = "arith-1", n: int = 100,
             verifier: str = "numeric", max_new_tokens: int = 64, batch_size: int = 16,
             prompt_as_is: bool = True) -> dict:
    """Greedy completions of `model` (a name, a path, or a run's final/) for up to `n`
    problems, checked by their verifier: {"accuracy", "strict_accuracy", "format_rate",
    "mean_completion_tokens", ...}. The problems are `dataset`'s rows (a `prompt` and an
    `answer` column, TRL's formats; `prompt_as_is` as homerl.GRPOTrainer trains), else the
    held-out set `task` (python -m launch.evaluate --sets names it: arith-1, arith-2-unseen,
    gsm8k with its local file). Runs in this process, on its cores."""
    if verifier not in VERIFIERS:
        raise ConfigError(f"evaluate: verifier: {verifier!r}; allowed: {', '.join(VERIFIERS)}")
    if dataset is None:
        try:
            sets = heldout_sets(task, n, None)
        except ValueError as e:
            raise ConfigError(f"evaluate: task: {e}") from None
    else:
        sets = {"dataset": _samples(dataset, n, verifier, prompt_as_is)}
    results = evaluate_many([model], sets, torch.float32, max_new_tokens, batch_size)
    return next(iter(results[0]["sets"].values()))


def _samples(dataset, n: int, verifier: str, as_is: bool) -> list[dict]:
    """The first `n` rows of `dataset` as samples (through a Parquet file, as a run reads it)."""
    ds = run_data.as_dataset(dataset, "evaluate: dataset", n)
    if "answer" not in ds.column_names:
        raise ConfigError("evaluate: dataset: needs an 'answer' column (the reference its "
                          f"verifier checks); its columns: {', '.join(ds.column_names)}")
    with tempfile.TemporaryDirectory() as tmp:
        path = run_data.write_split(ds.select(range(min(n, len(ds)))), tmp, "eval")
        opts = FileOptions(prompt_field="prompt", answer_field="answer", verifier=verifier,
                           heldout_size=0, prompt_as_is=as_is)
        return to_samples(read_table(path, "answer"), opts, os.path.basename(path))


def score(completions: list[str], answers: list[str], verifier: str = "numeric",
          timeout_s: float = 2.0) -> list[float]:
    """(N,) 0/1: each completion checked against its reference by a built-in verifier (its
    own process, a time limit per item; python-tests isolated, as in training)."""
    if verifier not in VERIFIERS:
        raise ConfigError(f"score: verifier: {verifier!r}; allowed: {', '.join(VERIFIERS)}")
    if len(completions) != len(answers):
        raise ConfigError(f"score: {len(completions)} completions for {len(answers)} answers")
    results = score_completions(list(completions), list(answers), timeout_s=timeout_s,
                                verifiers=[verifier] * len(completions))
    return [r.score for r in results]
