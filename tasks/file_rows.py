"""Reading a user's dataset into plain rows: JSONL (or a JSON list), CSV/TSV, Parquet, or a folder
written by `datasets`' `save_to_disk` (a `DatasetDict` folder: its "train" split, and its "test"
split as the held-out set when it has one).

CSV, Parquet and folders are read through the `datasets` library (imported here lazily: the
rewards package stays light). JSON Lines are read line by line with the standard library, so a
broken line is a bad row named by its line number, and a column whose values mix types (an
answer that is `42` on one line and `"3/4"` on the next) is read as written, where a columnar
reader refuses the whole file. A CSV's answer column is read as text, as written ("3.50" stays
"3.50"). Values become plain Python (numbers, strings, lists, dicts); a file that cannot be read
is one line of `DatasetError`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field

from tasks import DatasetError

JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
CSV_SUFFIXES = (".csv", ".tsv")
PARQUET_SUFFIXES = (".parquet", ".pq")
FORMATS = "JSONL, JSON, CSV, TSV, Parquet, or a folder written by datasets' save_to_disk"


@dataclass
class Table:
    """The rows of one file or split, in file order."""

    rows: list[dict]
    columns: list[str]
    numbers: list[int]
    """each row's number in the file: its line (JSONL) or its 1-based row"""
    unit: str = "row"
    """what `numbers` count: "line" or "row" """
    broken: list[tuple[int, str]] = field(default_factory=list)
    """(number, why) of the entries that are no row at all (a line that is not a JSON object)"""
    test: Table | None = None
    """a DatasetDict folder's "test" split, when it has one"""


def read_table(path: str, answer_field: str = "") -> Table:
    """The rows of the dataset at `path` (see the module docstring); `answer_field`: a CSV column
    to keep as text."""
    if os.path.isdir(path):
        return _read_folder(path)
    if not os.path.exists(path):
        raise DatasetError(f"cannot read {path}: no such file or folder")
    suffix = os.path.splitext(path)[1].lower()
    if suffix in JSON_SUFFIXES:
        return _read_json(path)
    if suffix in CSV_SUFFIXES:
        sep = "\t" if suffix == ".tsv" else ","
        converters = {answer_field: str} if answer_field else None
        return _read_with_datasets(path, "CSV", "from_csv", sep=sep, converters=converters)
    if suffix in PARQUET_SUFFIXES:
        return _read_with_datasets(path, "Parquet", "from_parquet")
    raise DatasetError(f"cannot read {path}: unknown format {suffix or '(no suffix)'!r}; "
                       f"expected {FORMATS}")


def _one_line(exc: BaseException) -> str:
    """`exc` (or what caused it: `datasets` wraps reader errors) as a short single line."""
    cause = exc.__cause__ or exc.__context__
    if type(exc).__name__ == "DatasetGenerationError" and cause is not None:
        exc = cause
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _read_json(path: str) -> Table:
    """JSON Lines, one object per line (blank lines skipped), or a JSON file holding a list."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        text = raw.decode("utf-8-sig")  # a byte-order mark (Windows editors) is dropped
    except OSError as e:
        raise DatasetError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise DatasetError(f"cannot read {path}: not UTF-8 text") from None
    if text.lstrip().startswith("["):  # a JSON array of objects
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise DatasetError(f"cannot read {path}: not a JSON list ({e.msg} at line "
                               f"{e.lineno})") from None
        pairs = list(enumerate(items, start=1))
        table = Table([], [], [], unit="row")
    else:
        pairs, table = [], Table([], [], [], unit="line")
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                pairs.append((lineno, json.loads(line)))
            except json.JSONDecodeError:
                table.broken.append((lineno, "not valid JSON"))
    seen: dict[str, None] = {}
    for number, row in pairs:
        if not isinstance(row, dict):
            table.broken.append((number, f"not a JSON object ({type(row).__name__})"))
            continue
        table.rows.append(row)
        table.numbers.append(number)
        seen.update(dict.fromkeys(row))
    table.columns = list(seen)
    return table


def _read_with_datasets(path: str, kind: str, reader: str, **kwargs) -> Table:
    """CSV or Parquet through `datasets.Dataset.from_csv` / `from_parquet`, cached in a temporary
    folder that is removed once the rows are plain Python."""
    import datasets

    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    bars_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # "Generating train split": noise for a small file
    with tempfile.TemporaryDirectory(prefix="homerl-data-") as cache:
        try:
            ds = getattr(datasets.Dataset, reader)(path, cache_dir=cache, keep_in_memory=True,
                                                   **kwargs)
            return _table(ds)
        except DatasetError:
            raise
        except Exception as e:  # the readers raise pyarrow's, pandas' and datasets' own
            raise DatasetError(f"cannot read {path} as {kind}: {_one_line(e)}") from None
        finally:
            if bars_on:
                datasets.enable_progress_bars()


def _read_folder(path: str) -> Table:
    """A `save_to_disk` folder: a Dataset, or a DatasetDict's "train" (+ "test") split."""
    import datasets

    try:
        ds = datasets.load_from_disk(path)
    except Exception as e:
        raise DatasetError(f"cannot read {path}: not a folder written by datasets' save_to_disk "
                           f"({_one_line(e)})") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise DatasetError(f"{path}: a DatasetDict with no 'train' split; it has "
                               f"{', '.join(ds) or 'none'}")
        table = _table(ds["train"])
        table.test = _table(ds["test"]) if "test" in ds else None
        return table
    return _table(ds)


def _table(ds) -> Table:
    """A `datasets.Dataset` as plain rows."""
    rows = ds.to_list()
    return Table(rows, list(ds.column_names), list(range(1, len(rows) + 1)), unit="row")
