"""Task registry and prompt formatting.

A task yields samples, plain dicts that cross every process boundary (worker, verifier
process, checkpoints as JSON). Keys:

    id          str, unique within the task
    question    str: the prompt text (a chat sample: its last user message, for display)
    answer      str: the reference its verifier checks ("42" for numeric); may be "" when
                only reward functions score the task
    task, level the task's name and level (0 where levels do not apply)
    style       optional: the answer line its prompt asks for (`rewards.styles`, numeric)
    verifier    optional: a built-in verifier by name (`rewards.registry`; default numeric)
    messages    optional: a chat prompt [{"role", "content"}, ...] used instead of question
    system      optional: a system message put before the prompt
    instruction optional: the text after the question (default: the verifier's instruction)
    columns     optional: the dataset row's other columns, passed to reward functions as
                keyword arguments (TRL's convention)

Tasks: "arith" (`ArithmeticTask`), "gsm8k" (`GSM8KTask`), "file" (a user's dataset).
"""

from __future__ import annotations

from typing import Protocol

from rewards.arith import ArithmeticTask
from rewards.gsm8k import DatasetError, GSM8KTask
from rewards.styles import DEFAULT_STYLE, STYLES, get_style

__all__ = [
    "INSTRUCTION",
    "TASK_NAMES",
    "StyledTask",
    "ArithmeticTask",
    "DatasetError",
    "GSM8KTask",
    "Task",
    "format_prompt",
    "instruction_for",
    "make_task",
]

# The default answer style's; rewards.verifiers.ANSWER_FORMAT awards its format score.
INSTRUCTION = STYLES[DEFAULT_STYLE].instruction
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


def make_task(name: str, level: int = 1, data_path: str | None = None, seed: int = 0,
              style: str | None = None) -> Task:
    """Build a task by name: "arith" uses `level`, "gsm8k" uses `data_path`; a `style` other
    than the default makes its samples ask for that answer line (`rewards.styles`)."""
    if name == "arith":
        task = ArithmeticTask(level=level, seed=seed)
    elif name == "gsm8k":
        task = GSM8KTask(data_path, seed=seed)
    else:
        raise ValueError(f"unknown task {name!r}; allowed: {', '.join(TASK_NAMES)}")
    style = get_style(style).name
    return task if style == DEFAULT_STYLE else StyledTask(task, style)


class StyledTask:
    """`task` whose samples carry `"style": style`: their prompts ask for that answer line and
    their format score checks it. Everything else is the wrapped task's."""

    def __init__(self, task: Task, style: str):
        self.task, self.style = task, get_style(style).name

    def __getattr__(self, name: str):  # name, level, sizes, ...: the wrapped task's
        return getattr(self.task, name)

    def train_sample(self, i: int) -> dict:
        return {**self.task.train_sample(i), "style": self.style}

    def heldout(self, n: int, *args) -> list[dict]:
        return [{**s, "style": self.style} for s in self.task.heldout(n, *args)]


def instruction_for(sample: dict) -> str:
    """The instruction a sample's prompt ends with: its answer style's."""
    return get_style(sample.get("style")).instruction


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
