"""Tests for tasks.registry: arithmetic and GSM8K tasks, the factory, prompts."""

import json
import re
import sys
import types
from pathlib import Path

import pytest

from rewards.parsing import words
from rewards.verifiers.reference import verify
from tasks import DatasetError
from tasks.arith import (
    HELDOUT_SIZE,
    OP_NAMES,
    SPLITS,
    ArithmeticTask,
    is_heldout_fact,
    is_heldout_question,
    level1_facts,
    needs_carry,
    templates,
)
from tasks.gsm8k import GSM8KTask
from tasks.phrasings import binary_text
from tasks.prompts import INSTRUCTION, format_prompt
from tasks.registry import make_task

GSM8K_TRAIN = Path(__file__).resolve().parents[2] / "shared/data/gsm8k/train.jsonl"
SAMPLE_KEYS = {"id", "question", "answer", "task", "level", "template", "split"}
BINARY_RE = re.compile(r"^What is (\d+) ([-+*]) (\d+)\?$")


@pytest.mark.parametrize("level", [1, 2, 3])
def test_arith_deterministic_per_seed(level):
    first, second = ArithmeticTask(level, seed=7), ArithmeticTask(level, seed=7)
    samples = [first.train_sample(i) for i in range(200)]
    assert samples == [second.train_sample(i) for i in range(200)]
    assert samples[0].keys() == SAMPLE_KEYS and samples[0]["level"] == level
    other = [ArithmeticTask(level, seed=8).train_sample(i) for i in range(200)]
    assert [s["question"] for s in samples] != [s["question"] for s in other]
    for split in SPLITS:  # seed-free
        assert first.heldout(20, split) == ArithmeticTask(level, seed=99).heldout(20, split)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_arith_heldout_splits_never_reach_training(level):
    """Neither held-out split appears in a long training stream, and no unseen template is
    ever trained on: the unseen split measures transfer to new phrasings."""
    task = ArithmeticTask(level, seed=0)
    seen = task.heldout(HELDOUT_SIZE, "seen")
    unseen = task.heldout(HELDOUT_SIZE, "unseen")
    assert len(seen) == len(unseen) == HELDOUT_SIZE >= 150
    assert all(is_heldout_question(s["question"]) for s in seen)
    for split in (seen, unseen):
        assert len({s["question"] for s in split}) == len(split)  # distinct
    training = [task.train_sample(i) for i in range(20_000)]
    questions = {s["question"] for s in training}
    assert questions.isdisjoint(s["question"] for s in seen)
    assert questions.isdisjoint(s["question"] for s in unseen)
    unseen_names = {t.__name__ for t in templates(level, "unseen")}
    assert {s["template"] for s in unseen} == unseen_names
    assert not unseen_names & {s["template"] for s in training}
    assert {s["template"] for s in training} == {t.__name__ for t in templates(level, "seen")}
    assert len(templates(level, "seen")) + len(unseen_names) >= 12 and len(unseen_names) >= 3


def test_level1_held_out_facts_are_never_trained_in_any_phrasing():
    """A fixed fifth of the 155 level-1 facts: none of their texts, in any template, is in the
    first 10,000 training samples of two seeds (every other fact is); each held-out sample says
    which kind of fact it asks, and both kinds are in each split."""
    facts = [f for f in level1_facts() if is_heldout_fact(*f)]
    assert 0.15 <= len(facts) / len(level1_facts()) <= 0.25
    texts = {binary_text(t, a, op, b) for split in SPLITS for t in templates(1, split)
             for a, op, b in facts}
    others = {binary_text(t, a, op, b) for t in templates(1, "seen")
              for a, op, b in level1_facts() if not is_heldout_fact(a, op, b)}
    for seed in (0, 1):
        training = {ArithmeticTask(1, seed).train_sample(i)["question"] for i in range(10_000)}
        assert training.isdisjoint(texts) and training <= others
    for split in SPLITS:
        held = ArithmeticTask(1).heldout(HELDOUT_SIZE, split)
        assert {s["fact"] for s in held} == {"seen", "unseen"}
        assert all((s["question"] in texts) == (s["fact"] == "unseen") for s in held)
    assert "fact" not in ArithmeticTask(2).heldout(5)[0]  # level 2 has too many facts to list


def test_held_out_scores_break_down_by_fact():
    """launch.evaluate.scoring: accuracy per kind of fact beside the split's own, from hand-written
    completions."""
    from launch.evaluate.scoring import score

    samples = [{"question": f"q{i}", "answer": "5", "fact": f} for i, f in
               enumerate(["seen", "seen", "seen", "unseen"])]
    texts = ["Answer: 5", "Answer: 5", "Answer: 4", "Answer: 4"]
    out = score(samples, texts, [3] * 4, 0.0)
    assert out["accuracy"] == 0.5
    assert out["by_fact"] == {"seen": {"n": 3, "accuracy": pytest.approx(2 / 3)},
                              "unseen": {"n": 1, "accuracy": 0.0}}
    assert "by_fact" not in score([{"question": "q", "answer": "5"}], ["Answer: 5"], [3], 0.0)


