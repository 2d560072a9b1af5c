"""Answer extraction and normalisation for model completions.

Everything here is pure string work on bounded inputs: no ``eval``, no sympy, and
every number is length-capped before it is turned into a ``Fraction``, so a
pathological completion costs at most a few regex passes over its text.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
NUMBER_WORDS = (*_ONES, *_TENS[2:], "hundred")
"""every word `words` writes"""


def words(n: int) -> str:
    """0 <= n <= 999 in English words: 342 -> 'three hundred forty-two'."""
    if not 0 <= n <= 999:
        raise ValueError(f"words: {n} is outside 0..999")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    rest = n % 100
    return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + words(rest))


# Longest digit run we turn into an exact number. Longer runs are never valid
# answers for our tasks and would make Fraction/int conversion slow.
MAX_NUMBER_DIGITS = 100

# Which rule `extract_answer` used; "none" means nothing answer-like was found.
EXTRACTION_RULES = ("hash", "boxed", "answer_tag", "last_number", "none")

_HASH_RE = re.compile(r"####[ \t]*+([^\n]*\S)")
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# "Answer: 42", "Final answer: 42", "**Answer:** 42"; markdown emphasis is tolerated.
_ANSWER_TAG_RE = re.compile(r"(?i)\banswer[ \t]*+[*_]*+[ \t]*+:[ \t]*+[*_]*+[ \t]*+([^\n]*\S)")
# A number not glued to a preceding word (so "x-5" does not yield "-5").
_NUMBER_RE = re.compile(r"(?:(?<![\w)])[-\u2212])?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_WORD_RE = re.compile(r"[A-Za-z]{2,}")

_MINUS_CHARS = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2012": "-", "\u00a0": " "})
_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_LATEX_NOISE_RE = re.compile(
    r"\\left|\\right|\\displaystyle|\\[!,;: ]|\^\s*\{?\s*\\circ\s*\}?|\\?[$%]"
)
_SIMPLE_FRAC_RE = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(\d+)\}$")
_NUMBER_COMMA_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_ASSIGNMENT_RE = re.compile(r"^[A-Za-z]\s*=\s*(?=\S)")
_UNITS_RE = re.compile(r"^(-?[\d.]+(?:/\d+)?)\s+[A-Za-z]{2,}(?:\s+[A-Za-z]+)*\.?$")
_DECIMAL_RE = re.compile(r"^[+-]?(\d*)(?:\.(\d*))?$")
_COMMAND_SPACE_RE = re.compile(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])")
_BRACED_RE = re.compile(r"^\{([^{}]*)\}$")
_FRACTION_RE = re.compile(r"^[+-]?(\d+)/(\d+)$")


def _find_boxed(text: str) -> str | None:
    """Return the content of the last non-empty ``\\boxed{...}``, honouring nested braces.

    One linear pass with a brace stack, so thousands of unbalanced boxes in a
    long completion stay cheap. Unbalanced or empty boxes do not count.
    """
    box_openers = {m.end() - 1 for m in _BOXED_RE.finditer(text)}
    if not box_openers:
        return None
    stack: list[int] = []
    best: tuple[int, int] | None = None
    for pos, char in enumerate(text):
        if char == "{":
            stack.append(pos)
        elif char == "}" and stack:
            opener = stack.pop()
            is_later = best is None or opener > best[0]
            if opener in box_openers and is_later and text[opener + 1 : pos].strip():
                best = (opener, pos)
    return text[best[0] + 1 : best[1]].strip() if best else None


def _last_match(pattern: re.Pattern[str], text: str) -> str | None:
    """Return group 1 of the last match of `pattern`, or None."""
    last = None
    for match in pattern.finditer(text):
        last = match
    return last.group(1).strip() if last else None


def _salvage_prose(answer: str) -> str:
    """Reduce "The total is 18 apples." to "18"; leave maths like "x+1" untouched.

    Small models often write a sentence after the tag. Only plain prose (words,
    no LaTeX) is reduced, so symbolic answers still reach the symbolic checker.
    """
    if "\\" in answer or not _WORD_RE.search(answer):
        return answer
    numbers = _NUMBER_RE.findall(answer)
    return numbers[-1] if numbers else answer


def extract_answer(text: str) -> tuple[str | None, str]:
    """Find the final answer in a completion.

    Returns ``(raw_answer, rule)`` where rule is one of ``EXTRACTION_RULES``.
    Priority: ``#### N`` > last ``\\boxed{...}`` > last ``Answer: N`` > last number.
    """
    hashed = _last_match(_HASH_RE, text)
    if hashed is not None:
        return _salvage_prose(hashed), "hash"
    boxed = _find_boxed(text)
    if boxed is not None:
        return boxed, "boxed"
    tagged = _last_match(_ANSWER_TAG_RE, text)
    if tagged is not None:
        return _salvage_prose(tagged), "answer_tag"
    numbers = _NUMBER_RE.findall(text)
    if numbers:
        return numbers[-1], "last_number"
    return None, "none"


# "seven", "twenty one", "three hundred forty two" (hyphens as spaces, no "and") -> the number
_NUMBER_OF_WORDS = {words(n).replace("-", " "): n for n in range(1000)}
_LETTERS_RE = re.compile(r"[a-z]+")


def number_from_words(text: str | None) -> int | None:
    """The number 0..999 that `text` starts with, written in English words ("Seven.",
    "twenty-one apples", "One hundred and five"), as `words` spells it with
    spaces or hyphens and an optional "and"; the longest such run counts. None when `text` does
    not start with a number word ("7", "the sum is seven")."""
    if not text:
        return None
    tokens = [t for t in _LETTERS_RE.findall(text[:200].lower()) if t != "and"][:4]
    if not tokens or not text.lower().lstrip(" \t*_").startswith(tokens[0]):
        return None  # "7 seven": the first word is not where the text starts
    for k in range(len(tokens), 0, -1):  # at most "nine hundred ninety nine": 4 words
        value = _NUMBER_OF_WORDS.get(" ".join(tokens[:k]))
        if value is not None:
            return value
    return None


_RESULT_TAG_RE = re.compile(r"(?i)\bresult[ \t]*+[*_]*+[ \t]*+:[ \t]*+[*_]*+[ \t]*+([^\n]*\S)")


def on_answer_tag(text: str) -> str | None:
    """The answer on the last "Answer:" line, read as `extract_answer` reads that tag."""
    tagged = _last_match(_ANSWER_TAG_RE, text)
    return None if tagged is None else _salvage_prose(tagged)


def on_hash_tag(text: str) -> str | None:
    """The answer on the last "####" line."""
    hashed = _last_match(_HASH_RE, text)
    return None if hashed is None else _salvage_prose(hashed)


def on_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}."""
    return _find_boxed(text)


