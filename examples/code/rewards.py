"""Reward functions for the code example, written the way TRL's GRPOTrainer takes them.

Correctness is not here: whether the code passes the tests is the built-in `python-tests`
verifier's job (`--reward.fn python-tests,...`), which runs the code in an isolated child
process. A reward function runs in the trainer's verifier process without that isolation, so
the functions below only read the reply's text (they parse it, never run it).

    completions   the model's replies: strings, or for chat prompts one-message lists
                  [{"role": "assistant", "content": text}]
    entry_point   the dataset's `entry_point` column: the function name the prompt asks for
    **kwargs      everything else the trainer passes (prompts, answer, completion_ids, ...)

They import only the standard library and work unchanged as TRL reward functions (with TRL,
correctness needs a reward function of your own that runs the tests in a sandbox).
"""

from __future__ import annotations

import ast
import re

_FENCE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)(?:```|\Z)", re.S)
_PYTHON = {"python", "py", "python3"}


def _text(completion) -> str:
    """A completion's text, whether it is a string or TRL's chat form."""
    if isinstance(completion, list):
        return completion[-1]["content"] if completion else ""
    return completion if isinstance(completion, str) else ""


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, code) of each fenced block, in order; an unclosed last block counts."""
    return [(tag.strip().split()[0].casefold() if tag.strip() else "", body)
            for tag, body in _FENCE.findall(text)]


def defines(code: str, name: str) -> bool:
    """Whether `code` parses as Python and defines a top-level function `name` (not run)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
               for node in tree.body)


def one_code_block(completions, entry_point, **kwargs) -> list[float]:
    """Shape of the reply: 0.5 for exactly one fenced ```python block (the verifier tests the
    LAST block, so a second block of example usage hides the function), plus 0.5 when that
    block parses and defines the function under the asked name. 0 for anything else."""
    out = []
    for c, name in zip(completions, entry_point):
        blocks = code_blocks(_text(c))
        if len(blocks) != 1 or blocks[0][0] not in _PYTHON:
            out.append(0.0)
            continue
        out.append(0.5 + (0.5 if defines(blocks[0][1], str(name)) else 0.0))
    return out


def asked_name(completions, entry_point, **kwargs) -> list[float]:
    """1.0 when the reply's last ```python block defines the function under the asked name,
    else 0.0 (the commonest failure of small models: `reverse_s` for `reverse_string`)."""
    out = []
    for c, name in zip(completions, entry_point):
        python = [code for tag, code in code_blocks(_text(c)) if tag in _PYTHON]
        out.append(1.0 if python and defines(python[-1], str(name)) else 0.0)
    return out