@pytest.mark.parametrize("a, op, b, carries", [
    (347, "+", 589, True), (123, "+", 456, False), (95, "+", 5, True), (980, "+", 19, False),
    (500, "-", 123, True), (579, "-", 123, False), (100, "-", 1, True), (9, "-", 9, False),
    (312, "*", 3, False), (15, "*", 7, True), (101, "*", 12, True), (400, "*", 2, False)])
def test_carry_follows_the_written_method(a, op, b, carries):
    assert needs_carry(a, op, b) is carries


def test_held_out_binary_problems_say_what_they_exercise():
    """Levels 1-2 carry the operation and whether it carries; the labels match the question's
    own numbers; level 3's word problems carry neither."""
    import re

    held = ArithmeticTask(2).heldout(200)
    assert {s["op"] for s in held} == {"add", "subtract", "multiply"}
    assert {s["carry"] for s in held} == {"carry", "no carry"}
    plain = [s for s in held if s["template"] in ("_t_what", "_t_calc", "_t_equals")]
    assert len(plain) > 20
    for s in plain:  # "What is A op B?": the numbers read back
        a, op, b = re.search(r"(\d+) ([-+*]) (\d+)", s["question"]).groups()
        assert OP_NAMES[op] == s["op"]
        assert (s["carry"] == "carry") is needs_carry(int(a), op, int(b))
    assert {s["op"] for s in ArithmeticTask(1).heldout(200)} == {"add", "subtract"}
    assert "op" not in ArithmeticTask(3).heldout(5)[0]


def test_held_out_scores_break_down_by_operation_and_carry():
    from launch.evaluate.scoring import score

    kinds = [("add", "carry"), ("add", "no carry"), ("multiply", "carry"), ("add", "carry")]
    samples = [{"question": f"q{i}", "answer": "5", "op": op, "carry": c}
               for i, (op, c) in enumerate(kinds)]
    out = score(samples, ["Answer: 5", "Answer: 4", "Answer: 5", "Answer: 5"], [3] * 4, 0.0)
    assert out["by_op"] == {"add": {"n": 3, "accuracy": pytest.approx(2 / 3)},
                            "multiply": {"n": 1, "accuracy": 1.0}}
    assert out["by_carry"] == {"carry": {"n": 3, "accuracy": 1.0},
                               "no carry": {"n": 1, "accuracy": 0.0}}
    assert "by_fact" not in out


def test_the_demo_and_evaluate_print_facts_by_templates():
    from launch import demo
    from launch.evaluate import saved_models

    def split(seen, unseen):
        return {"by_fact": {"seen": {"n": 160, "accuracy": seen},
                            "unseen": {"n": 40, "accuracy": unseen}}}

    before = {"seen": split(0.4, 0.3), "unseen": split(0.2, 0.1)}
    after = {"seen": split(0.9, 0.5), "unseen": split(0.7, 0.25)}
    rows = demo.facts_table(before, after).splitlines()
    assert "30.0% -> 50.0%" in rows[2] and "10.0% -> 25.0%" in rows[2]  # the unseen facts row
    assert rows[2].startswith("unseen facts") and "(n= 40)" in rows[2]
    assert demo.facts_table({"x": {}}, {"x": {}}) is None
    res = [{"model": "m", "sets": after}]
    out = saved_models.facts_table(res, ["seen", "unseen"]).splitlines()
    assert "unseen templates/unseen facts" in out[0] and out[1].split()[-1] == "25.0%"


@pytest.mark.parametrize("split", SPLITS)
def test_level1_texts_are_unambiguous_and_answers_right(split):
    """Every (template, fact) text of level 1 determines one answer, and samples carry it."""
    answer_of = {}
    for template in templates(1, split):
        for a, op, b in level1_facts():
            text = binary_text(template, a, op, b)
            want = a + b if op == "+" else a - b
            assert answer_of.setdefault(text, want) == want, text  # no ambiguous phrasing
    task = ArithmeticTask(1, seed=3)
    samples = task.heldout(HELDOUT_SIZE, split)
    if split == "seen":
        samples += [task.train_sample(i) for i in range(500)]
    for sample in samples:
        assert sample["answer"] == str(answer_of[sample["question"]])


@pytest.mark.parametrize("level", [1, 2])
def test_bare_expression_answers_are_correct(level):
    task = ArithmeticTask(level, seed=3)
    samples = [task.train_sample(i) for i in range(2000)] + task.heldout(HELDOUT_SIZE)
    bare = [s for s in samples if s["template"] == "_t_what"]
    assert len(bare) > 20
    for sample in bare:
        a, op, b = BINARY_RE.match(sample["question"]).groups()
        a, b = int(a), int(b)
        assert sample["answer"] == str({"+": a + b, "-": a - b, "*": a * b}[op])
        if level == 1:
            assert a < 10 and b < 10 and op in "+-"


