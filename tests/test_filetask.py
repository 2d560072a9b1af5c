"""A user's own dataset (the `file` task): reading JSONL, CSV, Parquet and save_to_disk folders,
the field mapping, the held-out split, bad rows and files, prompts, curriculum stages, and tiny
training and evaluation runs on real files."""

import json
import warnings

import pytest
from conftest import own_lines

from tasks import DatasetError
from tasks.file_task import FileOptions, FileTask, prompt_key
from tasks.prompts import INSTRUCTION, format_prompt, instruction_for, prompt_text
from tasks.registry import make_task

QUESTIONS = [f"What is {i} + {i % 7}?" for i in range(30)]
ANSWERS = [i + i % 7 for i in range(30)]


def rows(n=30):
    return [{"question": q, "answer": a, "source": "mine", "weight": i / 10}
            for i, (q, a) in enumerate(zip(QUESTIONS[:n], ANSWERS[:n]))]


def write_jsonl(path, items):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items))
    return str(path)


def write_csv(path, items):
    import pandas as pd

    pd.DataFrame(items).to_csv(path, index=False)
    return str(path)


def write_parquet(path, items):
    import pandas as pd

    pd.DataFrame(items).to_parquet(path)
    return str(path)


def write_disk(path, items, test=None):
    import datasets

    ds = datasets.Dataset.from_list(items)
    if test is not None:
        ds = datasets.DatasetDict({"train": ds, "test": datasets.Dataset.from_list(test)})
    ds.save_to_disk(str(path))
    return str(path)


WRITERS = {"jsonl": write_jsonl, "csv": write_csv, "parquet": write_parquet, "disk": write_disk}


def file_of(tmp_path, kind, items):
    name = "data" if kind == "disk" else f"data.{kind}"
    return WRITERS[kind](tmp_path / name, items)


def every_sample(task):
    return [task.train_sample(i) for i in range(len(task))]


