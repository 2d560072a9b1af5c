"""A call's prompts as token ids: chat format, tokenize, refuse, never truncate."""

from __future__ import annotations

from dataclasses import dataclass

from tasks.prompts import prompt_text


@dataclass(frozen=True)
class EncodedPrompts:
    """A call's prompts as the engine gets them."""

    keep: list[int]
    """indices of the kept prompts in the call"""
    skipped: list[dict]
    """{index, id, reason[, tokens]} of each refused prompt"""
    ids: list[list[int]]
    """token ids of each kept prompt, in `keep`'s order"""


def encode_prompts(tokenizer, prompts: list[dict], limit: int) -> EncodedPrompts:
    """Each prompt's chat-formatted token ids (tasks/prompts.py). Empty questions and prompts
    longer than `limit` tokens are refused with a counted reason: a truncated prompt would be
    a different question with the same reference answer."""
    keep, skipped, ids = [], [], []
    for i, p in enumerate(prompts):
        text = prompt_text(tokenizer, p)  # chat template, system message, instruction
        toks = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not p["question"].strip():
            skipped.append({"index": i, "id": p.get("id"), "reason": "empty_prompt"})
        elif len(toks) > limit:
            skipped.append({"index": i, "id": p.get("id"), "reason": "prompt_too_long",
                            "tokens": len(toks)})
        else:
            keep.append(i)
            ids.append(toks)
    return EncodedPrompts(keep, skipped, ids)