def on_result_tag(text: str) -> str | None:
    """The answer on the last "Result:" line."""
    tagged = _last_match(_RESULT_TAG_RE, text)
    return None if tagged is None else _salvage_prose(tagged)


def answer_tag_text(text: str) -> str | None:
    """What follows the last "Answer:" tag, to the end of its line, as written (no salvage)."""
    return _last_match(_ANSWER_TAG_RE, text)


def has_tagged_answer(text: str) -> bool:
    """True when the text contains an explicit answer marker (####, boxed, Answer:)."""
    return bool(
        _HASH_RE.search(text) or _find_boxed(text) is not None or _ANSWER_TAG_RE.search(text)
    )


def _canonical_decimal(s: str) -> str | None:
    """Canonicalise "007.50" -> "7.5", "-0.0" -> "0"; None if not a capped decimal."""
    match = _DECIMAL_RE.match(s)
    if not match or not (match.group(1) or match.group(2)):
        return None
    int_part = match.group(1).lstrip("0") or "0"
    frac_part = (match.group(2) or "").rstrip("0")
    if len(int_part) + len(frac_part) > MAX_NUMBER_DIGITS:
        return None
    body = f"{int_part}.{frac_part}" if frac_part else int_part
    negative = s.startswith("-") and body.strip("0.") != ""
    return f"-{body}" if negative else body


