"""rewards.working: the format bonus pays for true arithmetic working only, and
`python -m rewards.verify --preset` prints what a run would pay."""

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from rewards.shaping import format_bonus
from rewards.working import evaluate, statements, working_valid

REPO = Path(__file__).resolve().parents[1]
Q = "What is 6 + 9?"


@pytest.mark.parametrize("text, question, valid", [
    ("7\nAnswer: 7", Q, False),                      # a number is not working
    ("6 + 9\nAnswer: 7", Q, False),                  # the question restated, no statement
    ("Answer: 7\nAnswer: 7", Q, False),              # the answer line twice
    ("7 - 0 = 6\nAnswer: 6", "Mia has 7 stickers and gives away 0.", False),  # a false sum
    ("6 + 9\nAnswer: 15", Q, False),                 # right, but nothing worked out
    ("6 + 9 = 15\nAnswer: 15", Q, True),
    ("6 + 9 = 15\nAnswer: 15", "Is 6 + 9 = 15? What is 6 + 9?", False),  # copied
    ("1 + 1 = 2\nAnswer: 7", Q, False),              # true, but not what the answer says
    ("Add them: 6 + 9 = 15.\nSo she has 15.\nAnswer: 15", Q, True),  # prose around it
    ("12 x 3 = 36\n36 / 4 = 9\nAnswer: 9", None, True),
    ("12 x 3 = 36\n36 / 4 = 8\n8 + 1 = 9\nAnswer: 9", None, False),  # one false step
    ("6-9=-3\nAnswer: -3", None, True),
    ("2 + 3 * 4 = 14\nAnswer: 14", None, True),      # * before +
    ("3 + 4 = 7\n\\boxed{7}\nDone.", None, True),    # the answer line: the last with a number
    ("Answer: 7", None, False),
    ("", None, False),
])
def test_working_by_hand(text, question, valid):
    assert working_valid(text, question) is valid


def test_statements_are_evaluated_exactly():
    assert evaluate("2 + 3 * 4") == 14 and evaluate("7 / 2") == Fraction(7, 2)
    assert evaluate("1,000 - 1") == 999 and evaluate("3 \u00d7 4 \u00f7 6") == 2
    assert evaluate("8 / 0") is None and evaluate("6 +") is None
    assert [s[1] for s in statements("3 + 4 = 7 and 2 * 2 = 5\n9 - 10 = -1")] == [True, False,
                                                                                  True]
    assert statements("6 + 9 = 15 + 1") == []  # a chain going on past "=" is not one statement


def test_the_bonus_goes_to_valid_working_only():
    """reward.format_needs_working: each gamed completion of "What is 6 + 9?" gets no bonus;
    without the rule every one of them keeps it."""
    texts = ["7\nAnswer: 7", "6 + 9\nAnswer: 7", "Answer: 7\nAnswer: 7", "6 + 9\nAnswer: 15",
             "6 + 9 = 15\nAnswer: 15"]
    fmt = np.ones(len(texts), np.float32)
    got = format_bonus(fmt, texts, True, questions=[Q] * len(texts))
    assert got.tolist() == [0, 0, 0, 0, 1]
    assert format_bonus(fmt, texts, False).tolist() == [1] * len(texts)


def test_verify_prints_what_the_preset_pays(tmp_path):
    """`python -m rewards.verify FILE --preset cpu-demo` on the gamed completions: 0 for each
    wrong guess, 1.0 for a right answer with copied or no working, 1.5 with true working."""
    rows = [("7\nAnswer: 7", Q, "15"), ("6 + 9\nAnswer: 7", Q, "15"),
            ("Answer: 7\nAnswer: 7", Q, "15"),
            ("7 - 0 = 6\nAnswer: 6", "Mia has 7 stickers and gives away 0. How many?", "7"),
            ("6 + 9\nAnswer: 15", Q, "15"), ("6 + 9 = 15\nAnswer: 15", Q, "15")]
    path = tmp_path / "lines.jsonl"
    path.write_text("".join(json.dumps({"completion": c, "question": q, "answer": a}) + "\n"
                            for c, q, a in rows))
    run = subprocess.run([sys.executable, "-m", "rewards.verify", str(path), "--preset",
                          "cpu-demo"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = [json.loads(line) for line in run.stdout.splitlines()]
    assert [o["reward"] for o in out] == [0.0, 0.0, 0.0, 0.0, 1.0, 1.5]
    assert [o["working_valid"] for o in out] == [False] * 5 + [True]
    bad = subprocess.run([sys.executable, "-m", "rewards.verify", str(path), "--preset", "x"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "cpu-demo" in bad.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("text, style, ref, score, lenient", [
    # the asked "Answer:" line is read, not a "####" tag in the working (today's rule reads 9)
    ("#### Step 1: add 6 and 9\n6 + 9 = 15\nAnswer: 15", None, "15", 1.0, 0.0),
    # a right \boxed{} above a wrong asked line is wrong for training and strict accuracy
    ("\\boxed{15}\nAnswer: 7", None, "15", 0.0, 1.0),
    ("Answer: 15\n\\boxed{7}", "boxed", "7", 1.0, 1.0),          # asked \boxed{}: read there
    ("Result: 15\n#### 3", "result", "15", 1.0, 0.0),
    ("15", None, "15", 1.0, 1.0),                                 # no tag: any rule, as before
])
def test_the_reward_reads_the_asked_line_and_evaluation_keeps_any_rule(text, style, ref, score,
                                                                       lenient):
    from rewards.verifiers.reference import verify

    result = verify(text, ref, style)
    assert (result.score, result.any_rule) == (score, lenient)


def test_strict_accuracy_reads_the_asked_line_and_accuracy_any_rule():
    """launch.evaluate.scoring: `\\boxed{15}` then `Answer: 7` is right by any rule (accuracy,
    as earlier tables count it) but not strict."""
    from launch.evaluate.scoring import score

    out = score([{"question": Q, "answer": "15"}], ["\\boxed{15}\nAnswer: 7"], [5], 0.0)
    assert out["accuracy"] == 1.0 and out["strict_accuracy"] == 0.0
    assert out["format_rate"] == 1.0 and out["tagged_accuracy"] == 0.0
