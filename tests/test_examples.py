"""The worked examples under examples/: their data scripts are deterministic and keep the
held-out split honest (disjoint by noun / by function family, large enough to measure), their
reward functions score hand-written replies as documented, in both of TRL's completion forms,
and the code example's reference solutions pass the python-tests verifier while wrong code
fails it. Pure Python, no Ray, no model: seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from examples.code import make_data as code_data
from examples.code.rewards import asked_name, one_code_block
from examples.plurals import make_data as plural_data
from examples.plurals.rewards import answer_line, correct_plural, plural_mentioned
from rewards.verifiers.python_tests import check_isolation, python_tests
from rewards.verifiers.text import exact
from tasks.file_task import FileOptions
from tasks.registry import make_task

REPO = Path(__file__).resolve().parents[1]
WHY_NOT = check_isolation()


def chat(text: str) -> list[dict]:
    """A completion in TRL's chat form."""
    return [{"role": "assistant", "content": text}]


@pytest.fixture(scope="module", params=["plurals", "code"])
def written(request, tmp_path_factory) -> tuple[str, Path]:
    """An example's data written by its script, run as the README says, into a fresh folder."""
    out = tmp_path_factory.mktemp(request.param)
    subprocess.run([sys.executable, str(REPO / "examples" / request.param / "make_data.py"),
                    str(out)], check=True, capture_output=True, cwd=REPO)
    return request.param, out


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_data_scripts_are_deterministic(written, tmp_path):
    """A second run writes byte-identical files: the split never moves between seeds or hosts."""
    name, out = written
    subprocess.run([sys.executable, str(REPO / "examples" / name / "make_data.py"),
                    str(tmp_path)], check=True, capture_output=True, cwd=REPO)
    for file in ("train.jsonl", "heldout.jsonl"):
        assert (out / file).read_bytes() == (tmp_path / file).read_bytes()


def test_held_out_split_is_disjoint_and_large_enough(written):
    """>= 100 held-out prompts, none of whose nouns (plurals) or functions (code, under any of
    its names) training ever asks for; and the file task keeps that file as its held-out set."""
    name, out = written
    train, held = rows(out / "train.jsonl"), rows(out / "heldout.jsonl")
    assert len(held) >= 100 and len(train) > len(held)
    key = "noun" if name == "plurals" else "family"
    assert {r[key] for r in train}.isdisjoint({r[key] for r in held})
    if name == "code":
        train_names = {r["entry_point"] for r in train}
        assert train_names.isdisjoint({r["entry_point"] for r in held})
    verifier = "exact" if name == "plurals" else "python-tests"
    task = make_task("file", data_path=str(out / "train.jsonl"), file_options=FileOptions(
        verifier=verifier, heldout_path=str(out / "heldout.jsonl")))
    assert {s["question"] for s in task.heldout(1000)} == {r["question"] for r in held}


def test_plural_table_is_right_on_every_rule():
    """Spot checks of each rule of the noun table (a wrong rule would teach a wrong answer)."""
    table = plural_data.plural_table()
    for noun, plural in (("cat", "cats"), ("box", "boxes"), ("city", "cities"),
                         ("monkey", "monkeys"), ("piano", "pianos"), ("potato", "potatoes"),
                         ("roof", "roofs"), ("knife", "knives"), ("mouse", "mice"),
                         ("sheep", "sheep"), ("child", "children")):
        assert table[noun][0] == plural, noun


@pytest.mark.parametrize("wrap", [str, chat], ids=["text", "chat"])
def test_plural_rewards_score_hand_written_replies(wrap):
    replies = ["The plural of box is boxes.\nAnswer: boxes",  # right, answer line last
               "**Answer:** \"Boxes.\"",                       # right: case, quotes, markdown
               "Answer: boxes\nHope that helps!",              # right word, line not last
               "Answer: boxs",                                 # wrong word, good format
               "boxes",                                        # no tag: 0 for correct_plural
               "Answer: boxes or boxen"]                       # two candidates
    got = [wrap(r) for r in replies]
    answers = ["boxes"] * len(replies)
    assert correct_plural(completions=got, answer=answers) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert answer_line(completions=got) == [1.0, 1.0, 0.5, 1.0, 0.0, 0.0]
    assert plural_mentioned(completions=got, answer=answers) == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0]


def test_plural_reward_agrees_with_the_exact_verifier_on_tagged_replies():
    """What training rewards is what the held-out evaluation (`exact`) counts as right."""
    for reply in ("Answer: geese", "answer: Geese.", "Answer: gooses", "x\nAnswer: *geese*"):
        assert correct_plural(completions=[reply], answer=["geese"])[0] == \
            exact(reply, "geese").score


CODE_REPLIES = [
    ("```python\ndef add(a, b):\n    return a + b\n```", 1.0, 1.0),
    ("Here:\n```python\ndef add(a, b):\n    return a + b\n```\nUsage:\n```python\n"
     "print(add(1, 2))\n```", 0.0, 0.0),                      # a second block hides it
    ("```python\ndef add_numbers(a, b):\n    return a + b\n```", 0.5, 0.0),  # wrong name
    ("```\ndef add(a, b):\n    return a + b\n```", 0.0, 0.0),  # no python tag
    ("```python\ndef add(a, b)\n    return a + b\n```", 0.5, 0.0),  # syntax error
    ("def add(a, b):\n    return a + b", 0.0, 0.0),               # no fence
]


@pytest.mark.parametrize("wrap", [str, chat], ids=["text", "chat"])
def test_code_rewards_score_hand_written_replies(wrap):
    got = [wrap(text) for text, _, _ in CODE_REPLIES]
    names = ["add"] * len(got)
    assert one_code_block(completions=got, entry_point=names) == [b for _, b, _ in CODE_REPLIES]
    assert asked_name(completions=got, entry_point=names) == [n for _, _, n in CODE_REPLIES]


def batches(rows: list[dict]) -> list[list[dict]]:
    """Rows grouped so that no function name repeats within a group (a constant-k family asks
    for one name with several k): each group runs as one module in one sandboxed child."""
    out: list[list[dict]] = []
    for r in rows:
        group = next((g for g in out if all(x["entry_point"] != r["entry_point"] for x in g)
                      and len(g) < 150), None)
        if group is None:
            out.append(group := [])
        group.append(r)
    return out


@pytest.mark.skipif(WHY_NOT is not None, reason=f"no isolation here: {WHY_NOT}")
def test_code_references_pass_and_wrong_code_fails():
    """Every row's reference passes its row's tests in the sandbox, as a fenced reply; an
    off-by-one body, the right body under another name, and a body returning None fail."""
    train, held = code_data.build()
    assert {r["family"] for r in train + held} == {f.names[0] for f in code_data.FAMILIES}
    for group in batches(train + held):
        code = "\n".join(r["reference"] for r in group)
        result = python_tests(f"```python\n{code}```", "".join(r["answer"] for r in group))
        assert result.score == 1.0, (sorted({r["family"] for r in group}), result)
    r = next(x for x in held + train if x["entry_point"] == "add")
    wrong = r["reference"].replace("return a + b", "return a + b + 1")
    assert wrong != r["reference"]
    renamed = r["reference"].replace("def add(", "def add_two(")
    for bad in (wrong, renamed, "def add(a, b):\n    pass\n"):
        assert python_tests(f"```python\n{bad}```", r["answer"]).score == 0.0, bad
