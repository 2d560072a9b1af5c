"""The "file" task: a user's own dataset, trained on and evaluated like the built-in tasks.

    --curriculum.task file --curriculum.data_path data.csv [--curriculum.prompt_field question]
    [--curriculum.answer_field answer] [--curriculum.verifier numeric] ...

Each row becomes a sample (`tasks.registry`' schema). The prompt is the `prompt_field` column
("auto": the first of messages, prompt, question, problem that the file has): text, or a chat
list of {"role", "content"} messages (the sample's "messages"; its "question" is then the last
user message, for display). With `prompt_as_is` (TRL's convention, what homerl.GRPOTrainer
sets) a text prompt is the model's input as it stands and chat messages go through the chat
template with nothing added (the sample's "as_is"). The answer is the `answer_field` column as
a string (numbers through `str`); with an empty `answer_field` the rows have no reference, for
reward functions that need none. Every column but the prompt goes into the sample's "columns",
which reward functions get as keyword arguments (TRL's convention); a column whose values are
not JSON is dropped, with one warning naming it.

Bad rows (no prompt, an empty one, malformed messages, a missing or non-scalar answer) are
skipped: one warning names the first few by row (line, for JSONL) and field and counts the rest.
A file that cannot be read, has no usable rows or lacks the mapped columns is one line of
`DatasetError`.

Held-out split: `heldout_size` distinct prompts are split off by a shuffle seeded with
`heldout_seed` (an order by hash, so the file's row order does not matter), disjoint by prompt
text (rows whose prompts match once whitespace and case are folded go to the same side; the
held-out set keeps one row of each). With `heldout_path` that
file (read with the same mapping) is the held-out set and `heldout_size` does not apply; training
rows whose prompt it also holds are dropped, with a warning counting them. A `save_to_disk`
DatasetDict folder with a "test" split uses it the same way when `heldout_path` is empty.
`heldout_size` 0 (and no held-out file): no held-out set.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from dataclasses import dataclass

from tasks import DatasetError
from tasks.epochs import EpochOrder
from tasks.file_rows import Table, read_table

AUTO_PROMPT_FIELDS = ("messages", "prompt", "question", "problem")
ROLES = ("system", "user", "assistant", "tool")
LISTED_BAD_ROWS = 5
"""bad rows named in the warning; the rest are counted"""


@dataclass(frozen=True)
class FileOptions:
    """How a file's rows become samples: `curriculum`'s fields of the same names."""

    prompt_field: str = "auto"
    answer_field: str = "answer"
    verifier: str = "numeric"
    system_prompt: str = ""
    instruction: str = ""
    heldout_path: str = ""
    heldout_size: int = 100
    heldout_seed: int = 0
    prompt_as_is: bool = False

    @classmethod
    def from_config(cls, curriculum) -> FileOptions:
        """The options of a `CurriculumConfig` (or anything with its field names)."""
        return cls(**{name: getattr(curriculum, name) for name in cls.__dataclass_fields__})


class _BadRow(Exception):
    """A row that cannot be a sample."""

    def __init__(self, field: str, why: str):
        super().__init__(why)
        self.field, self.why = field, why


def prompt_column(columns: list[str], opts: FileOptions, path: str) -> str:
    """The column holding the prompt; DatasetError naming the columns when it is missing."""
    if opts.prompt_field != "auto":
        if opts.prompt_field not in columns:
            raise DatasetError(f"{path}: no column {opts.prompt_field!r} "
                               f"(curriculum.prompt_field); its columns: {_names(columns)}")
        return opts.prompt_field
    for name in AUTO_PROMPT_FIELDS:
        if name in columns:
            return name
    raise DatasetError(f"{path}: no prompt column ({', '.join(AUTO_PROMPT_FIELDS)}); set "
                       f"curriculum.prompt_field to one of its columns: {_names(columns)}")


def _names(columns: list[str]) -> str:
    return ", ".join(map(repr, columns)) if columns else "none"


def _messages(value: list, field: str) -> list[dict]:
    """A chat prompt as [{"role", "content"}], or _BadRow."""
    out = []
    for m in value:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(
                m.get("content"), str):
            raise _BadRow(field, "malformed messages: each must be {'role', 'content'} with a "
                          f"role of {', '.join(ROLES)} and text content")
        out.append({"role": m["role"], "content": m["content"]})
    users = [m["content"] for m in out if m["role"] == "user"]
    if not users or not users[-1].strip():
        raise _BadRow(field, "malformed messages: no user message with text")
    return out


def _prompt(row: dict, field: str) -> dict:
    """{"question"} or {"question", "messages"} of a row, or _BadRow."""
    value = row.get(field)
    if value is None:
        raise _BadRow(field, "missing prompt")
    if isinstance(value, str):
        if not value.strip():
            raise _BadRow(field, "empty prompt")
        return {"question": value.strip()}
    if isinstance(value, list):
        messages = _messages(value, field)
        last = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        return {"question": last.strip(), "messages": messages}
    raise _BadRow(field, f"prompt is a {type(value).__name__}, not text or a messages list")


def _answer(row: dict, field: str) -> str:
    """The reference as a string, or _BadRow."""
    value = _plain(row.get(field))
    if value is None:
        raise _BadRow(field, "missing answer")
    if not isinstance(value, (str, int, float, bool)):
        raise _BadRow(field, f"answer is a {type(value).__name__}, not text or a number")
    text = str(value).strip()
    if not text:
        raise _BadRow(field, "empty answer")
    return text


def _plain(value):
    """numpy and pyarrow scalars as Python ones (rows from `datasets` are plain already); a float
    NaN (a missing value) as None."""
    if not isinstance(value, (str, bytes, list, dict, int, float)) and value is not None:
        for method in ("as_py", "item"):
            if callable(getattr(value, method, None)):
                try:
                    value = getattr(value, method)()
                    break
                except (TypeError, ValueError):
                    pass
    return None if isinstance(value, float) and math.isnan(value) else value


def to_samples(table: Table, opts: FileOptions, path: str) -> list[dict]:
    """The table's usable rows as samples; bad rows and columns warned about (see the module
    docstring); DatasetError when none is usable."""
    if not table.rows and not table.broken:
        raise DatasetError(f"{path}: no rows")
    field = prompt_column(table.columns, opts, path)
    if opts.answer_field and opts.answer_field not in table.columns:
        raise DatasetError(f"{path}: no column {opts.answer_field!r} (curriculum.answer_field; "
                           f"empty: no reference); its columns: {_names(table.columns)}")
    stem = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    extras = {"task": "file", "level": 0, "verifier": opts.verifier}
    extras.update({"system": opts.system_prompt} if opts.system_prompt else {})
    extras.update({"instruction": opts.instruction} if opts.instruction else {})
    extras.update({"as_is": True} if opts.prompt_as_is else {})
    samples, bad = [], [(n, "-", why) for n, why in table.broken]
    for row, number in zip(table.rows, table.numbers):
        try:
            prompt = _prompt(row, field)
            answer = _answer(row, opts.answer_field) if opts.answer_field else ""
        except _BadRow as e:
            bad.append((number, e.field, e.why))
            continue
        columns = {k: _plain(v) for k, v in row.items() if k != field}
        samples.append({"id": f"{stem}-{number}", **prompt, "answer": answer, **extras,
                        "columns": columns})
    _report_bad(path, table.unit, bad, len(samples))
    _drop_unserialisable(samples, path)
    return samples


def _report_bad(path: str, unit: str, bad: list[tuple[int, str, str]], usable: int) -> None:
    """One warning naming the first LISTED_BAD_ROWS bad rows; DatasetError when none is usable."""
    if not bad:
        return
    bad.sort()
    named = "; ".join(f"{unit} {n}: " + (f"field {f!r}: " if f != "-" else "") + why
                      for n, f, why in bad[:LISTED_BAD_ROWS])
    more = f" (+{len(bad) - LISTED_BAD_ROWS} more)" if len(bad) > LISTED_BAD_ROWS else ""
    if not usable:
        raise DatasetError(f"{path}: no usable rows; {len(bad)} bad: {named}{more}")
    warnings.warn(f"{path}: skipped {len(bad)} bad {unit}(s): {named}{more}", stacklevel=4)


def _drop_unserialisable(samples: list[dict], path: str) -> None:
    """Drop the columns with a value that is not JSON (samples cross processes as JSON)."""
    dropped: set[str] = set()
    for s in samples:
        for name, value in s["columns"].items():
            if name not in dropped:
                try:
                    json.dumps(value, allow_nan=False)
                except (TypeError, ValueError):
                    dropped.add(name)
    if dropped:
        for s in samples:
            for name in dropped:
                s["columns"].pop(name, None)
        warnings.warn(f"{path}: column(s) {_names(sorted(dropped))} dropped: values that are not "
                      "JSON (reward functions will not get them)", stacklevel=4)


def prompt_key(sample: dict) -> str:
    """What makes two prompts the same: their text with whitespace and case folded (a chat
    prompt: every message, with its role)."""
    fold = " ".join(sample["question"].split()).casefold()
    if "messages" not in sample:
        return fold
    return json.dumps([[m["role"], " ".join(m["content"].split()).casefold()]
                       for m in sample["messages"]])


def split_heldout(samples: list[dict], size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(training, held-out): the `size` distinct prompts first in an order seeded with `seed`
    (sha256 of seed and prompt: the file's row order does not matter, and rows added later do
    not move a prompt across unless it is displaced), one row of each; every row of a held-out
    prompt stays out of training."""
    groups: dict[str, list[dict]] = {}
    for s in samples:
        groups.setdefault(prompt_key(s), []).append(s)
    keys = sorted(groups, key=lambda k: hashlib.sha256(f"{seed}\0{k}".encode()).hexdigest())
    taken = set(keys[:size])
    heldout = [groups[k][0] for k in keys[:size]]
    return [s for s in samples if prompt_key(s) not in taken], heldout


