"""The prompt text of a sample, as the policy sees it in training and evaluation: the chat
template, a system message, the question and the instruction its answer line follows."""

from __future__ import annotations

from rewards.styles import DEFAULT_STYLE, STYLES, get_style
from rewards.verifiers.registry import instruction

# The default answer style's; rewards.verifiers.reference.ANSWER_FORMAT awards its format score.
INSTRUCTION = STYLES[DEFAULT_STYLE].instruction


def instruction_for(sample: dict) -> str:
    """The instruction a sample's prompt ends with: its own "instruction" if it has one, else
    its verifier's answer-line instruction (`rewards.verifiers.registry`) for a verifier other than
    numeric, else its answer style's (numeric)."""
    if "instruction" in sample:
        return sample["instruction"]
    verifier = sample.get("verifier") or "numeric"
    if verifier != "numeric":
        return instruction(verifier)
    return get_style(sample.get("style")).instruction


def prompt_text(tokenizer: object, sample: dict) -> str:
    """The prompt text of `sample`, as the policy sees it in training and evaluation.

    With a chat template: the sample's "system" message if it has one (unless its own
    "messages" start with one), then its "messages" (a chat sample; an explicit "instruction"
    is added to the last user message) or one user message `question + "\\n" + instruction`.
    Without one (base models): the same as plain text. An "as_is" sample (TRL's convention):
    its text as it stands, or its messages through the template alone. Arithmetic and GSM8K
    samples give
    exactly `format_prompt(tokenizer, question, instruction_for(sample))`.
    """
    if sample.get("as_is"):  # TRL's convention: the dataset's prompt, nothing added
        if "messages" not in sample:
            return sample["question"]
        if getattr(tokenizer, "chat_template", None):
            return _apply_template(tokenizer, [dict(m) for m in sample["messages"]])
        lines = [f"{m['role'].capitalize()}: {m['content']}" for m in sample["messages"]]
        return "\n".join([*lines, "Assistant:"])
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
