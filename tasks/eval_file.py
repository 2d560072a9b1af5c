"""A user's own evaluation file: JSONL with a `question` and an `answer` on every line.

The answer is a number (`42`, `"3.5"`, `-7`) or GSM8K's worked form ending in `#### N`. Every
line is scored; the first malformed one is a one-line `DatasetError` naming the file, the line
number and the field, so nothing is silently skipped. Blank lines are ignored.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path

from rewards.verifiers.reference import parse_reference
from tasks import DatasetError


def _bad(path, lineno: int, field: str, why: str) -> DatasetError:
    return DatasetError(f"{path}:{lineno}: field '{field}': {why}")


def read_eval_file(path: str | Path) -> list[dict]:
    """Samples {'id', 'question', 'answer', 'task', 'level'} of every line of `path`."""
    samples = []
    try:
        handle = open(path, "rb")
    except OSError as e:
        raise DatasetError(f"cannot read {path}: {e.strerror or e}") from None
    with handle:
        for lineno, raw in enumerate(handle, start=1):
            if lineno == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)  # Windows editors start files with one
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise DatasetError(f"{path}:{lineno}: not a JSON object "
                                   f"({type(e).__name__})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{lineno}: not a JSON object "
                                   f"({type(row).__name__})")
            question = row.get("question")
            if not isinstance(question, str) or not question.strip():
                raise _bad(path, lineno, "question", "must be a non-empty string")
            answer = row.get("answer")
            if isinstance(answer, (int, float)) and not isinstance(answer, bool):
                answer = repr(answer) if isinstance(answer, float) else str(answer)
            ref = parse_reference(answer) if "answer" in row else None
            if ref is None:
                raise _bad(path, lineno, "answer", "must be a number or GSM8K's '#### N' form; "
                           f"got {str(row.get('answer'))[:40]!r}")
            samples.append({"id": f"{Path(path).stem}-{lineno}", "question": question.strip(),
                            "answer": ref, "task": "file", "level": 0})
    if not samples:
        raise DatasetError(f"{path}: no lines to evaluate")
    return samples
