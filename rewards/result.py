"""What scoring one completion gives: a `RewardResult`, whose `error` is one of a closed set
of codes (`ERROR_CODES`; None when scoring went fine). Every verifier, the sandbox and the
reward functions' batches return these; the run counts each code (`reward/error/<code>`)."""

from __future__ import annotations

from dataclasses import dataclass

# --- error codes: the closed set a RewardResult.error can take (None = ok) ---
EMPTY = "empty"  # completion is empty or whitespace only (or None)
NO_ANSWER = "no_answer"  # no tagged answer and no number anywhere
TOO_LONG = "too_long"  # longer than MAX_COMPLETION_CHARS; not parsed at all
NON_UTF8 = "non_utf8"  # bytes that are not UTF-8, unencodable str, or not text at all
TIMEOUT = "timeout"  # a time limit was hit: the sandbox's per item, or python-tests code's
BAD_REFERENCE = "bad_reference"  # the reference answer itself is unusable
VERIFIER_CRASH = "verifier_crash"  # a bug in verify, or the sandbox worker died
OUT_OF_MEMORY = "out_of_memory"  # the verifier process hit its memory limit (rewards.sandbox)
NO_CODE = "no_code"  # python-tests: the reply holds no code (rewards.verifiers.python_tests)
NO_SANDBOX = "no_sandbox"  # python-tests: the code cannot be isolated here, and unisolated is off
# a reward function's call (reward.fn, rewards.userfns): reward 0 for it on that call's batch
FN_ERROR = "fn_error"  # it raised, could not be imported, or its process died
FN_TIMEOUT = "fn_timeout"  # it took over reward.fn_timeout_s
FN_BAD_OUTPUT = "fn_bad_output"  # not one number (or None) per completion
ERROR_CODES = frozenset(
    {EMPTY, NO_ANSWER, TOO_LONG, NON_UTF8, TIMEOUT, BAD_REFERENCE, VERIFIER_CRASH,
     OUT_OF_MEMORY, NO_CODE, NO_SANDBOX, FN_ERROR, FN_TIMEOUT, FN_BAD_OUTPUT}
)

MAX_COMPLETION_CHARS = 20_000
"""longer completions are not parsed at all: TOO_LONG"""


@dataclass(frozen=True)
class RewardResult:
    """Outcome of scoring one completion.

    score: 1.0 if the answer is correct, else 0.0. A numeric answer is read from the asked
        style's last tag where the text has one (`AnswerStyle.read`), else by any rule.
    format_score: 1.0 if the answer is given in the asked format (see `format_score`).
    parsed: the normalised extracted answer, None when nothing was extracted.
    error: one of `ERROR_CODES`, None when scoring went fine.
    lenient: a numeric answer's score by any extraction rule, whatever the asked style
        (`extract_answer`: `####` > `\\boxed{}` > `Answer:` > last number): evaluation's
        lenient accuracy; None where it is `score`.
    """

    score: float
    format_score: float
    parsed: str | None
    error: str | None
    lenient: float | None = None

    @property
    def any_rule(self) -> float:
        """The score by any extraction rule (`lenient`, else `score`)."""
        return self.score if self.lenient is None else self.lenient


def error_result(code: str) -> RewardResult:
    """A zero-score result carrying error `code` (must be in `ERROR_CODES`)."""
    if code not in ERROR_CODES:
        raise ValueError(f"unknown reward error code {code!r}")
    return RewardResult(0.0, 0.0, None, code)
