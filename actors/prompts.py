"""Prompt encoding shared by the rollout workers: chat format, tokenize, refuse (never truncate)."""

from __future__ import annotations

from rewards import format_prompt


def encode_prompts(tokenizer, prompts: list[dict], limit: int):
    """(kept indices, skipped [{index, id, reason}], token ids of the kept prompts).

    Empty questions and prompts longer than `limit` tokens are refused with a counted reason:
    a truncated prompt would be a different question with the same reference answer.
    """
    keep, skipped, ids = [], [], []
    for i, p in enumerate(prompts):
        text = format_prompt(tokenizer, p["question"])
        toks = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not p["question"].strip():
            skipped.append({"index": i, "id": p.get("id"), "reason": "empty_prompt"})
        elif len(toks) > limit:
            skipped.append({"index": i, "id": p.get("id"), "reason": "prompt_too_long",
                            "tokens": len(toks)})
        else:
            keep.append(i)
            ids.append(toks)
    return keep, skipped, ids
