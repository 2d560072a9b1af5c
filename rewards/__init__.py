"""Rewards for homerl: answer verification, sandboxed scoring, and training tasks.

Nothing here imports torch, ray or transformers; tokenizers are duck-typed.

- `verify_completion` (`rewards.verifiers.verify`) scores one completion in-process
  (pure, never raises); `python -m rewards.verify` is the command-line scorer.
- `VerifierPool` / `score_completions` score batches in a worker process with
  hard per-item time limits; use these in training.
- `make_task` builds "arith" or "gsm8k" tasks; `format_prompt` builds prompts.
"""

from rewards.parsing import extract_answer, normalize_answer
from rewards.sandbox import VerifierPool, score_completions
from rewards.tasks import (
    INSTRUCTION,
    TASK_NAMES,
    ArithmeticTask,
    DatasetError,
    GSM8KTask,
    Task,
    format_prompt,
    instruction_for,
    make_task,
)
from rewards.verifiers import (
    ANSWER_FORMAT,
    BAD_REFERENCE,
    EMPTY,
    ERROR_CODES,
    MAX_COMPLETION_CHARS,
    NO_ANSWER,
    NON_UTF8,
    TIMEOUT,
    TOO_LONG,
    VERIFIER_CRASH,
    RewardResult,
    format_score,
    is_equivalent,
)
from rewards.verifiers import (
    verify as verify_completion,
)

__all__ = [
    "ANSWER_FORMAT",
    "BAD_REFERENCE",
    "EMPTY",
    "ERROR_CODES",
    "INSTRUCTION",
    "MAX_COMPLETION_CHARS",
    "NON_UTF8",
    "NO_ANSWER",
    "TASK_NAMES",
    "TIMEOUT",
    "TOO_LONG",
    "VERIFIER_CRASH",
    "ArithmeticTask",
    "DatasetError",
    "GSM8KTask",
    "RewardResult",
    "Task",
    "VerifierPool",
    "extract_answer",
    "format_prompt",
    "format_score",
    "instruction_for",
    "is_equivalent",
    "make_task",
    "normalize_answer",
    "score_completions",
    "verify_completion",
]
