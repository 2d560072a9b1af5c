"""Is a completion's working real? (pure Python)

The format bonus of a numeric task (`reward.format_needs_working`) pays for an answer line after
working. "Working" used to be any line with a digit above the answer line, so a guess could
collect it: `7\\nAnswer: 7`, `6 + 9\\nAnswer: 7` (the question restated), `Answer: 7\\nAnswer: 7`,
or a false sum `7 - 0 = 6\\nAnswer: 6`. Here working is valid when the lines above the answer
line (the last line with a number) hold

  - at least one arithmetic statement, `a op b [op c ...] = v` (op one of + - * / x × ÷), not
    copied from the question,
  - no false statement (each side evaluated exactly, as fractions), and
  - a last statement whose value is the number on the answer line.

Prose around the statements is neither wrong nor working: `Add them: 6 + 9 = 15` counts.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUM = r"-?\d[\d,]*(?:\.\d+)?"
# one token: a number, an operator ("x" only standing alone), "=", a word, any other character;
# a line is scanned once, token by token, so no input makes the scan worse than linear
_TOKENS = re.compile(rf"(?P<num>{_NUM})|(?P<op>[-+*/\u00d7\u00f7\u2212]|x(?![A-Za-z]))|(?P<eq>=)"
                     r"|[A-Za-z]+|\S")
_NUM_AT, _OP_AT = re.compile(rf"[ \t]*({_NUM})"), re.compile(r"[ \t]*([-+*/x\u00d7\u00f7])")
_DIGIT = re.compile(r"\d")
_LAST_NUMBER = re.compile(rf"({_NUM})\D*$")
MAX_CHARS = 20_000
"""longer completions have no valid working (`rewards.result.MAX_COMPLETION_CHARS`)"""
MAX_DIGITS = 30
"""longer numbers are not evaluated (a statement with one is neither true nor working)"""


def _number(text: str) -> Fraction | None:
    digits = text.replace(",", "")
    if len(digits) > MAX_DIGITS:
        return None
    return Fraction(digits)


def evaluate(expr: str) -> Fraction | None:
    """The exact value of `a op b op c ...` with * and / before + and -; None when it
    cannot be read or divides by zero."""
    text, pos, values, ops = expr.replace("\u2212", "-"), 0, [], []
    while pos < len(text.rstrip()):
        m = (_NUM_AT if len(values) == len(ops) else _OP_AT).match(text, pos)
        if m is None:
            return None
        if len(values) == len(ops):
            if (value := _number(m.group(1))) is None:
                return None
            values.append(value)
        else:
            ops.append({"x": "*", "\u00d7": "*", "\u00f7": "/"}.get(m.group(1), m.group(1)))
        pos = m.end()
    if not values or len(values) != len(ops) + 1:
        return None
    terms, signs = [values[0]], []
    for op, v in zip(ops, values[1:]):
        if op == "/" and v == 0:
            return None
        if op in "*/":
            terms[-1] = terms[-1] * v if op == "*" else terms[-1] / v
        else:
            signs.append(op)
            terms.append(v)
    return terms[0] + sum(t if s == "+" else -t for s, t in zip(signs, terms[1:]))


def _line_statements(line: str) -> list[tuple[str, bool, Fraction | None]]:
    out, chain, start = [], [], 0  # chain: the "a op b op c" read so far, alternating
    toks = list(_TOKENS.finditer(line))
    for k, tok in enumerate(toks):
        kind, text = tok.lastgroup, tok.group()
        if kind == "num" and chain and len(chain) % 2 == 1 and text.startswith("-"):
            chain += ["-", text[1:]]  # "6-9": the minus is the operator
        elif kind == "num" and chain and len(chain) % 2 == 0:
            chain.append(text)
        elif kind == "num":
            chain, start = [text], tok.start()
        elif kind == "op" and len(chain) % 2 == 1:
            chain.append(text)
        elif kind == "eq" and len(chain) >= 3 and len(chain) % 2 == 1 and k + 1 < len(toks):
            rhs, after = toks[k + 1], toks[k + 2] if k + 2 < len(toks) else None
            if rhs.lastgroup == "num" and not (after is not None and after.lastgroup == "op"
                                               and after.start() > rhs.end() - 1):
                lhs, value = evaluate(" ".join(chain)), _number(rhs.group())
                out.append((line[start:rhs.end()], lhs is not None and lhs == value, value))
            chain = []
        else:
            chain = []
    return out


def statements(text: str) -> list[tuple[str, bool, Fraction | None]]:
    """[(statement, true?, its stated value)] of every `a op b ... = v` in `text`, in order."""
    return [s for line in text.splitlines() for s in _line_statements(line)]


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def working_valid(text: str, question: str | None = None) -> bool:
    """Valid working above the answer line of `text`, its last line with a number (see the
    module docstring); `question`, where known, to recognise statements copied from it."""
    if len(text) > MAX_CHARS:  # not scored at all by the verifier either
        return False
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    last = max((k for k, ln in enumerate(lines) if _DIGIT.search(ln)), default=0)
    lines = lines[:last + 1]  # the answer line: the last with a number ("Done." may follow)
    if len(lines) < 2:
        return False
    found = statements("\n".join(lines[:-1]))
    if not found or not all(true for _, true, _ in found):
        return False
    asked = _squash(question or "")
    own = [s for s in found if not asked or _squash(s[0]) not in asked]
    answer = _LAST_NUMBER.search(lines[-1])
    if not own or answer is None:
        return False
    value = _number(answer.group(1))
    return value is not None and found[-1][2] == value
