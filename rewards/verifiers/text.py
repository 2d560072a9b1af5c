"""The text verifiers: ``exact``, ``choice`` and ``regex`` (named in registry.py).

All three read the reply the same way (`answer_text`): fenced code blocks (```` ``` ````)
are ignored; the answer is what follows the last "Answer:" tag (`rewards.parsing`, markdown
emphasis tolerated: "**Answer:** x"), to the end of its line; with no tag, the last non-empty
line. Format score: 1.0 when the reply's last non-empty line starts with the tag, 0.5 when
the tag is elsewhere, 0 without a tag.

Each verifier is pure and never raises: a reply that is not text, is empty, or is longer
than `MAX_COMPLETION_CHARS` gets the numeric verifier's error codes (`non_utf8`, `empty`,
`too_long`); an unusable reference gets ``bad_reference``; a reply with no answer,
``no_answer``. A MemoryError is left to the verifier pool, which counts it.
"""

from __future__ import annotations

import logging
import re
import unicodedata

from rewards.parsing import answer_tag_text
from rewards.result import (
    BAD_REFERENCE,
    EMPTY,
    MAX_COMPLETION_CHARS,
    NO_ANSWER,
    NON_UTF8,
    TOO_LONG,
    VERIFIER_CRASH,
    RewardResult,
    error_result,
)
from rewards.verifiers.reference import MAX_REFERENCE_CHARS

logger = logging.getLogger(__name__)

MAX_PATTERN_CHARS = 1_000
_FENCE_RE = re.compile(r"```.*?(?:```|\Z)", re.S)
_FINAL_TAG_RE = re.compile(r"(?i)^[*_]*+answer[ \t]*+[*_]*+[ \t]*+:")
_QUOTES = "\"'`*_\u201c\u201d\u2018\u2019\u00ab\u00bb"
_TRAILING = ".,;:!?"
# one option letter, optionally in brackets, not glued to a following letter or digit
_LETTER = r"\(?([A-Ea-e])\)?(?![A-Za-z0-9])"
_LEAD_RE = re.compile(r"[\s*_]*" + _LETTER)
_MORE_RE = re.compile(r"\s*(?:,|/|&|\+|\b[Aa][Nn][Dd]\b|\b[Oo][Rr]\b)\s*" + _LETTER)
_CAPITAL_RE = re.compile(r"(?<![A-Za-z0-9'])\(?([A-E])\)?(?![A-Za-z0-9'])")
_REFERENCE_LETTER_RE = re.compile(r"^\(?([A-Ea-e])\)?[.:]?$")


def checked_text(completion: object) -> tuple[str | None, str | None]:
    """(the completion as text, None) or (None, the error code saying why it is not usable):
    None or whitespace: empty; not str or UTF-8 bytes, or unencodable: non_utf8; longer than
    `MAX_COMPLETION_CHARS` characters: too_long."""
    if isinstance(completion, (bytes, bytearray)):
        if len(completion) > 4 * MAX_COMPLETION_CHARS:
            return None, TOO_LONG
        try:
            completion = bytes(completion).decode("utf-8")
        except UnicodeDecodeError:
            return None, NON_UTF8
    if completion is None:
        return None, EMPTY
    if not isinstance(completion, str):
        return None, NON_UTF8
    if len(completion) > MAX_COMPLETION_CHARS:
        return None, TOO_LONG
    try:
        completion.encode("utf-8")
    except UnicodeEncodeError:
        return None, NON_UTF8
    return (completion, None) if completion.strip() else (None, EMPTY)


def answer_text(text: str) -> tuple[str | None, float]:
    """(the reply's answer as written, format score); see the module docstring."""
    prose = _FENCE_RE.sub("\n", text)
    lines = [line.strip() for line in prose.splitlines() if line.strip()]
    last = text.strip().rsplit("\n", 1)[-1].strip()
    tagged = answer_tag_text(prose)
    if tagged is not None:
        return tagged, 1.0 if _FINAL_TAG_RE.match(last) else 0.5
    if not lines or _FINAL_TAG_RE.match(lines[-1]):  # nothing, or an empty "Answer:"
        return None, 0.0
    return lines[-1], 0.0


def normalize_text(text: str) -> str:
    """Unicode NFKC, casefolded, whitespace runs as one space, surrounding quotes, backticks
    and markdown emphasis and trailing ``.,;:!?`` stripped (repeatedly: '"Paris."')."""
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    text, previous = " ".join(text.split()), None
    while text != previous:
        previous, text = text, text.strip().strip(_QUOTES).rstrip(_TRAILING)
    return text


