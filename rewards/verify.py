"""Command line scorer: ``python -m rewards.verify FILE.jsonl [--verifier NAME] [--preset NAME]
[--timeout 2.0]``.

Each input line is ``{"completion": str, "answer": str}``, optionally with the ``"question"``
it answers ("-" reads stdin). ``--verifier`` picks the built-in verifier that scores them
(`rewards.verifiers.registry`: numeric, the default, exact, choice, regex, python-tests), so a
dataset's references and sample replies can be checked before training. Prints one JSON line
per input line, in order::

    {"line": 3, "score": 1.0, "format_score": 1.0, "parsed": "72", "error": null,
     "working_valid": true, "reward": 1.5}

``working_valid`` and ``reward`` come with ``numeric`` only: ``reward`` is what a run of the
preset (default ``cpu-demo``) pays the completion on a numeric task: correct + format_weight x
the format bonus, the bonus after valid working only where the preset asks for it
(`rewards.shaping`, `rewards.working`: with the question, working copied from it is
recognised), for right answers only where it asks for that (``reward.format_if_correct``; a
``reward.format_gate_steps`` gate is taken as passed). ``python-tests`` runs each reply's code
against the answer's tests, isolated, exactly as in training (where the code cannot be
isolated each line gets ``no_sandbox``); its per-item limit is its own where longer.

A malformed input line yields ``"error": "bad_input_line"`` with a "detail" and
scoring continues. An unreadable file or an unknown verifier prints one line on stderr and
exits 2.
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import numpy as np

from common.presets import PRESETS, get_preset
from rewards.sandbox.pool import VerifierPool
from rewards.shaping import combine, format_bonus
from rewards.verifiers.registry import VERIFIERS
from rewards.working import working_valid

BAD_INPUT_LINE = "bad_input_line"
CHUNK_SIZE = 64  # lines scored per pool call: amortises IPC, keeps output streaming

Item = tuple[str, str, str | None]  # completion, answer, question
Parsed = tuple[int, Item | None, str | None]  # line, item, detail


def _parse_line(text: str) -> tuple[Item | None, str | None]:
    """Return ``((completion, answer, question), None)`` or ``(None, why_it_is_bad)``."""
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
    question = record.get("question")
    if question is not None and not isinstance(question, str):
        return None, "'question' not a string"
    return (completion, answer, question), None


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


def paid(results: list, good: list[Item], reward_cfg, format_weight: float) -> list[float]:
    """(N,) the reward a run with `reward_cfg` pays each scored item (`rewards.shaping`)."""
    fmt = np.array([r.format_score for r in results], dtype=np.float32)          # (N,)
    bonus = format_bonus(fmt, [c for c, _, _ in good], reward_cfg.format_needs_working,
                         reward_cfg.other_tag_bonus, questions=[q for _, _, q in good])
    correct = np.array([r.score for r in results], dtype=np.float32)             # (N,)
    return combine(correct, bonus, format_weight, reward_cfg.format_if_correct).tolist()


def _score_chunk(pool: VerifierPool, chunk: list[Parsed], timeout_s: float, cfg,
                 verifier: str = "numeric") -> None:
    """Score the good lines of `chunk` with `verifier` and print every line's outcome in
    order (numeric: with the working check and the preset's reward)."""
    good = [item for _, item, _ in chunk if item is not None]
    scored = pool.score([c for c, _, _ in good], [a for _, a, _ in good], timeout_s=timeout_s,
                        verifiers=[verifier] * len(good))
    numeric = verifier == "numeric"
    rewards = iter(paid(scored, good, cfg.reward, cfg.rollout.format_weight)
                   if good and numeric else [])
    results, items = iter(scored), iter(good)
    for lineno, item, detail in chunk:
        if item is None:
            out = {
                "line": lineno,
                "score": 0.0,
                "format_score": 0.0,
                "parsed": None,
                "error": BAD_INPUT_LINE,
                "detail": detail,
                "reward": 0.0,
            }
        else:
            result, (completion, _, question) = next(results), next(items)
            out = {
                "line": lineno,
                "score": result.score,
                "format_score": result.format_score,
                "parsed": result.parsed,
                "error": result.error,
            }
            if numeric:
                out["working_valid"] = working_valid(completion, question)
                out["reward"] = round(next(rewards), 6)
        print(json.dumps(out))
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (0 ok, 2 unreadable input)."""
    parser = argparse.ArgumentParser(prog="python -m rewards.verify", description=__doc__)
    parser.add_argument("file", help="JSONL file of {completion, answer}; '-' for stdin")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per item")
    parser.add_argument("--preset", default="cpu-demo", choices=sorted(PRESETS),
                        help="whose reward settings the `reward` field applies")
    parser.add_argument("--verifier", default="numeric",
                        help=f"the built-in verifier that scores the lines: {', '.join(VERIFIERS)}")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    if args.verifier not in VERIFIERS:
        print(f"rewards.verify: --verifier: {args.verifier!r} is not a verifier; allowed: "
              f"{', '.join(VERIFIERS)}", file=sys.stderr)
        return 2
    cfg = get_preset(args.preset)
    try:
        stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    except OSError as exc:
        print(f"rewards.verify: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    with stream, VerifierPool() as pool:
        for chunk in _chunks(_records(stream), CHUNK_SIZE):
            _score_chunk(pool, chunk, args.timeout, cfg, args.verifier)
    return 0


if __name__ == "__main__":
    sys.exit(main())
