"""Answer styles: the final line a prompt asks for, and the check that pays the format bonus.

A sample may carry `"style"` (default "answer"); its prompt ends with the style's instruction
and its format score (and so strict accuracy) is 1.0 only for a last line in that style, 0.5 for
that style's tag elsewhere, 0.25 for another style's tag: a policy that has not yet learnt to
stop after the answer line is still paid more for the tag it was asked for.
Correctness does not depend on the style, but for `in_words` styles: the answer is extracted by
any rule (`rewards.parsing`), so a right number in another style is right but not strict. A
style `in_words` wants the number in English words ("Answer: seven"): there digits are wrong,
as words are wrong for every other style (the parser reads no words as numbers).

Styles exist for curricula whose stages ask for different answer lines: a policy trained on
one style drifts to it on every prompt, which is forgetting a test can measure.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rewards.parsing import NUMBER_WORDS, on_answer_tag, on_boxed, on_hash_tag, on_result_tag

# A number as the answer line may carry it: "$", a sign, thousands commas, decimals, an a/b
# fraction, a trailing "%".
_NUMBER = r"\$?[-\u2212]?\d[\d,]*(?:\.\d+)?(?:/\d+)?[ \t]*%?"
# 0..999 in words: "seven", "twenty-one", "one hundred and five"
_WORD = "(?:" + "|".join(sorted(NUMBER_WORDS, key=len, reverse=True)) + ")"
_IN_WORDS = rf"{_WORD}(?:(?:[ \t]+|-)(?:and[ \t]+)?{_WORD})*"
# "Answer:" as a tag, markdown emphasis tolerated ("**Answer:** 7")
_ANSWER_TAG = r"(?i)\banswer[ \t]*+[*_]*+[ \t]*+:[ \t]*+[*_]*+[ \t]*+"

# one line of at most SHORT_CHARS characters with a number in it and no answer tag of any
# style ("7", "3 + 4 = 7", "The sum is 7."); applied to the whole stripped reply
SHORT_CHARS = 40
_SHORT = re.compile(r"(?i)^(?=[^\n]*\d)(?![^\n]*\b(?:answer|result)[ \t]*+[*_]*+[ \t]*+:)"
                    r"(?![^\n]*####)(?![^\n]*\\(?:boxed|fbox))[^\n]{1," + str(SHORT_CHARS) + "}$")


@dataclass(frozen=True)
class AnswerStyle:
    name: str
    instruction: str
    """appended to the question in the prompt"""
    final_line: re.Pattern
    """the last non-empty line of a completion in this style"""
    tag: re.Pattern
    """this style's answer tag anywhere in a completion"""
    in_words: bool = False
    """the answer is the number in English words, 0..999 (`rewards.parsing.number_from_words`)"""
    read: Callable[[str], str | None] | None = None
    """the answer on this style's last tag (None: the style has no tag): what the training
    reward and strict accuracy read (`rewards.verifiers`), whatever other tags the text holds"""
    one_line: bool = False
    """the whole reply is the answer line, no working wanted: format 1.0 only for a reply of
    one line that `final_line` matches, else 0; no working is asked of it for the bonus
    (`rewards.shaping.format_bonus`), and its pattern is no other style's tag"""


STYLES = {
    "answer": AnswerStyle(
        "answer",
        "Solve the problem. End your reply with a final line of the form 'Answer: <number>'.",
        re.compile(rf"(?i)^answer:[ \t]*{_NUMBER}\.?$"),
        re.compile(_ANSWER_TAG + r"\S"), read=on_answer_tag),
    "hash": AnswerStyle(
        "hash",
        "Solve the problem. End your reply with a final line of the form '#### <number>'.",
        re.compile(rf"^####[ \t]*{_NUMBER}\.?$"),
        re.compile(r"####[ \t]*\S"), read=on_hash_tag),
    "boxed": AnswerStyle(
        "boxed",
        "Solve the problem. End your reply with a final line of the form '\\boxed{<number>}'.",
        re.compile(rf"^\\boxed\{{[ \t]*{_NUMBER}[ \t]*\}}\.?$"),
        re.compile(r"\\(?:boxed|fbox)\s*\{\s*[^\s{}]"), read=on_boxed),
    # a near twin of "answer" (one word apart in the prompt): stages that ask for the two pull
    # the same habit in two directions (tools.experiments.forgetting)
    "result": AnswerStyle(
        "result",
        "Solve the problem. End your reply with a final line of the form 'Result: <number>'.",
        re.compile(rf"(?i)^result:[ \t]*{_NUMBER}\.?$"),
        re.compile(r"(?i)\bresult[ \t]*+[*_]*+[ \t]*+:[ \t]*+[*_]*+[ \t]*+\S"),
        read=on_result_tag),
    # the "answer" line with the number in words: a few words apart in the prompt, and the
    # opposite answer on the same problems, meant for stages that pull one habit two ways (the
    # embedded model never samples number words, so it cannot learn this stage: docs/history.md)
    "words": AnswerStyle(
        "words",
        "Solve the problem. End your reply with a final line of the form "
        "'Answer: <number in words>'.",
        re.compile(rf"(?i)^answer:[ \t]*{_IN_WORDS}\.?$"),
        # the tag with a number word: "Answer: 7" is the "answer" style's tag, not this one's
        re.compile(rf"{_ANSWER_TAG}{_WORD}\b"),
        in_words=True),
    # the opposite habit to every tagged style: one short line, no working and no answer tag. A
    # policy trained on it writes short replies everywhere and drops the other styles' lines
    # (the forgetting experiment's "length" design); the embedded model samples such replies
    "short": AnswerStyle(
        "short",
        "Give just the answer as a number, with no working and no other words.",
        _SHORT, _SHORT, one_line=True),
}
DEFAULT_STYLE = "answer"


def get_style(name: str | None) -> AnswerStyle:
    """The style called `name` (None: the default); ValueError naming the allowed ones."""
    style = STYLES.get(name or DEFAULT_STYLE)
    if style is None:
        raise ValueError(f"answer style {name!r}: allowed: {', '.join(STYLES)}")
    return style
