"""Injectable verify functions for VerifierPool tests (no tests in here).

They live in an importable top-level module because the pool's spawn-ed worker
imports its verify function by name.
"""

import os
import time

from rewards.verifiers.reference import verify

SLOW = "__slow_item__"  # sleeps far past any test timeout
CRASH = "__crash_item__"  # kills the worker process outright
RAISE = "__raise_item__"  # raises inside the worker, which survives
HOG = "__hog_item__"  # asks for 1 GiB at once (zero pages: nothing is touched without a limit)


def marker_verify(completion, answer):
    """`verify`, except for the marker completions above."""
    if completion == SLOW:
        time.sleep(60)
    elif completion == CRASH:
        os._exit(3)
    elif completion == RAISE:
        raise RuntimeError("deliberate failure for tests")
    elif completion == HOG:
        hog = bytes(2**30)
        return verify(f"Answer: {len(hog) // 2**30}", answer)
    return verify(completion, answer)


def every_parser(completion, answer):
    """Run every answer parser on `completion` (any length: verify itself stops at
    MAX_COMPLETION_CHARS), then score it as `verify` does."""
    from rewards.parsing import extract_answer
    from rewards.styles import STYLES
    from rewards.verifiers import text as checks
    from rewards.verifiers.reference import format_score
    from rewards.working import working_valid

    extract_answer(completion)
    for style in STYLES:
        format_score(completion, style)
    checks.exact(completion, answer)
    checks.choice(completion, "B")
    working_valid(completion, "What is 1 + 1?")
    return verify(completion, answer)
