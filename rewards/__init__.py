"""Rewards for homerl: answer verification, sandboxed scoring, and training tasks.

Nothing here imports torch, ray or transformers; tokenizers are duck-typed.

- `verify_completion` (`rewards.verifiers.verify`) scores one completion in-process
  (pure, never raises); `python -m rewards.verify` is the command-line scorer.
- `VerifierPool` / `score_completions` score batches in a worker process with
  hard per-item time limits; use these in training.
- `VERIFIERS` (`rewards.registry`): the built-in verifiers by name (numeric, exact, choice,
  regex, python-tests); `check_isolation` / `require_isolation` say whether python-tests can
  isolate completions' code here (`rewards.codecheck`).
- `RewardFns` (`rewards.fnbatch`): `reward.fn`, reward functions in TRL's convention
  (`rewards.userfns`), called in the verifier process; `check_reward_fns` checks the specs.
- `make_task` builds "arith", "gsm8k" or "file" (a user's dataset, `rewards.filetask`) tasks;
  `prompt_text` builds a sample's prompt (`format_prompt`: a question's).
"""

from rewards.codecheck import IsolationError, check_isolation, require_isolation
from rewards.fnbatch import FnScores, RewardFns, check_reward_fns
from rewards.parsing import extract_answer, normalize_answer
from rewards.registry import VERIFIERS
from rewards.registry import instruction as verifier_instruction
from rewards.sandbox import VerifierPool, score_completions
from rewards.tasks import (
    INSTRUCTION,
    TASK_NAMES,
    ArithmeticTask,
    DatasetError,
    FileOptions,
    FileTask,
    GSM8KTask,
    Task,
    format_prompt,
    instruction_for,
    make_task,
    prompt_text,
)
from rewards.userfns import TrainerState
from rewards.verifiers import (
    ANSWER_FORMAT,
    BAD_REFERENCE,
    EMPTY,
    ERROR_CODES,
    FN_BAD_OUTPUT,
    FN_ERROR,
    FN_TIMEOUT,
    MAX_COMPLETION_CHARS,
    NO_ANSWER,
    NO_CODE,
    NO_SANDBOX,
    NON_UTF8,
    OUT_OF_MEMORY,
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
    "FN_BAD_OUTPUT",
    "FN_ERROR",
    "FN_TIMEOUT",
    "INSTRUCTION",
    "MAX_COMPLETION_CHARS",
    "NON_UTF8",
    "NO_ANSWER",
    "NO_CODE",
    "NO_SANDBOX",
    "OUT_OF_MEMORY",
    "TASK_NAMES",
    "TIMEOUT",
    "TOO_LONG",
    "VERIFIERS",
    "VERIFIER_CRASH",
    "ArithmeticTask",
    "DatasetError",
    "FileOptions",
    "FileTask",
    "FnScores",
    "GSM8KTask",
    "IsolationError",
    "RewardFns",
    "RewardResult",
    "Task",
    "TrainerState",
    "VerifierPool",
    "check_isolation",
    "check_reward_fns",
    "extract_answer",
    "format_prompt",
    "format_score",
    "instruction_for",
    "is_equivalent",
    "make_task",
    "normalize_answer",
    "prompt_text",
    "require_isolation",
    "score_completions",
    "verifier_instruction",
    "verify_completion",
]
