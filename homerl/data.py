"""An in-memory dataset, written into the run directory so that a resume, the web app and
`launch.evaluate` see the run's own data:

    RUN_DIR/data/train.parquet     train_dataset
    RUN_DIR/data/eval.parquet      eval_dataset (the run's held-out set), when given

A dataset is a `datasets.Dataset`, an `IterableDataset` (its first `limit` rows: what the run
can use), a list of dicts or a dict of columns, with a `prompt` column in either of TRL's
formats: text (used as it stands) or conversational (a list of {"role", "content"} messages,
through the chat template). Every other column reaches the reward functions as a keyword
argument; an `answer` column is also the reference the run's verifier checks
(`curriculum.verifier`) for `reward/correct`.
"""

from __future__ import annotations

import itertools
import os

from common.config import ConfigError

FOLDER = "data"


def as_dataset(data, what: str, limit: int | None = None):
    """`data` as a `datasets.Dataset` (an IterableDataset: its first `limit` rows).
    ConfigError (one line) for anything else, an empty one or one without a prompt column."""
    from datasets import Dataset, IterableDataset  # the datasets import costs seconds

    if isinstance(data, Dataset):
        ds = data
    elif isinstance(data, IterableDataset):
        ds = Dataset.from_list(list(itertools.islice(data, limit)))
    elif isinstance(data, list) and all(isinstance(r, dict) for r in data):
        ds = Dataset.from_list(data)
    elif isinstance(data, dict):
        ds = Dataset.from_dict(data)
    else:
        raise ConfigError(f"{what}: a datasets.Dataset, IterableDataset, list of dicts or dict "
                          f"of columns; got a {type(data).__name__}")
    if "prompt" not in ds.column_names:
        raise ConfigError(f"{what}: needs a 'prompt' column (text, or a list of chat messages; "
                          f"TRL's formats); its columns: {', '.join(ds.column_names) or 'none'}")
    if len(ds) == 0:
        raise ConfigError(f"{what}: has no rows")
    return ds


def rows(data) -> int | None:
    """The rows of `data` where it knows them (None for an IterableDataset)."""
    from datasets import IterableDataset

    return None if isinstance(data, IterableDataset) else len(data)


def data_path(run_dir: str, split: str) -> str:
    return os.path.join(os.path.abspath(run_dir), FOLDER, f"{split}.parquet")


def write_split(ds, run_dir: str, split: str) -> str:
    """Write `ds` as RUN_DIR/data/<split>.parquet (whole or not at all); returns its path."""
    path = data_path(run_dir, split)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        ds.to_parquet(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