def test_number_words():
    assert [words(n) for n in (0, 7, 13, 20, 42, 100, 305, 999)] == [
        "zero", "seven", "thirteen", "twenty", "forty-two", "one hundred",
        "three hundred five", "nine hundred ninety-nine"]
    with pytest.raises(ValueError):
        words(1000)


def test_arith_level3_word_problems():
    task = ArithmeticTask(3, seed=0)
    samples = [task.train_sample(i) for i in range(300)]
    assert all(s["answer"].isdigit() for s in samples)  # non-negative integers
    assert len({s["template"] for s in samples}) == len(templates(3, "seen"))
    sample = samples[0]
    assert verify(f"Steps...\nAnswer: {sample['answer']}", sample["answer"]).score == 1.0


def test_arith_rejects_bad_arguments():
    with pytest.raises(ValueError):
        ArithmeticTask(4, seed=0)
    with pytest.raises(ValueError):
        ArithmeticTask(1, seed=0).train_sample(-1)


def _write_jsonl(path, rows):
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r) for r in rows))
    return str(path)


def _row(i):
    row = {"question": f"Q{i}: what is {i} + 1?", "answer": f"{i}+1\n#### {i + 1}"}
    return json.dumps(row) + "\n"


def test_gsm8k_reports_bad_lines(tmp_path):
    rows = [_row(i) for i in range(10)]
    rows[2] = "{broken json\n"
    rows[5] = json.dumps({"question": "no final answer", "answer": "42"}) + "\n"
    rows[7] = "\n"  # blank lines are skipped, not bad
    path = _write_jsonl(tmp_path / "data.jsonl", rows)
    with pytest.warns(UserWarning, match=r"data\.jsonl: skipped 2 bad line\(s\): 3, 6"):
        task = GSM8KTask(path, seed=0, heldout_size=3)
    assert task.bad_lines == [3, 6]
    assert len(task) == 4 and len(task.heldout(100)) == 3
    train = {task.train_sample(i)["question"] for i in range(8)}
    assert train.isdisjoint(s["question"] for s in task.heldout(3))


def test_gsm8k_all_bad_or_missing_raises(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", ["nope\n", "[1]\n"])
    with pytest.raises(DatasetError, match="bad.jsonl"):
        GSM8KTask(path, seed=0)
    with pytest.raises(DatasetError, match="missing.jsonl"):
        GSM8KTask(str(tmp_path / "missing.jsonl"), seed=0)


def test_gsm8k_epochs_are_seeded_permutations(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [_row(i) for i in range(12)])
    task = GSM8KTask(path, seed=1, heldout_size=2)
    epoch0 = [task.train_sample(i)["id"] for i in range(10)]
    epoch1 = [task.train_sample(i)["id"] for i in range(10, 20)]
    assert sorted(epoch0) == sorted(epoch1) and len(set(epoch0)) == 10
    assert epoch0 != epoch1
    assert epoch0 == [
        GSM8KTask(path, seed=1, heldout_size=2).train_sample(i)["id"] for i in range(10)
    ]
    assert epoch0 != [
        GSM8KTask(path, seed=2, heldout_size=2).train_sample(i)["id"] for i in range(10)
    ]


def test_gsm8k_hub_unreachable_raises_dataset_error(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(DatasetError, match="local JSONL"):
        GSM8KTask(None, seed=0)


@pytest.mark.skipif(not GSM8K_TRAIN.exists(), reason="shared GSM8K copy not present")
def test_gsm8k_real_file():
    task = make_task("gsm8k", data_path=str(GSM8K_TRAIN), seed=0)
    heldout = task.heldout(200)
    assert len(heldout) == 200 and task.bad_lines == []
    sample = task.train_sample(0)
    assert sample.keys() == SAMPLE_KEYS - {"template", "split"} and sample["task"] == "gsm8k"
    assert re.fullmatch(r"-?\d+(\.\d+)?", sample["answer"])
    heldout_questions = {s["question"] for s in heldout}
    assert all(task.train_sample(i)["question"] not in heldout_questions for i in range(2000))


def test_make_task():
    assert isinstance(make_task("arith", level=2, seed=5), ArithmeticTask)
    with pytest.raises(ValueError, match="arith, gsm8k"):
        make_task("mmlu")


class ChatTokenizer:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return f"<user>{messages[0]['content']}</user><assistant>"


class PlainTokenizer:
    chat_template = None


def test_format_prompt_with_and_without_chat_template():
    chat = format_prompt(ChatTokenizer(), "What is 2 + 2?")
    assert chat == f"<user>What is 2 + 2?\n{INSTRUCTION}</user><assistant>"
    plain = format_prompt(PlainTokenizer(), "What is 2 + 2?")
    assert plain == f"Question: What is 2 + 2?\n{INSTRUCTION}\n"
    assert format_prompt(object(), "Q", instruction="Be brief.") == "Question: Q\nBe brief.\n"
