"""Reward functions for the plurals example, written the way TRL's GRPOTrainer takes them.

Each takes keyword arguments and returns one float per completion:

    completions   the model's replies: strings, or for chat prompts one-message lists
                  [{"role": "assistant", "content": text}]
    answer        the dataset's `answer` column (the plural), one per completion
    **kwargs      everything else the trainer passes (prompts, completion_ids, the other
                  dataset columns, trainer_state, ...), unused here

They import only the standard library and run unchanged with TRL:

    GRPOTrainer(model=..., reward_funcs=[correct_plural, answer_line], args=GRPOConfig(
        reward_weights=[1.0, 0.2], ...), train_dataset=...)

or here, with `--reward.fn examples.plurals.rewards:correct_plural,...`.
"""

from __future__ import annotations

import re

_TAG = re.compile(r"(?im)^[ \t*_]*answer[ \t*_]*:[ \t*_]*(.*)$")
_WORD = re.compile(r"[A-Za-z]+(?:[-'][A-Za-z]+)*")
_STRIP = " \t\"'`*_.,;:!?\u201c\u201d\u2018\u2019"


def _text(completion) -> str:
    """A completion's text, whether it is a string or TRL's chat form."""
    if isinstance(completion, list):
        return completion[-1]["content"] if completion else ""
    return completion if isinstance(completion, str) else ""


def final_answer(text: str) -> str | None:
    """What follows the last `Answer:` tag, stripped of quotes, markdown and end punctuation,
    lower-cased; None when the reply has no such tag or it is empty."""
    tags = _TAG.findall(text)
    said = tags[-1].strip(_STRIP).casefold() if tags else ""
    return said or None


def correct_plural(completions, answer, **kwargs) -> list[float]:
    """1.0 when the reply's final `Answer:` line names the right plural (case, quotes and a
    final full stop ignored), else 0.0. Stricter than the `exact` verifier in one way: a reply
    without an `Answer:` tag scores 0 even when its last line happens to be the plural."""
    return [1.0 if final_answer(_text(c)) == str(a).strip().casefold() else 0.0
            for c, a in zip(completions, answer)]


def answer_line(completions, **kwargs) -> list[float]:
    """Format shaping: 1.0 when the reply ends with a line `Answer: <one word>`, 0.5 when an
    `Answer:` line with one word is present but not last, else 0.0. Right or wrong word alike:
    use it with a small weight next to `correct_plural`."""
    out = []
    for c in completions:
        text = _text(c).strip()
        tags = _TAG.findall(text)
        said = tags[-1].strip(_STRIP) if tags else ""
        if not said or not _WORD.fullmatch(said):
            out.append(0.0)
            continue
        last = text.rsplit("\n", 1)[-1]
        out.append(1.0 if _TAG.fullmatch(last) else 0.5)
    return out


def plural_mentioned(completions, answer, **kwargs) -> list[float]:
    """Lenient: 1.0 when the right plural appears anywhere in the reply as a whole word, and
    the reply names at most two candidate words in its `Answer:` line (no lists), else 0.0."""
    out = []
    for c, a in zip(completions, answer):
        text, target = _text(c), str(a).strip().casefold()
        words = {w.casefold() for w in _WORD.findall(text)}
        said = final_answer(text) or ""
        out.append(1.0 if target in words and len(_WORD.findall(said)) <= 2 else 0.0)
    return out
