"""The tasks by name (`make_task`), and what the trainer needs of one (`Task`).

A task yields samples, plain dicts that cross every process boundary (worker, verifier
process, checkpoints as JSON). Keys:

    id          str, unique within the task
    question    str: the prompt text (a chat sample: its last user message, for display)
    answer      str: the reference its verifier checks ("42" for numeric); may be "" when
                only reward functions score the task
    task, level the task's name and level (0 where levels do not apply)
    style       optional: the answer line its prompt asks for (`rewards.styles`, numeric)
    verifier    optional: a built-in verifier by name (`rewards.verifiers.registry`;
                default numeric)
    messages    optional: a chat prompt [{"role", "content"}, ...] used instead of question
    system      optional: a system message put before the prompt
    instruction optional: the text after the question (default: the verifier's instruction)
    columns     optional: the dataset row's other columns, passed to reward functions as
                keyword arguments (TRL's convention)

Tasks: "arith" (`ArithmeticTask`), "gsm8k" (`GSM8KTask`), "file" (a user's dataset). Their
prompts: tasks/prompts.py.
"""

from __future__ import annotations

from typing import Protocol

from rewards.styles import DEFAULT_STYLE, get_style
from tasks import DatasetError
from tasks.arith import ArithmeticTask
from tasks.file_task import FileOptions, FileTask
from tasks.gsm8k import GSM8KTask

TASK_NAMES = ("arith", "gsm8k", "file")


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
              style: str | None = None, file_options: FileOptions | None = None) -> Task:
    """Build a task by name: "arith" uses `level`, "gsm8k" uses `data_path`, "file" uses
    `data_path` and `file_options` (its field mapping, verifier and held-out split; default
    `FileOptions()`); a `style` other than the default makes its samples ask for that answer
    line (`rewards.styles`)."""
    if name == "arith":
        task = ArithmeticTask(level=level, seed=seed)
    elif name == "gsm8k":
        task = GSM8KTask(data_path, seed=seed)
    elif name == "file":
        if not data_path:
            raise DatasetError("task file needs a dataset path (curriculum.data_path)")
        task = FileTask(data_path, file_options, seed=seed)
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
