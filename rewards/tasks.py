"""Task registry and prompt formatting.

A task yields samples ``{"id", "question", "answer", "task", "level"}`` where
"answer" is a canonical plain string ("42") that `rewards.verify` accepts as a
reference. Tasks: "arith" (`ArithmeticTask`) and "gsm8k" (`GSM8KTask`).
"""

from __future__ import annotations

from typing import Protocol

from rewards.arith import ArithmeticTask
from rewards.gsm8k import DatasetError, GSM8KTask

__all__ = [
    "INSTRUCTION",
    "TASK_NAMES",
    "ArithmeticTask",
    "DatasetError",
    "GSM8KTask",
    "Task",
    "format_prompt",
    "make_task",
]

# Must agree with rewards.verifiers.ANSWER_FORMAT, which awards the format score.
INSTRUCTION = "Solve the problem. End your reply with a final line of the form 'Answer: <number>'."
TASK_NAMES = ("arith", "gsm8k")


class Task(Protocol):
    """What the trainer needs from a task."""

    name: str

    def train_sample(self, i: int) -> dict:
        """Training sample number `i`, deterministic for a given task and seed."""
        ...

    def heldout(self, n: int) -> list[dict]:
        """Up to `n` held-out samples, disjoint from the training stream."""
        ...


def make_task(name: str, level: int = 1, data_path: str | None = None, seed: int = 0) -> Task:
    """Build a task by name: "arith" uses `level`, "gsm8k" uses `data_path`."""
    if name == "arith":
        return ArithmeticTask(level=level, seed=seed)
    if name == "gsm8k":
        return GSM8KTask(data_path, seed=seed)
    raise ValueError(f"unknown task {name!r}; allowed: {', '.join(TASK_NAMES)}")


def format_prompt(tokenizer: object, question: str, instruction: str = INSTRUCTION) -> str:
    """The prompt text for `question`.

    Uses the tokenizer's chat template when it has one (instruct models), else a
    plain "Question: ...\\n<instruction>\\n" prompt (base models). The tokenizer is
    duck-typed: anything with ``chat_template`` and ``apply_chat_template`` works.
    """
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": f"{question}\n{instruction}"}]
        prompt = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            messages, tokenize=False, add_generation_prompt=True
        )
        if not isinstance(prompt, str):
            raise TypeError(f"apply_chat_template returned {type(prompt).__name__}, not str")
        return prompt
    return f"Question: {question}\n{instruction}\n"
