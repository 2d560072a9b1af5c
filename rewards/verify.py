"""Command line scorer: ``python -m rewards.verify FILE.jsonl [--timeout 2.0]``.

Each input line is ``{"completion": str, "answer": str}`` ("-" reads stdin).
Prints one JSON line per input line, in order::

    {"line": 3, "score": 1.0, "format_score": 1.0, "parsed": "72", "error": null}

A malformed input line yields ``"error": "bad_input_line"`` with a "detail" and
scoring continues. An unreadable file prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from rewards.sandbox import VerifierPool

BAD_INPUT_LINE = "bad_input_line"
CHUNK_SIZE = 64  # lines scored per pool call: amortises IPC, keeps output streaming

Parsed = tuple[int, tuple[str, str] | None, str | None]  # line, (completion, answer), detail


def _parse_line(text: str) -> tuple[tuple[str, str] | None, str | None]:
    """Return ``((completion, answer), None)`` or ``(None, why_it_is_bad)``."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON: {exc.msg}"
    if not isinstance(record, dict):
        return None, "not a JSON object"
    completion, answer = record.get("completion"), record.get("answer")
    if not isinstance(completion, str):
        return None, "'completion' missing or not a string"
    if isinstance(answer, int) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str):
        return None, "'answer' missing or not a string"
    return (completion, answer), None


def _records(stream: BinaryIO) -> Iterator[Parsed]:
    """Parse non-blank lines; bytes that are not UTF-8 reach `verify` as such."""
    for lineno, raw in enumerate(stream, start=1):
        if lineno == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)  # Windows editors start files with one
        # surrogateescape keeps bad bytes visible, so verify reports "non_utf8".
        text = raw.decode("utf-8", errors="surrogateescape")
        if text.strip():
            item, detail = _parse_line(text)
            yield lineno, item, detail


def _chunks(records: Iterable[Parsed], size: int) -> Iterator[list[Parsed]]:
    """Group `records` into lists of at most `size`."""
    chunk: list[Parsed] = []
    for record in records:
        chunk.append(record)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _score_chunk(pool: VerifierPool, chunk: list[Parsed], timeout_s: float) -> None:
    """Score the good lines of `chunk` and print every line's outcome in order."""
    good = [item for _, item, _ in chunk if item is not None]
    results = iter(pool.score([c for c, _ in good], [a for _, a in good], timeout_s=timeout_s))
    for lineno, item, detail in chunk:
        if item is None:
            out = {
                "line": lineno,
                "score": 0.0,
                "format_score": 0.0,
                "parsed": None,
                "error": BAD_INPUT_LINE,
                "detail": detail,
            }
        else:
            result = next(results)
            out = {
                "line": lineno,
                "score": result.score,
                "format_score": result.format_score,
                "parsed": result.parsed,
                "error": result.error,
            }
        print(json.dumps(out))
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (0 ok, 2 unreadable input)."""
    parser = argparse.ArgumentParser(prog="python -m rewards.verify", description=__doc__)
    parser.add_argument("file", help="JSONL file of {completion, answer}; '-' for stdin")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per item")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    try:
        stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    except OSError as exc:
        print(f"rewards.verify: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    with stream, VerifierPool() as pool:
        for chunk in _chunks(_records(stream), CHUNK_SIZE):
            _score_chunk(pool, chunk, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