# possessive: "\d+\.?\d*" would try every split of a long digit run (quadratic)
_SCIENTIFIC_RE = re.compile(r"-?(?:\d++(?:\.\d*+)?+|\.\d++)[eE]([-+]?\d{1,4})")


def _expand_exponent(s: str) -> str:
    """Write "1e16" / "1.5E-3" / "1e+16" (how JSON floats print) in plain digits, so a
    reference of 0.00001 or 10^16 stays a number; unchanged when it is no such number or its
    exponent passes `MAX_NUMBER_DIGITS` (the digit cap then refuses it as a number)."""
    match = _SCIENTIFIC_RE.fullmatch(s)
    if not match or abs(int(match.group(1))) > MAX_NUMBER_DIGITS:
        return s
    return format(Decimal(s), "f")


def _canonical_fraction(s: str) -> str | None:
    """Reduce "2/4" -> "1/2", "4/2" -> "2"; None if not a capped, valid fraction."""
    match = _FRACTION_RE.match(s)
    if not match or len(match.group(1)) + len(match.group(2)) > MAX_NUMBER_DIGITS:
        return None
    if int(match.group(2)) == 0:
        return None
    value = Fraction(int(match.group(1)), int(match.group(2)))
    if s.startswith("-"):
        value = -value
    return str(value)


def _strip_latex(s: str) -> str:
    """Remove LaTeX decoration that never changes a numeric value."""
    s = _TEXT_WRAPPER_RE.sub(r"\1", s)
    s = _LATEX_NOISE_RE.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return s.strip()


def _drop_whitespace(s: str) -> str:
    """Remove whitespace, except one space that ends a LaTeX command before a letter.

    "\\in A" must not become "\\inA", which would be a different command.
    """
    s = _COMMAND_SPACE_RE.sub("\\1\x00", s.replace("\x00", ""))
    return re.sub(r"\s+", "", s).replace("\x00", " ")


def normalize_answer(s: str | None) -> str | None:
    """Normalise an extracted answer to a canonical comparable string.

    Strips ``$``, ``%``, markdown ``**``, LaTeX spacing/text wrappers, thousands commas, unit words
    ("18 apples"), a leading "x =", trailing dots and trailing zeros ("72.00" -> "72"),
    maps unicode minus to "-", and reduces integer fractions ("2/4", ``\\frac{2}{4}``)
    to lowest terms ("1/2"). Non-numeric answers are returned without whitespace.
    Returns None when nothing is left.
    """
    if s is None:
        return None
    # Markdown emphasis ("**42**") wraps answers but is never part of them.
    s = _strip_latex(s.translate(_MINUS_CHARS)).strip("*_ \t")
    s = _ASSIGNMENT_RE.sub("", s)
    s = _NUMBER_COMMA_RE.sub("", s)
    units = _UNITS_RE.match(s)
    if units:
        s = units.group(1)
    s = _drop_whitespace(s).rstrip(".")
    s = _BRACED_RE.sub(r"\1", s)  # "{5}" -> "5"
    frac = _SIMPLE_FRAC_RE.match(s)
    if frac:
        sign = "-" if (frac.group(1) == "-") != frac.group(2).startswith("-") else ""
        s = f"{sign}{frac.group(2).lstrip('-')}/{frac.group(3)}"
    s = s[1:] if s.startswith("+") else s
    if not s:
        return None
    s = _expand_exponent(s)
    return _canonical_decimal(s) or _canonical_fraction(s) or s


def to_fraction(s: str | None) -> Fraction | None:
    """Exact value of a normalised plain number or integer fraction, else None.

    Never evaluates expressions; digit counts are capped by `MAX_NUMBER_DIGITS`.
    """
    if not s:
        return None
    decimal = _canonical_decimal(s)
    if decimal is not None:
        return Fraction(decimal)
    fraction = _canonical_fraction(s)
    if fraction is not None:
        return Fraction(fraction)
    return None
