"""Users' files as editors and JSON write them: a UTF-8 byte-order mark, floats that JSON
prints with an exponent. Pure reading and scoring: no model, no Ray."""

import codecs
import json
import subprocess
import sys

import pytest

from rewards.parsing import normalize_answer
from rewards.verifiers.reference import is_equivalent, parse_reference, verify
from tasks.eval_file import read_eval_file
from tasks.file_rows import read_table

BOM = codecs.BOM_UTF8


def test_an_eval_file_with_a_byte_order_mark_is_read_from_its_first_line(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_bytes(BOM + b'{"question": "What is 2+2?", "answer": 4}\n'
                     b'{"question": "What is 3+3?", "answer": 6}\n')
    samples = read_eval_file(path)
    assert [s["answer"] for s in samples] == ["4", "6"]
    assert samples[0]["question"] == "What is 2+2?"


@pytest.mark.parametrize("suffix,body", [
    (".jsonl", b'{"question": "Q1", "answer": "7"}\n'),
    (".json", b'[{"question": "Q1", "answer": "7"}]'),
    (".csv", b"question,answer\nQ1,7\n"),
])
def test_a_dataset_with_a_byte_order_mark_keeps_its_first_column_name(tmp_path, suffix, body):
    path = tmp_path / f"data{suffix}"
    path.write_bytes(BOM + body)
    table = read_table(str(path))
    assert table.columns == ["question", "answer"] and not table.broken
    assert str(table.rows[0]["answer"]) == "7"


def test_the_verify_cli_reads_a_file_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(BOM + json.dumps({"completion": "Answer: 5", "answer": "5"}).encode() + b"\n")
    out = subprocess.run([sys.executable, "-m", "rewards.verify", str(path)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    (row,) = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert row["score"] == 1.0, row


@pytest.mark.parametrize("value,plain", [
    (0.00001, "0.00001"), (1e16, "10000000000000000"), (1.5e-7, "0.00000015"), (-1.5e3, "-1500"),
])
def test_json_floats_printed_with_an_exponent_stay_numeric_references(tmp_path, value, plain):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"question": "Q", "answer": value}) + "\n")
    assert json.dumps(value) != plain  # JSON itself writes these with an exponent
    (sample,) = read_eval_file(path)
    assert sample["answer"] == plain
    assert verify(f"Answer: {plain}", str(value)).score == 1.0
    assert verify("Answer: 1", str(value)).score == 0.0


def test_an_exponent_in_a_reference_or_an_answer_is_its_number():
    assert parse_reference("1e16") == "10000000000000000"
    assert parse_reference("#### 1.5E-3") == "0.0015"
    assert is_equivalent("10000000000000000", "1e+16")
    assert is_equivalent("1e16", "10000000000000000")
    assert not is_equivalent("1e15", "1e16")
    assert normalize_answer("1e999") == "1e999"  # past the digit cap: not written out