def _heldout_table(path: str, table: Table, opts: FileOptions) -> tuple[Table, str] | None:
    """(the held-out table, its name) from heldout_path or a DatasetDict's test split; None:
    the held-out set is split off the training file."""
    if opts.heldout_path:
        held = read_table(opts.heldout_path, opts.answer_field)
        return held.test or held, opts.heldout_path  # a DatasetDict folder: its test split
    if table.test is not None:
        return table.test, f"{path} (its 'test' split)"
    return None


def load_file_task(path: str, opts: FileOptions) -> tuple[list[dict], list[dict]]:
    """(training samples, held-out samples) of `path` under `opts` (the module docstring)."""
    table = read_table(path, opts.answer_field)
    samples = to_samples(table, opts, path)
    given = _heldout_table(path, table, opts)
    if given is None:
        train, heldout = split_heldout(samples, opts.heldout_size, opts.heldout_seed)
        why = f"curriculum.heldout_size is {opts.heldout_size}; lower it"
    else:
        heldout = to_samples(given[0], opts, given[1])
        reserved = {prompt_key(s) for s in heldout}
        train = [s for s in samples if prompt_key(s) not in reserved]
        why = f"all in the held-out set {given[1]}"
        if 0 < len(train) < len(samples):
            warnings.warn(f"{path}: dropped {len(samples) - len(train)} training row(s) whose "
                          f"prompt is also in the held-out set {given[1]}", stacklevel=3)
    if not train:
        distinct = len({prompt_key(s) for s in samples})
        raise DatasetError(f"{path}: no training rows left: {distinct} distinct prompt(s), {why}")
    return train, heldout


class FileTask:
    """A user's dataset (the module docstring), with a seeded, per-epoch training order."""

    name = "file"

    def __init__(self, path: str, options: FileOptions | None = None, seed: int = 0):
        self.path, self.options, self.seed = path, options or FileOptions(), seed
        self._train, self._heldout = load_file_task(path, self.options)
        self._order = EpochOrder(len(self._train), f"{self.seed}-file")

    def __len__(self) -> int:
        """Number of training rows (one epoch)."""
        return len(self._train)

    def train_sample(self, i: int) -> dict:
        """Training sample number `i`: epoch ``i // len(self)``, reshuffled each epoch."""
        return json.loads(json.dumps(self._train[self._order.index(i)]))

    def heldout(self, n: int) -> list[dict]:
        """The first `n` held-out samples, the same for every run seed."""
        return [json.loads(json.dumps(s)) for s in self._heldout[: max(n, 0)]]
