"""Scoring a completion against a reference answer.

`verify` is the single entry point used for rewards. It is pure (no processes,
no signals) and never raises: every failure becomes a `RewardResult` with an
explicit error code from `ERROR_CODES`. Hard wall-clock limits are the job of
`rewards.sandbox`, which runs this function in a worker process; here we only
refuse inputs that are known to make sympy/math-verify explode.
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction

from rewards.parsing import (
    MAX_NUMBER_DIGITS,
    answer_tag_text,
    extract_answer,
    has_tagged_answer,
    normalize_answer,
    number_from_words,
    to_fraction,
)
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
from rewards.styles import DEFAULT_STYLE, STYLES, get_style

logger = logging.getLogger(__name__)

MAX_REFERENCE_CHARS = 1_000
REL_TOL = Fraction(1, 10**6)
# Symbolic checking only sees short expressions with small, flat exponents:
# sympy evaluates 9^{9^{9}} or 10^{10^{6}} eagerly and never comes back.
MAX_SYMBOLIC_CHARS = 200
MAX_POWERS = 3

# The format our prompts ask for by default: the last non-empty line is exactly
# "Answer: <number>" (case-insensitive), where <number> may carry a leading "$",
# a sign, thousands commas, decimals, an a/b fraction, a trailing "%" or ".".
# Anything else ("**Answer:** 42", "Answer: 42 apples") earns only partial credit.
# Other answer lines a prompt can ask for: rewards.styles.
ANSWER_FORMAT = STYLES[DEFAULT_STYLE].final_line

_DIGIT_RUN_RE = re.compile(r"\d+")
_POWER_RE = re.compile(r"\^|\*\*")
# An exponent must be a short literal or one letter, optionally braced ...
_SAFE_EXPONENT_RE = re.compile(r"\s*(?:-?\d{1,3}|[A-Za-z]|\{\s*-?(?:\d{1,3}|[A-Za-z])\s*\})")
# ... and must not itself be raised to a power (towers like 9**9**9).
_CHAINED_POWER_RE = re.compile(r"\s*(?:\^|\*\*)")
_PROSE_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_HEAVY_RE = re.compile(r"\\(?:sum|prod|int|lim|binom|choose)|!")
# An operator between two operands ("6+9", "2^4-1", "3\\times5"): a sum still to be worked
# out, not a number. Against a numeric reference it is a wrong answer, or a policy learns to
# restate the question ("Answer: 6 + 9") and collect the reward without doing the arithmetic.
_UNEVALUATED_RE = re.compile(r"[\d.)}]\s*(?:[-+*/^\u00d7\u00f7]|\\cdot|\\times|\\div)\s*[-\d.({\\]")


OTHER_TAG_SCORE = 0.25
"""format score of a completion whose only tagged answer is in another style than asked"""


def format_score(text: str, style: str | None = None) -> float:
    """Score how well `text` follows the requested answer format.

    1.0: the last non-empty line is in the answer style asked for (`rewards.styles`; by
    default `ANSWER_FORMAT`, "Answer: <number>").
    0.5: the asked style's tag is present elsewhere (an answer line followed by more text).
    0.25: only another explicit tagged answer (``####``, ``\\boxed{}``, ``Answer:``, or
    another style's tag).
    0.0: no tagged answer at all.
    A `one_line` style (`short`): 1.0 for a reply that is one such line, else 0.0.
    """
    stripped, asked = text.strip(), get_style(style)
    if asked.one_line:  # the whole reply is the line; a tag or working makes it not one
        return 1.0 if asked.final_line.match(stripped) else 0.0
    last_line = stripped.rsplit("\n", 1)[-1].strip()
    if asked.final_line.match(last_line):
        return 1.0
    if asked.tag.search(stripped):
        return 0.5
    other = has_tagged_answer(stripped) or any(
        s.tag.search(stripped) for s in STYLES.values() if s is not asked and not s.one_line)
    return OTHER_TAG_SCORE if other else 0.0


def _symbolic_safe(expr: str) -> bool:
    """True when `expr` is small and flat enough to hand to sympy without risk."""
    if len(expr) > MAX_SYMBOLIC_CHARS or _HEAVY_RE.search(expr):
        return False
    if any(len(run) > MAX_NUMBER_DIGITS for run in _DIGIT_RUN_RE.findall(expr)):
        return False
    powers = list(_POWER_RE.finditer(expr))
    if len(powers) > MAX_POWERS:
        return False
    for power in powers:
        exponent = _SAFE_EXPONENT_RE.match(expr, power.end())
        if exponent is None or _CHAINED_POWER_RE.match(expr, exponent.end()):
            return False
    return True


def _symbolic_equal(pred: str, ref: str) -> bool:
    """Compare with math-verify; only called on `_symbolic_safe` inputs."""
    # Imported lazily: sympy costs ~0.5 s to import and plain numbers never need it.
    from math_verify import parse
    from math_verify import verify as mv_verify

    # Timeouts off: math-verify's own limit uses signal.alarm, which fails off the
    # main thread. The wall-clock limit comes from rewards.sandbox instead.
    gold = parse(f"\\boxed{{{ref}}}", parsing_timeout=None)
    target = parse(f"\\boxed{{{pred}}}", parsing_timeout=None)
    if not gold or not target:
        return False
    return bool(mv_verify(gold, target, timeout_seconds=None))


def is_equivalent(pred: str | None, ref: str | None) -> bool:
    """True when answer `pred` equals reference `ref`.

    Plain numbers and integer fractions are compared numerically: integers
    exactly, anything else within relative tolerance `REL_TOL` (so "1/3" matches
    "0.3333333"). Against a numeric reference, an unevaluated expression ("6 + 9" for 15)
    is wrong: the answer must be a number, though it may be written in LaTeX
    ("\\frac{1}{2}"). Only when either side is not a plain number is math-verify asked,
    and only for inputs that pass the `_symbolic_safe` guard.
    """
    pred_norm, ref_norm = normalize_answer(pred), normalize_answer(ref)
    if pred_norm is None or ref_norm is None:
        return False
    pred_val, ref_val = to_fraction(pred_norm), to_fraction(ref_norm)
    if pred_val is not None and ref_val is not None:
        if pred_val.denominator == 1 and ref_val.denominator == 1:
            # Integers compare exactly: 1000000 vs 1000001 is a wrong answer.
            return pred_val == ref_val
        return abs(pred_val - ref_val) <= REL_TOL * max(abs(pred_val), abs(ref_val))
    if pred_norm == ref_norm:
        return True
    if ref_val is not None and _UNEVALUATED_RE.search(pred_norm):
        return False
    if not (_symbolic_safe(pred_norm) and _symbolic_safe(ref_norm)):
        return False
    return _symbolic_equal(pred_norm, ref_norm)


def parse_reference(answer: object) -> str | None:
    """Normalised reference from a GSM8K solution ("...#### 72") or a plain answer.

    Returns None when the reference is unusable: not text, empty, too long, or
    neither a plain number nor a short, word-free expression safe for symbolic checking.
    """
    if isinstance(answer, bool) or not isinstance(answer, (str, int)):
        return None
    text = str(answer)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    text = text.strip()
    if not text or len(text) > MAX_REFERENCE_CHARS:
        return None
    ref = normalize_answer(text)
    if ref is None or to_fraction(ref) is not None:
        return ref
    # A symbolic reference must be maths, not prose: "\\frac{1}{\\sqrt{2}}" or "x+1",
    # but not "unknown" (an English word: two letters not part of a LaTeX command).
    if _PROSE_RE.search(ref) or not _symbolic_safe(ref):
        return None
    return ref


def _as_text(completion: object) -> tuple[str | None, str | None]:
    """Turn a completion into str, or return the error code explaining why not."""
    if completion is None:
        return None, EMPTY
    if isinstance(completion, (bytes, bytearray)):
        # UTF-8 needs at most 4 bytes a char: longer input is too long for sure.
        if len(completion) > 4 * MAX_COMPLETION_CHARS:
            return None, TOO_LONG
        try:
            return bytes(completion).decode("utf-8"), None
        except UnicodeDecodeError:
            return None, NON_UTF8
    if not isinstance(completion, str):
        return None, NON_UTF8
    return completion, None


def _verify(completion: object, answer: object, style: str | None = None) -> RewardResult:
    """`verify` without the last-resort crash guard."""
    reference = parse_reference(answer)
    if reference is None:
        return error_result(BAD_REFERENCE)
    text, error = _as_text(completion)
    if error is not None:
        return error_result(error)
    if len(text) > MAX_COMPLETION_CHARS:
        return error_result(TOO_LONG)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates, e.g. from surrogateescape decoding
        return error_result(NON_UTF8)
    if not text.strip():
        return error_result(EMPTY)
    fmt = format_score(text, style)
    raw, _rule = extract_answer(text)
    asked = get_style(style)
    if asked.in_words:
        # the number in words is the answer ("Answer: seven (7)" too: read from the last tag,
        # before the prose salvage keeps the digits); one in digits is parsed but wrong
        raw = answer_tag_text(text) or raw
        value = number_from_words(raw)
        parsed = str(value) if value is not None else normalize_answer(raw)
        right = value is not None and is_equivalent(parsed, reference)
        lenient = None
    else:
        loose = normalize_answer(raw)
        lenient = float(loose is not None and is_equivalent(loose, reference))
        own = asked.read(text) if asked.read else None  # the asked line, not a stray ####
        parsed = loose if own is None else normalize_answer(own)
        right = parsed is not None and is_equivalent(parsed, reference)
    score = 1.0 if parsed is not None and right else 0.0
    lenient = None if lenient == score else lenient  # set only where the two readings differ
    if parsed is None:
        return RewardResult(0.0, fmt, None, NO_ANSWER, lenient)
    return RewardResult(score, fmt, parsed, None, lenient)


def verify(completion: str | bytes, answer: str, style: str | None = None) -> RewardResult:
    """Score `completion` against reference `answer`; never raises.

    `answer` is a GSM8K solution ending in ``#### N`` or a plain answer string; `style` the
    answer line the prompt asked for (`rewards.styles`, None: "Answer: N").
    Any unexpected exception is logged and reported as ``verifier_crash`` so a
    bug shows up in the error counts instead of silently as a zero reward; a MemoryError is
    left to the verifier pool (`rewards.sandbox`), which counts it as ``out_of_memory``.
    """
    try:
        return _verify(completion, answer, style)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - contract: never raise; the code makes it visible
        logger.exception("verify crashed on completion of type %s", type(completion).__name__)
        return error_result(VERIFIER_CRASH)
