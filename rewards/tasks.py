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
from rewards.filetask import FileOptions, FileTask
from rewards.gsm8k import DatasetError, GSM8KTask
from rewards.styles import DEFAULT_STYLE, STYLES, get_style

__all__ = [
    "INSTRUCTION",
    "TASK_NAMES",
    "StyledTask",
    "ArithmeticTask",
    "DatasetError",
    "FileOptions",
    "FileTask",
    "GSM8KTask",
    "Task",
    "format_prompt",
    "instruction_for",
    "make_task",
    "prompt_text",
]

# The default answer style's; rewards.verifiers.ANSWER_FORMAT awards its format score.
INSTRUCTION = STYLES[DEFAULT_STYLE].instruction
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


def instruction_for(sample: dict) -> str:
    """The instruction a sample's prompt ends with: its own "instruction" if it has one, else
    its verifier's answer-line instruction (`rewards.registry`) for a verifier other than
    numeric, else its answer style's (numeric)."""
    if "instruction" in sample:
        return sample["instruction"]
    verifier = sample.get("verifier") or "numeric"
    if verifier != "numeric":
        from rewards.registry import instruction  # lazy: the registry imports this package

        return instruction(verifier)
    return get_style(sample.get("style")).instruction


def prompt_text(tokenizer: object, sample: dict) -> str:
    """The prompt text of `sample`, as the policy sees it in training and evaluation.

    With a chat template: the sample's "system" message if it has one (unless its own
    "messages" start with one), then its "messages" (a chat sample; an explicit "instruction"
    is added to the last user message) or one user message `question + "\\n" + instruction`.
    Without one (base models): the same as plain text. Arithmetic and GSM8K samples give
    exactly `format_prompt(tokenizer, question, instruction_for(sample))`.
    """
    system = sample.get("system") or ""
    if "messages" not in sample and not system:
        return format_prompt(tokenizer, sample["question"], instruction_for(sample))
    if "messages" in sample:
        messages = [dict(m) for m in sample["messages"]]
        if sample.get("instruction"):
            last = max(i for i, m in enumerate(messages) if m["role"] == "user")
            messages[last]["content"] += "\n" + sample["instruction"]
    else:
        ask = instruction_for(sample)
        messages = [{"role": "user",
                     "content": f"{sample['question']}\n{ask}" if ask else sample["question"]}]
    if system and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system}, *messages]
    if getattr(tokenizer, "chat_template", None):
        return _apply_template(tokenizer, messages)
    if "messages" not in sample:  # today's plain prompt, after the system text
        return f"{system}\n\n" + format_prompt(tokenizer, sample["question"],
                                                instruction_for(sample))
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join([*lines, "Assistant:"])


def _apply_template(tokenizer: object, messages: list[dict]) -> str:
    prompt = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        messages, tokenize=False, add_generation_prompt=True
    )
    if not isinstance(prompt, str):
        raise TypeError(f"apply_chat_template returned {type(prompt).__name__}, not str")
    return prompt


def format_prompt(tokenizer: object, question: str, instruction: str = INSTRUCTION) -> str:
    """The prompt text for `question`.

    Uses the tokenizer's chat template when it has one (instruct models), else a
    plain "Question: ...\\n<instruction>\\n" prompt (base models). The tokenizer is
    duck-typed: anything with ``chat_template`` and ``apply_chat_template`` works.
    """
    if getattr(tokenizer, "chat_template", None):
        content = f"{question}\n{instruction}"
        return _apply_template(tokenizer, [{"role": "user", "content": content}])
    return f"Question: {question}\n{instruction}\n"
