"""Tests for rewards.verifiers, rewards.sandbox and the rewards.verify CLI."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rewards import parsing
from rewards.result import ERROR_CODES, RewardResult
from rewards.sandbox import pool as sandbox
from rewards.sandbox.pool import VerifierPool, score_completions
from rewards.verifiers.reference import (
    ANSWER_FORMAT,
    extract_answer,
    format_score,
    is_equivalent,
    normalize_answer,
    verify,
)
from tasks.prompts import INSTRUCTION

try:  # tests/ as a package, or as a plain directory on sys.path
    from tests import test_rewards_helpers as helpers
except ImportError:
    import test_rewards_helpers as helpers

REPO = Path(__file__).resolve().parents[1]
BIG_DIGITS = "1" * 100_000
RANDOM_BYTES = bytes(range(128, 256)) * 8  # never valid UTF-8

# (completion, reference, score, parsed, error)
CASES = [
    # right answers in each format
    ("Answer: 42", "42", 1.0, "42", None),
    ("Work...\n#### 72", "Natalia sold 48/2 = 24 clips.\n#### 72", 1.0, "72", None),
    ("So the result is \\boxed{17}.", "17", 1.0, "17", None),
    ("answer: 9", "9", 1.0, "9", None),
    ("3 + 4 = 7", "7", 1.0, "7", None),
    (b"Answer: 7", "7", 1.0, "7", None),
    ("**Answer:** 42", "42", 1.0, "42", None),
    ("Answer: **42**", "42", 1.0, "42", None),
    ("Answer: 12 apples", "12", 1.0, "12", None),
    ("Answer: The total is 18 apples.", "18", 1.0, "18", None),
    ("Answer: x = 5", "5", 1.0, "5", None),
    # wrong answers
    ("Answer: 41", "42", 0.0, "41", None),
    ("\\boxed{5}", "6", 0.0, "5", None),
    ("Answer: 5", "-5", 0.0, "5", None),
    ("Answer: 0.33", "1/3", 0.0, "0.33", None),
    ("\\boxed{\\sqrt{5}}", "2", 0.0, "\\sqrt{5}", None),
    ("Answer: 1/0", "1", 0.0, "1/0", None),
    # normalisation: commas, $, %, .0, fractions, signs
    ("Answer: 1,234", "1234", 1.0, "1234", None),
    ("Answer: $1,234.50", "1234.5", 1.0, "1234.5", None),
    ("The answer is 1,000,000.", "1000000", 1.0, "1000000", None),
    ("Answer: 50%", "50", 1.0, "50", None),
    ("Answer: 72.0", "72", 1.0, "72", None),
    ("Answer: 72.00", "#### 72", 1.0, "72", None),
    ("Answer: 72.", "72", 1.0, "72", None),
    ("Answer: 3/4", "0.75", 1.0, "3/4", None),
    ("Answer: 2/4", "1/2", 1.0, "1/2", None),
    ("Answer: 0.1", "1/10", 1.0, "0.1", None),
    ("Answer: 0.3333333", "1/3", 1.0, "0.3333333", None),
    ("Answer: -5", "-5", 1.0, "-5", None),
    ("The answer is \u22125.", "-5", 1.0, "-5", None),
    ("Answer: -0.0", "0", 1.0, "0", None),
    ("x-5 = 0, so x = 5", "5", 1.0, "5", None),
    # LaTeX and symbolic equivalence (math-verify)
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0, "1/2", None),
    ("\\boxed{\\dfrac{3}{4}}", "0.75", 1.0, "3/4", None),
    ("\\boxed{\\frac{2}{4}}", "1/2", 1.0, "1/2", None),
    ("\\boxed{\\sqrt{4}}", "2", 1.0, "\\sqrt{4}", None),
    ("\\boxed{2^{3}}", "8", 0.0, "2^{3}", None),  # a power still to work out is not 8
    ("\\boxed{2^{3}}", "2^3", 1.0, "2^{3}", None),  # ... but equals a symbolic reference
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0, "\\frac{\\sqrt{2}}{2}", None),
    ("\\boxed{x+1}", "1+x", 1.0, "x+1", None),
    # nested braces, priorities, repeated tags
    ("\\boxed{\\frac{\\frac{1}{2}}{2}}", "0.25", 1.0, "\\frac{\\frac{1}{2}}{2}", None),
    ("\\boxed{{5}}", "5", 1.0, "5", None),
    ("\\boxed{5", "5", 1.0, "5", None),
    ("Answer: 3\nLet me recheck.\nAnswer: 4", "4", 1.0, "4", None),
    ("Answer: 3\nAnswer: 4", "3", 0.0, "4", None),
    # the asked "Answer:" tag is read, not an earlier #### or \boxed{} (lenient evaluation
    # still reads those first: tests/test_working.py)
    ("#### 10\nAnswer: 11", "10", 0.0, "11", None),
    ("\\boxed{12} so Answer: 13", "12", 0.0, "13", None),
    # errors
    ("", "1", 0.0, None, "empty"),
    ("   \n\t ", "1", 0.0, None, "empty"),
    (None, "1", 0.0, None, "empty"),
    ("I don't know.", "1", 0.0, None, "no_answer"),
    (b"\xff\xfeAnswer: 1", "1", 0.0, None, "non_utf8"),
    (RANDOM_BYTES, "1", 0.0, None, "non_utf8"),
    ("Answer: \udcff1", "1", 0.0, None, "non_utf8"),
    (42, "42", 0.0, None, "non_utf8"),
    ("x" * 1_000_000, "1", 0.0, None, "too_long"),
    (BIG_DIGITS, "1", 0.0, None, "too_long"),
    ("Answer: 7", "", 0.0, None, "bad_reference"),
    ("Answer: 7", None, 0.0, None, "bad_reference"),
    ("Answer: 7", "#### not a number", 0.0, None, "bad_reference"),
    ("Answer: 7", "9^{9^{9}}", 0.0, None, "bad_reference"),
    # pathological maths must come back fast as a plain wrong answer
    ("9**9**9**9", "42", 0.0, "9", None),
    ("Answer: 9**9**9**9", "42", 0.0, "9**9**9**9", None),
    ("\\boxed{9^{9^{9^{9}}}}", "42", 0.0, "9^{9^{9^{9}}}", None),
    ("Answer: " + "9" * 5_000, "9", 0.0, "9" * 5_000, None),
]


@pytest.fixture(scope="module")
def warm_verifier():
    """A process's first LaTeX answer loads math_verify's parser and grader (1.7 s here idle,
    over 2 s beside the other pytest process): once, before the bound below times a case."""
    verify("\\boxed{\\sqrt{4}}", "2")


@pytest.mark.parametrize(("completion", "reference", "score", "parsed", "error"), CASES)
def test_verify_table(warm_verifier, completion, reference, score, parsed, error):
    start = time.monotonic()
    result = verify(completion, reference)
    assert (result.score, result.parsed, result.error) == (score, parsed, error)
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Let me think.\nAnswer: 42", 1.0),
        ("Answer: 42\n\n", 1.0),
        ("answer: -3.5", 1.0),
        ("Answer: $1,200", 1.0),
        ("Answer: 42\nThanks!", 0.5),
        ("**Answer:** 42", 0.5),
        ("Answer: 42 apples", 0.5),
        ("\\boxed{42}", 0.25),  # another style's tag than the asked "Answer:"
        ("#### 42", 0.25),
        ("The answer is 42", 0.0),
        ("", 0.0),
    ],
)
def test_format_score(text, expected):
    assert format_score(text) == expected


def test_format_score_reported_by_verify_and_instruction_consistent():
    assert verify("Steps.\nAnswer: 5", "5").format_score == 1.0
    assert verify("\\boxed{5}", "5").format_score == 0.25
    assert verify("5", "5").format_score == 0.0
    assert "Answer: <number>" in INSTRUCTION and ANSWER_FORMAT.match("Answer: 5")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 5\n\\boxed{6}", ("5", "hash")),
        ("\\boxed{\\frac{1}{2}} Answer: 3", ("\\frac{1}{2}", "boxed")),
        ("Final answer: 7", ("7", "answer_tag")),
        ("1 then 2 then 3", ("3", "last_number")),
        ("nothing", (None, "none")),
    ],
)
def test_extract_answer_rules(text, expected):
    assert extract_answer(text) == expected
    assert expected[1] in parsing.EXTRACTION_RULES


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (" $1,234.50 ", "1234.5"),
        ("007", "7"),
        ("\u22123", "-3"),
        ("-\\frac{2}{4}", "-1/2"),
        ("4/2", "2"),
        ("\\text{5 apples}", "5"),
        ("45^\\circ", "45"),
        ("x \\in A", "x\\in A"),
        ("", None),
        (None, None),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_is_equivalent_numeric_and_symbolic():
    assert is_equivalent("1/2", "0.5")
    assert not is_equivalent("1000000", "1000001")  # integers compare exactly
    assert is_equivalent("1000000", "1000000.0000001")  # within relative 1e-6
    assert is_equivalent("1/3", "0.3333333")
    assert is_equivalent("\\sqrt{4}", "2")
    assert not is_equivalent(None, "2")


@pytest.mark.parametrize("restated", ["6 + 9", "6+9.", "3*5", "2^4-1", "16 - 1", "3 \\times 5",
                                      "30/2 + 0"])
def test_unevaluated_expression_is_not_a_numeric_answer(restated):
    """A trained policy found this hole: "Answer: 6 + 9" scored 1 for 15 (math-verify works
    the sum out), so it learned to restate the question instead of adding."""
    assert verify(f"Answer: {restated}", "15").score == 0.0
    assert verify("Answer: 15", "15").score == 1.0
    assert verify("Answer: \\frac{30}{2}", "15").score == 1.0  # a number, written in LaTeX
    assert verify("Answer: x + 1", "1 + x").score == 1.0  # symbolic references still compare


def test_error_codes_closed_set():
    codes = ("empty no_answer too_long non_utf8 timeout bad_reference verifier_crash "
             "out_of_memory no_code no_sandbox fn_error fn_timeout fn_bad_output")
    assert set(codes.split()) == ERROR_CODES


# --- sandbox -----------------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    with VerifierPool() as shared:
        yield shared


def test_pool_matches_verify_and_is_cheap_per_batch(pool):
    completions = [f"Step {i}.\nAnswer: {i}" for i in range(16)]
    answers = [str(i) for i in range(16)]
    assert pool.score(completions, answers) == [
        verify(c, a) for c, a in zip(completions, answers, strict=True)
    ]
    start = time.monotonic()
    results = pool.score(completions, answers)
    assert time.monotonic() - start < 0.5  # warm worker: no process start per batch
    assert all(r.score == 1.0 for r in results) and pool.starts == 1
    assert pool.score([], []) == []


def test_pool_pathological_inputs_are_bounded(pool):
    nasty = ["9**9**9**9", "\\boxed{9^{9^{9^{9}}}}", "x" * 1_000_000, BIG_DIGITS, RANDOM_BYTES]
    start = time.monotonic()
    results = pool.score(nasty, ["42"] * len(nasty), timeout_s=2.0)
    assert time.monotonic() - start < 10.0
    assert all(r.score == 0.0 for r in results)
    assert [r.error for r in results] == [None, None, "too_long", "too_long", "non_utf8"]


def test_pool_rejects_bad_arguments(pool):
    with pytest.raises(ValueError):
        pool.score(["a"], [])
    with pytest.raises(ValueError):
        pool.score(["a"], ["1"], timeout_s=0)


def test_pool_timeout_kills_worker_and_continues():
    items = ["Answer: 1", helpers.SLOW, "Answer: 3", "Answer: 4"]
    with VerifierPool(verify_fn=helpers.marker_verify) as pool:
        start = time.monotonic()
        results = pool.score(items, ["1", "2", "3", "4"], timeout_s=0.5)
        elapsed = time.monotonic() - start
        assert results[1] == RewardResult(0.0, 0.0, None, "timeout")
        assert [r.score for r in results] == [1.0, 0.0, 1.0, 1.0]
        assert elapsed < 10.0
        assert pool.errors["timeout"] == 1 and pool.starts == 2
        assert pool.score(["Answer: 8"], ["8"])[0].score == 1.0  # still usable
    with pytest.raises(RuntimeError):
        pool.score(["Answer: 1"], ["1"])


def test_pool_worker_crash_and_exception():
    items = [helpers.CRASH, "Answer: 2", helpers.RAISE, "Answer: 4"]
    with VerifierPool(verify_fn=helpers.marker_verify) as pool:
        results = pool.score(items, ["1", "2", "3", "4"])
    assert [r.error for r in results] == ["verifier_crash", None, "verifier_crash", None]
    assert [r.score for r in results] == [0.0, 1.0, 0.0, 1.0]
    assert pool.errors["verifier_crash"] == 2
    assert pool.starts == 2  # an exception does not cost a restart, a dead worker does


def test_pool_works_off_the_main_thread():
    outcome = {}

    def run():
        with VerifierPool(verify_fn=helpers.marker_verify) as pool:
            outcome["results"] = pool.score([helpers.SLOW, "Answer: 2"], ["1", "2"], timeout_s=0.5)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert [r.error for r in outcome["results"]] == ["timeout", None]
    assert outcome["results"][1].score == 1.0


def test_score_completions_uses_one_global_pool():
    # the process's pool may have been started (and restarted) by earlier tests' evaluations
    assert score_completions(["Answer: 3"], ["3"])[0].score == 1.0
    first = sandbox._global_pool
    starts, pid = first.starts, first.pid
    score_completions(["Answer: 3"], ["3"])
    assert sandbox.shared_pool() is sandbox._global_pool is first
    assert (first.starts, first.pid) == (starts, pid) and pid is not None


# --- CLI -----------------------------------------------------------------------


def _run_cli(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "rewards.verify", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_scores_file_and_reports_bad_lines(tmp_path):
    path = tmp_path / "in.jsonl"
    lines = [
        json.dumps({"completion": "Answer: 72", "answer": "#### 72"}),
        "{not json",
        "",
        json.dumps(["a list"]),
        json.dumps({"completion": "Answer: 5", "answer": 6}),
        json.dumps({"answer": "1"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    proc = _run_cli(str(path), "--timeout", "2.0")
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [o["line"] for o in out] == [1, 2, 4, 5, 6]
    assert out[0] == {"line": 1, "score": 1.0, "format_score": 1.0, "parsed": "72", "error": None,
                      "working_valid": False, "reward": 1.0}  # cpu-demo: no working, no bonus
    assert [o["error"] for o in out[1:]] == [
        "bad_input_line",
        "bad_input_line",
        None,
        "bad_input_line",
    ]
    assert out[3]["score"] == 0.0 and out[3]["parsed"] == "5"


def test_cli_reads_stdin():
    proc = _run_cli("-", stdin=json.dumps({"completion": "#### 3", "answer": "3"}) + "\n")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["score"] == 1.0


def test_cli_missing_file_exits_2_without_traceback(tmp_path):
    proc = _run_cli(str(tmp_path / "missing.jsonl"))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_verifier_process_does_not_reimport_the_callers_main_module(tmp_path):
    # Under spawn a child re-runs the parent's __main__ module (in a Ray actor: Ray's worker
    # script and its imports); the verifier needs none of it. The script below counts how many
    # processes ran its top level.
    marks = tmp_path / "marks"
    script = tmp_path / "main_script.py"
    script.write_text(
        "import os\n"
        f"open({str(marks)!r}, 'a').write(str(os.getpid()) + '\\n')\n"
        "from rewards.sandbox.pool import VerifierPool\n"
        "if __name__ == '__main__':\n"
        "    with VerifierPool() as pool:\n"
        "        assert pool.score(['Answer: 4'], ['4'])[0].score == 1.0\n"
        "        assert __file__  # restored after the start\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, str(script)], check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": root})
    assert len(marks.read_text().split()) == 1


ADVERSARIAL = [  # a policy can write each of these in a few hundred tokens
    "Answer:" + " " * 1500 + "\nx",  # took ~7 s to parse before the tag patterns were made linear
    "Answer" + " " * 20_000 + "x",
    "####" + " " * 20_000 + "\n",
    "**Answer:**" + " " * 20_000 + "**",
    "Result:" + " " * 20_000 + "x\n",
    "Answer: \t" * 10_000 + "\n",
    "Answer: " * 12_000,
    "1," * 50_000,
    "\\boxed{" * 14_000,
    "seven " * 16_000,
    "1" * 20_000,  # a digit run: the exponent pattern once tried every split of it (~10 s)
    "1 + " * 4_999 + "1 = 5000\nAnswer: 5000",  # one long statement for working_valid
]


def test_adversarial_completions_are_scored_without_the_timeout_path():
    """Every parser (numeric, every answer style's format, exact, choice, working_valid) on
    inputs of 20,000 to 100,000 characters of spaces, tags, digits, boxes and sums, inside the
    verifier process with its 2 s limit per item: none may need the timeout
    (tools.measure.parsers times them)."""
    with VerifierPool(verify_fn=helpers.every_parser) as pool:
        results = pool.score(ADVERSARIAL, ["3"] * len(ADVERSARIAL), timeout_s=2.0)
    assert [r.error for r in results].count("timeout") == 0, [r.error for r in results]
    assert pool.errors["timeout"] == 0
