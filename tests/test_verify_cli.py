"""`python -m rewards.verify FILE --verifier NAME` scores a dataset's references and sample
replies with any built-in verifier, the way training would; a bad name is one line."""

import json

import pytest

from rewards.verifiers.python_tests import check_isolation
from rewards.verifiers.registry import VERIFIERS
from rewards.verify import main

ADD = "```python\ndef add(a, b):\n    return {}\n```"
ALWAYS_EQUAL = ("```python\nclass Anything:\n    def __eq__(self, other):\n        return True\n"
                "def add(a, b):\n    return Anything()\n```")
CASES = {  # verifier: (answer, right reply, wrong replies)
    "numeric": ("42", "6 x 7 = 42\nAnswer: 42", ["Answer: 41"]),
    "exact": ("Paris", "**Answer:** paris.", ["Answer: London"]),
    "choice": ("B", "Answer: (B)", ["Answer: C"]),
    "regex": (r"[a-z]+\d+", "Answer: abc123", ["Answer: 123abc"]),
    "python-tests": ("assert add(1, 2) == 3\n", ADD.format("a + b"),
                     [ADD.format("a - b"), ALWAYS_EQUAL]),
}


def run(capsys, tmp_path, verifier: str) -> tuple[int, list[dict], str]:
    answer, right, wrong = CASES[verifier]
    path = tmp_path / "replies.jsonl"
    path.write_text("".join(json.dumps({"completion": c, "answer": answer}) + "\n"
                            for c in [right, *wrong]))
    rc = main([str(path), "--verifier", verifier])
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines()], err


def test_every_verifier_has_a_case():
    assert set(CASES) == set(VERIFIERS)


@pytest.mark.parametrize("verifier", list(CASES))
def test_a_right_and_a_wrong_reply_for_each_verifier(capsys, tmp_path, verifier):
    rc, lines, err = run(capsys, tmp_path, verifier)
    assert rc == 0, err
    assert [line["line"] for line in lines] == list(range(1, len(lines) + 1))
    if verifier == "python-tests" and (why := check_isolation()) is not None:
        assert {line["error"] for line in lines} == {"no_sandbox"}, why
        return
    assert [line["score"] for line in lines] == [1.0] + [0.0] * (len(lines) - 1), lines
    assert all(line["error"] is None and line["format_score"] == 1.0 for line in lines), lines
    assert ("reward" in lines[0]) == (verifier == "numeric")  # the preset's shaping: numeric


def test_a_bad_verifier_is_one_line_naming_the_allowed_ones(capsys, tmp_path):
    (tmp_path / "x.jsonl").write_text('{"completion": "Answer: 1", "answer": "1"}\n')
    assert main([str(tmp_path / "x.jsonl"), "--verifier", "nope"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert "'nope'" in err and all(name in err for name in VERIFIERS), err