def their_warnings(fn, needle):
    """(fn's result, the messages of its warnings that mention `needle`)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught if needle in str(w.message)]


# -- reading and mapping ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet", "disk"])
def test_each_format_maps_rows_to_samples(tmp_path, kind):
    path = file_of(tmp_path, kind, rows())
    task = FileTask(path, FileOptions(heldout_size=5, system_prompt="Be brief."), seed=3)
    train, held = every_sample(task), task.heldout(100)
    assert len(train) == 25 and len(held) == 5
    by_question = {s["question"]: s for s in train + held}
    assert set(by_question) == set(QUESTIONS)
    s = by_question["What is 9 + 2?"]
    assert s["answer"] == "11" and isinstance(s["answer"], str)
    assert s["task"] == "file" and s["level"] == 0 and s["verifier"] == "numeric"
    assert s["system"] == "Be brief." and "instruction" not in s and "messages" not in s
    assert s["columns"] == {"answer": 11 if kind != "csv" else "11", "source": "mine",
                            "weight": 0.9}
    assert s["id"] == "data-10"  # its row (JSONL: line) number
    json.dumps(train)  # samples cross processes as JSON


def test_csv_answers_are_kept_as_written(tmp_path):
    path = write_csv(tmp_path / "d.csv", [{"question": "Half of 7.00?", "answer": "3.50"},
                                          {"question": "Q2", "answer": "007"}])
    task = FileTask(path, FileOptions(heldout_size=0))
    assert sorted(s["answer"] for s in every_sample(task)) == ["007", "3.50"]


def test_prompt_field_auto_order_and_explicit_fields(tmp_path):
    items = [{"problem": f"P{i}", "prompt": f"Pr{i}", "solution": i} for i in range(6)]
    path = write_jsonl(tmp_path / "d.jsonl", items)
    auto = FileTask(path, FileOptions(answer_field="solution", heldout_size=0))
    assert {s["question"] for s in every_sample(auto)} == {f"Pr{i}" for i in range(6)}
    picked = FileTask(path, FileOptions(prompt_field="problem", answer_field="solution",
                                        heldout_size=0, verifier="exact",
                                        instruction="One word."))
    s = picked.train_sample(0)
    assert s["question"].startswith("P") and not s["question"].startswith("Pr")
    assert s["answer"] == s["question"][1:] and s["columns"]["prompt"].startswith("Pr")
    assert s["verifier"] == "exact" and s["instruction"] == "One word."
    none = FileTask(path, FileOptions(answer_field="", heldout_size=0))  # reward functions only
    assert {s["answer"] for s in every_sample(none)} == {""}


def test_chat_messages_file(tmp_path):
    items = [{"messages": [{"role": "system", "content": "You add."},
                           {"role": "user", "content": f"{i} + 1?"}], "answer": i + 1}
             for i in range(8)]
    items.append({"messages": [{"role": "user"}], "answer": 1})  # malformed
    path = write_jsonl(tmp_path / "chat.jsonl", items)
    task, said = their_warnings(lambda: FileTask(path, FileOptions(heldout_size=2)), "chat.jsonl")
    assert len(said) == 1 and "line 9: field 'messages': malformed messages" in said[0]
    s = task.train_sample(0)
    assert s["messages"][0] == {"role": "system", "content": "You add."}
    assert s["question"] == s["messages"][-1]["content"] and s["answer"] == str(
        int(s["question"].split(" ")[0]) + 1)
    assert "messages" not in s["columns"] and s["columns"] == {"answer": int(s["answer"])}


def test_columns_that_are_not_json_are_dropped_with_one_warning(tmp_path):
    items = [{"question": f"Q{i}", "answer": i, "blob": b"\x00\x01", "n": i} for i in range(4)]
    path = write_parquet(tmp_path / "d.parquet", items)
    task, said = their_warnings(lambda: FileTask(path, FileOptions(heldout_size=0)), "'blob'")
    assert len(said) == 1 and "dropped" in said[0]
    assert all(s["columns"] == {"answer": int(s["answer"]), "n": int(s["answer"])}
               for s in every_sample(task))


# -- the held-out split ----------------------------------------------------------------------

def test_split_is_disjoint_by_prompt_text_and_deterministic(tmp_path):
    items = rows()
    # the same prompt again, with other spacing and case, and another answer: same side
    items += [{"question": "  what is 3 +  3? ", "answer": 99, "source": "dup", "weight": 0}
              for _ in range(3)]
    path = write_jsonl(tmp_path / "d.jsonl", items)
    for seed in range(6):
        task = FileTask(path, FileOptions(heldout_size=10, heldout_seed=seed), seed=1)
        train, held = every_sample(task), task.heldout(100)
        assert len(held) == 10 and len({prompt_key(s) for s in held}) == 10
        assert {prompt_key(s) for s in train}.isdisjoint(prompt_key(s) for s in held)
        assert len(train) + len(held) + (3 if prompt_key({"question": "What is 3 + 3?"}) in
                                         {prompt_key(s) for s in held} else 0) == 33
    one = FileTask(path, FileOptions(heldout_size=10, heldout_seed=4), seed=1)
    again = FileTask(path, FileOptions(heldout_size=10, heldout_seed=4), seed=2)
    other = FileTask(path, FileOptions(heldout_size=10, heldout_seed=5), seed=1)
    assert one.heldout(10) == again.heldout(10)  # the run seed does not move the split
    assert one.heldout(10) != other.heldout(10)
    flipped = FileTask(write_jsonl(tmp_path / "flipped.jsonl", items[::-1]),
                       FileOptions(heldout_size=10, heldout_seed=4))
    assert {prompt_key(s) for s in flipped.heldout(10)} == {prompt_key(s)
                                                            for s in one.heldout(10)}
    order = [one.train_sample(i)["id"] for i in range(len(one))]
    assert order == [one.train_sample(i)["id"] for i in range(len(one))]  # deterministic
    assert sorted(order) == sorted(s["id"] for s in every_sample(again))  # an epoch: each once
    assert order != [again.train_sample(i)["id"] for i in range(len(again))]  # seeded order
    assert one.train_sample(len(one))["id"] in order  # it cycles


def test_heldout_file_drops_the_training_rows_it_holds(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", rows())
    held = write_csv(tmp_path / "held.csv", [{"question": QUESTIONS[i].upper(), "answer": 1}
                                             for i in (2, 4, 6)] + [{"question": "New?",
                                                                     "answer": 5}])
    task, said = their_warnings(
        lambda: FileTask(path, FileOptions(heldout_path=held, heldout_size=20)), "dropped 3")
    assert len(said) == 1 and "held.csv" in said[0]
    assert len(task) == 27 and len(task.heldout(100)) == 4  # heldout_size does not apply
    assert {s["question"] for s in task.heldout(100)} >= {"New?"}


def test_a_dataset_dict_folder_uses_its_test_split(tmp_path):
    path = write_disk(tmp_path / "dd", rows(), test=[{"question": QUESTIONS[0], "answer": 0,
                                                      "source": "t", "weight": 0.0}])
    task = FileTask(path, FileOptions())
    assert len(task) == 29 and [s["question"] for s in task.heldout(9)] == [QUESTIONS[0]]


def test_no_heldout_set_and_too_small_a_dataset(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", rows(6))
    assert FileTask(path, FileOptions(heldout_size=0)).heldout(10) == []
    with pytest.raises(DatasetError, match="no training rows left: 6 distinct") as e:
        FileTask(path, FileOptions(heldout_size=6))
    assert "\n" not in str(e.value) and "heldout_size" in str(e.value)


# -- bad rows and bad files ------------------------------------------------------------------

def test_bad_rows_are_skipped_the_first_five_named_and_the_rest_counted(tmp_path):
    good = [json.dumps(r) for r in rows(4)]
    bad = ['{"question": "", "answer": 1}', '{"question": "Q", "answer": null}',
           "not json", '{"answer": 3}', '{"question": "Q", "answer": [1]}', "[1, 2]",
           '{"question": 5, "answer": 1}', '{"question": "Q", "answer": "  "}']
    path = write_jsonl(tmp_path / "d.jsonl", good[:2] + bad + good[2:])
    task, said = their_warnings(lambda: FileTask(path, FileOptions(heldout_size=1)), "d.jsonl")
    assert len(task) == 3 and len(said) == 1
    assert "skipped 8 bad line(s)" in said[0] and "(+3 more)" in said[0]
    for named in ("line 3: field 'question': empty prompt", "line 4: field 'answer': missing",
                  "line 5: not valid JSON", "line 6: field 'question': missing prompt",
                  "line 7: field 'answer': answer is a list"):
        assert named in said[0], named
    assert "line 8" not in said[0]


@pytest.mark.parametrize("name,content,want", [
    ("gone.csv", None, "no such file"),
    ("cols.csv", "q,a\nhi,1\n", "no prompt column (messages, prompt, question, problem); set "
     "curriculum.prompt_field to one of its columns: 'q', 'a'"),
    ("noans.jsonl", '{"question": "Q", "sol": 1}\n', "no column 'answer' (curriculum."
     "answer_field; empty: no reference); its columns: 'question', 'sol'"),
    ("empty.jsonl", "\n", "no rows"),
    ("empty.csv", "", "cannot read"),
    ("data.txt", "hello", "unknown format '.txt'"),
    ("allbad.csv", "question,answer\n,1\nQ,\n", "no usable rows; 2 bad: row 1: field "
     "'question': missing prompt; row 2: field 'answer': missing answer"),
    ("folder", "dir", "not a folder written by datasets' save_to_disk"),
])
def test_unusable_files_are_one_line_errors(tmp_path, name, content, want):
    path = tmp_path / name
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    with pytest.raises(DatasetError) as e:
        make_task("file", data_path=str(path))
    assert want in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_bad_file_fails_launch_train_in_one_line_before_any_actor(tmp_path, capsys,
                                                                   monkeypatch):
    from launch.driver import trainer
    from launch.train import main

    monkeypatch.setattr(trainer, "connect", lambda cfg: pytest.fail("an actor would start"))
    bad = write_csv(tmp_path / "bad.csv", [{"question": "", "answer": 1}] * 3)
    capsys.readouterr()
    assert main(["--preset", "tiny", "--curriculum.task", "file", "--curriculum.data_path", bad,
                 "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    ours = own_lines(err, "launch.train")
    assert len(ours) == 1 and "Traceback" not in err and \
        "row 1: field 'question': missing prompt" in ours[0], err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# -- prompts ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok():
    from common.models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("tiny-random-llama"))  # "<s>role: content\n" template


class Plain:
    chat_template = None


def test_arith_prompts_are_unchanged(tok):
    s = make_task("arith", 2, seed=1).train_sample(0)
    want = f"<s>user: {s['question']}\n{INSTRUCTION}\n<s>assistant: "
    assert prompt_text(tok, s) == want == format_prompt(tok, s["question"], instruction_for(s))
    assert prompt_text(Plain(), s) == f"Question: {s['question']}\n{INSTRUCTION}\n"


def test_file_prompts_chat_and_plain(tok, tmp_path):
    chat = {"question": "2 + 2?", "system": "SYS", "messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "2 + 2?"}]}
    assert prompt_text(tok, chat) == ("<s>system: SYS\n<s>user: Hi\n<s>assistant: Hello\n"
                                      "<s>user: 2 + 2?\n<s>assistant: ")
    assert prompt_text(Plain(), chat) == ("System: SYS\nUser: Hi\nAssistant: Hello\n"
                                          "User: 2 + 2?\nAssistant:")
    told = {**chat, "instruction": "Digits only."}
    assert prompt_text(tok, told).endswith("<s>user: 2 + 2?\nDigits only.\n<s>assistant: ")
    plain = {"question": "3 + 4?", "system": "SYS", "instruction": "Say it."}
    assert prompt_text(tok, plain) == "<s>system: SYS\n<s>user: 3 + 4?\nSay it.\n<s>assistant: "
    assert prompt_text(Plain(), plain) == "SYS\n\nQuestion: 3 + 4?\nSay it.\n"


def test_instruction_for_uses_the_verifier_s_default(tok):
    from rewards.verifiers.registry import instruction

    for name in ("exact", "choice", "python-tests"):
        assert instruction_for({"question": "q", "verifier": name}) == instruction(name)
    assert instruction("choice") != INSTRUCTION
    assert instruction_for({"question": "q", "verifier": "numeric"}) == INSTRUCTION
    assert instruction_for({"question": "q", "verifier": "numeric", "style": "boxed"}) == \
        instruction("numeric", "boxed")
    assert instruction_for({"question": "q", "verifier": "exact", "instruction": "X"}) == "X"
    s = {"question": "Pick one: A) 1 B) 2", "verifier": "choice"}
    assert prompt_text(tok, s) == f"<s>user: {s['question']}\n{instruction('choice')}\n" \
        "<s>assistant: "


def test_score_checks_each_sample_with_its_verifier():
    from launch.evaluate.scoring import score

    samples = [{"question": "Capital of France?", "answer": "Paris", "verifier": "exact"},
               {"question": "2 + 2?", "answer": "4", "verifier": "numeric"},
               {"question": "Pick: A) 1 B) 2", "answer": "B", "verifier": "choice"}]
    out = score(samples, ["Answer: Paris", "Answer: 4", "Answer: B"], [2, 2, 2], 1.0)
    assert out["accuracy"] == 1.0 and out["errors"] == 0
    wrong = score(samples, ["Answer: Lyon", "Answer: 5", "Answer: A"], [2, 2, 2], 1.0)
    assert wrong["accuracy"] == 0.0


def test_rollout_workers_encode_the_file_prompt(tok):
    from actors.prompts import encode_prompts

    s = {"id": "d-1", "question": "3 + 4?", "system": "SYS", "answer": "7"}
    encoded = encode_prompts(tok, [s], limit=512)
    keep, skipped, ids = encoded.keep, encoded.skipped, encoded.ids
    assert keep == [0] and not skipped
    assert ids[0] == tok(prompt_text(tok, s), add_special_tokens=False)["input_ids"]
    assert ids[0] != tok(format_prompt(tok, s["question"]), add_special_tokens=False)["input_ids"]