def _guarded(score, completion: object, answer: object) -> RewardResult:
    """Run `score`; any exception but MemoryError becomes ``verifier_crash``."""
    try:
        return score(completion, answer)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - contract: never raise; the code makes it visible
        logger.exception("%s verifier crashed", score.__name__.strip("_"))
        return error_result(VERIFIER_CRASH)


def _reply(completion: object) -> tuple[str | None, float, RewardResult | None]:
    """(answer text, format score, None) or (None, 0, the result that ends scoring)."""
    text, error = checked_text(completion)
    if error is not None:
        return None, 0.0, error_result(error)
    answer, fmt = answer_text(text)
    return answer, fmt, None if answer is not None else RewardResult(0.0, fmt, None, NO_ANSWER)


def _exact(completion: object, answer: object) -> RewardResult:
    if isinstance(answer, bool) or not isinstance(answer, (str, int)):
        return error_result(BAD_REFERENCE)
    reference = normalize_text(str(answer))
    if not reference or len(str(answer)) > MAX_REFERENCE_CHARS:
        return error_result(BAD_REFERENCE)
    said, fmt, done = _reply(completion)
    if done is not None:
        return done
    parsed = normalize_text(said)
    return RewardResult(1.0 if parsed == reference else 0.0, fmt, parsed, None)


def exact(completion: object, answer: object, style: str | None = None) -> RewardResult:
    """Right when the answer (`answer_text`) equals the reference after `normalize_text` on
    both sides ("  **Paris.**" = "paris"); the reference is text or an int. `style` is
    ignored."""
    return _guarded(_exact, completion, answer)


def chosen_letters(said: str) -> list[str]:
    """The option letters an answer chooses, upper case, without repeats, in order.

    An answer that begins with a letter ("B", "(b)", "B) Paris", "A, C", "A or B") chooses
    it and any letters joined to it by ``,`` ``/`` ``&`` ``+`` "and" "or"; the rest of the
    line is the option's text. Otherwise every standalone capital A-E ("the answer is (C)").
    """
    letters, lead = [], _LEAD_RE.match(said)
    if lead is not None:
        letters.append(lead.group(1))
        position = lead.end()
        while (more := _MORE_RE.match(said, position)) is not None:
            letters.append(more.group(1))
            position = more.end()
    else:
        letters = _CAPITAL_RE.findall(said)
    return list(dict.fromkeys(letter.upper() for letter in letters))


def _choice(completion: object, answer: object) -> RewardResult:
    match = _REFERENCE_LETTER_RE.match(answer.strip()) if isinstance(answer, str) else None
    if match is None:
        return error_result(BAD_REFERENCE)
    said, fmt, done = _reply(completion)
    if done is not None:
        return done
    letters = chosen_letters(said)
    if not letters:
        return RewardResult(0.0, fmt, None, NO_ANSWER)
    right = letters == [match.group(1).upper()]
    return RewardResult(1.0 if right else 0.0, fmt, ",".join(letters), None)


def choice(completion: object, answer: object, style: str | None = None) -> RewardResult:
    """Right when the answer chooses exactly one option letter (`chosen_letters`) and it is
    the reference's: a letter A-E, any case, optionally as "(B)", "B)", "B." or "B:". Two
    different letters ("A or B") are wrong. `style` is ignored."""
    return _guarded(_choice, completion, answer)


def _regex(completion: object, answer: object) -> RewardResult:
    if not isinstance(answer, str) or not answer or len(answer) > MAX_PATTERN_CHARS:
        return error_result(BAD_REFERENCE)
    try:
        pattern = re.compile(answer)
    except (re.error, RecursionError, OverflowError, ValueError):
        return error_result(BAD_REFERENCE)
    said, fmt, done = _reply(completion)
    if done is not None:
        return done
    said = said.strip().strip("*").strip()
    right = any(pattern.fullmatch(s) for s in dict.fromkeys((said, said.removesuffix("."))))
    return RewardResult(1.0 if right else 0.0, fmt, said, None)


def regex(completion: object, answer: object, style: str | None = None) -> RewardResult:
    """Right when the answer, without surrounding whitespace and markdown ``*``, fullmatches
    the reference, a Python regular expression (at most `MAX_PATTERN_CHARS`; one that does
    not compile is ``bad_reference``), as written or without one trailing period. Patterns
    are not vetted for backtracking: the verifier pool's per-item time limit stops one that
    runs away (``timeout``). `style` is ignored."""
    return _guarded(_regex, completion, answer)
