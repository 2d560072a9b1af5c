"""Worst-case speed of the answer parsers on adversarial completions.

    python -m tools.measure.parsers                 # 100,000 characters per input
    python -m tools.measure.parsers --chars 20000

Every family (long runs of spaces after or before an answer tag, tags repeated, digit runs,
commas, unclosed boxes, operator chains, ...) is scored by each parser (`extract_answer`,
`format_score` in every answer style, the numeric, exact and choice verifiers, the format
bonus's `working_valid`); the script prints the slowest milliseconds per family and overall, and
the ratio of the time at N characters to the time at N/2 (2 for a linear parser, 4 for a
quadratic one). The verifier process gives each item 2 s
(`rollout.reward_timeout_s`); no parser may come near it.
"""

from __future__ import annotations

import argparse
import functools
import time

from rewards.parsing import extract_answer
from rewards.styles import STYLES
from rewards.verifiers.reference import format_score, verify
from rewards.verifiers.text import choice, exact
from rewards.working import working_valid

FAMILIES = {
    "answer tag, spaces, newline": lambda n: "Answer:" + " " * n + "\nx",
    "answer, spaces, no colon": lambda n: "Answer" + " " * n + "x",
    "answer, stars": lambda n: "Answer" + "*" * n + "x",
    "#### spaces": lambda n: "####" + " " * n + "\n",
    "unclosed boxes": lambda n: "\\boxed{" * (n // 7),
    "digits": lambda n: "1" * n,
    "digit commas": lambda n: "1," * (n // 2),
    "answer repeated": lambda n: "answer " * (n // 7),
    "answer: repeated": lambda n: "Answer: " * (n // 8),
    "tabs and tags": lambda n: "Answer: \t" * (n // 9) + "\n",
    "result tag, spaces": lambda n: "Result:" + " " * n + "x\n",
    "number words": lambda n: "seven " * (n // 6),
    "newlines": lambda n: "\n" * n + "Answer: 3",
    "emphasis": lambda n: "**Answer:**" + " " * n + "**",
    "operator chain, no =": lambda n: "1+" * (n // 2),
    "operator chain, =": lambda n: "1 + " * (n // 4) + "1 = 2\nAnswer: 2",
    "minus runs": lambda n: "-1-" * (n // 3) + "=1\nAnswer: 1",
    "statements": lambda n: "1+1=2 " * (n // 6) + "\nAnswer: 2",
}
PARSERS = {
    "extract_answer": extract_answer,
    **{f"format_score[{k}]": functools.partial(format_score, style=k) for k in STYLES},
    "verify (numeric)": lambda t: verify(t, "3"),
    "exact": lambda t: exact(t, "x"),
    "choice": lambda t: choice(t, "B"),
    "working_valid": lambda t: working_valid(t, "What is 1 + 1?"),
}


def worst_ms(text: str) -> tuple[float, str]:
    """(slowest parser's milliseconds on `text`, its name)."""
    out = []
    for name, parse in PARSERS.items():
        t0 = time.perf_counter()
        parse(text)
        out.append(((time.perf_counter() - t0) * 1e3, name))
    return max(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.measure.parsers", description=__doc__.splitlines()[0])
    p.add_argument("--chars", type=int, default=100_000, help="characters per input")
    args = p.parse_args(argv)
    overall = (0.0, "", "")
    for family, make in FAMILIES.items():
        full, (half, _) = worst_ms(make(args.chars)), worst_ms(make(args.chars // 2))
        print(f"{family:<30} {full[0]:8.1f} ms ({full[1]}); x{full[0] / max(half, 1e-3):.1f} "
              f"from {args.chars // 2} characters")
        overall = max(overall, (full[0], family, full[1]))
    print(f"slowest: {overall[0]:.1f} ms ({overall[1]}, {overall[2]}) at {args.chars} "
          "characters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
