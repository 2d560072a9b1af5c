"""The built-in verifiers by name, and the instruction a prompt of each ends with.

A sample's ``"verifier"`` (`tasks.registry`) names one of `VERIFIERS`; the verifier pool
(`rewards.sandbox`) dispatches on it. Every verifier is ``(completion, answer, style=None)
-> RewardResult``, pure and never raising, with error codes from
`rewards.result.ERROR_CODES`:

- ``numeric``: the number after the answer line, compared numerically (`rewards.verifiers`);
  ``style`` picks the answer line (`rewards.styles`).
- ``exact``: the answer line's text equals the reference, normalised (`rewards.verifiers.text`).
- ``choice``: one option letter A-E, the reference's (`rewards.verifiers.text`).
- ``regex``: the answer line's text fullmatches the reference pattern (`rewards.verifiers.text`).
- ``python-tests``: the reply's Python code passes the reference's unit tests, run in an
  isolated child process (`rewards.verifiers.python_tests`).
"""

from __future__ import annotations

from collections.abc import Callable

from rewards.result import RewardResult
from rewards.styles import get_style
from rewards.verifiers.python_tests import ITEM_TIMEOUT_S, python_tests
from rewards.verifiers.reference import verify
from rewards.verifiers.text import choice, exact, regex

VerifyFn = Callable[..., RewardResult]
"""(completion, answer, style=None) -> RewardResult"""

VERIFIERS: dict[str, VerifyFn] = {
    "numeric": verify,
    "exact": exact,
    "choice": choice,
    "regex": regex,
    "python-tests": python_tests,
}

TIMEOUT_S: dict[str, float] = {"python-tests": ITEM_TIMEOUT_S}
"""per-item time limits of verifiers that need more than the pool's default"""

_ANSWER_LINE = "End your reply with a final line of the form 'Answer: <answer>'."
_INSTRUCTIONS = {
    "exact": _ANSWER_LINE,
    "regex": _ANSWER_LINE,
    "choice": "Choose one of the options. End your reply with a final line of the form "
              "'Answer: <letter>'.",
    "python-tests": "Reply with one ```python code block that defines what the task asks "
                    "for.",
}


def get_verifier(name: str) -> VerifyFn:
    """The verifier called `name`; ValueError naming the allowed ones."""
    if name not in VERIFIERS:
        raise ValueError(f"verifier {name!r}: allowed: {', '.join(VERIFIERS)}")
    return VERIFIERS[name]


def instruction(name: str, style: str | None = None) -> str:
    """The instruction a prompt checked by verifier `name` ends with (numeric: the answer
    `style`'s, `rewards.styles`; the other verifiers ignore `style`)."""
    get_verifier(name)
    if name == "numeric":
        return get_style(style).instruction
    return _INSTRUCTIONS[name]


def item_timeout(name: str | None, timeout_s: float) -> float:
    """The per-item time limit for verifier `name` when the caller asked for `timeout_s`:
    the larger of the two for verifiers with a limit of their own (`TIMEOUT_S`)."""
    return max(timeout_s, TIMEOUT_S.get(name, 0.0)) if name is not None else timeout_s
