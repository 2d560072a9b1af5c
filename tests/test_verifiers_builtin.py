"""The built-in verifiers by name (rewards.verifiers.registry), the text verifiers
(rewards.verifiers.text), and the verifier pool's dispatch by name, per-verifier time limits and
memory limit (rewards.sandbox). The python-tests verifier has its own file (test_codecheck.py)."""

import time

import pytest

from common.task_config import VERIFIERS as CONFIG_VERIFIERS
from rewards.result import ERROR_CODES, RewardResult
from rewards.sandbox.pool import VerifierPool
from rewards.styles import STYLES
from rewards.verifiers import registry
from rewards.verifiers.python_tests import check_isolation
from rewards.verifiers.reference import verify
from rewards.verifiers.text import (
    answer_text,
    choice,
    chosen_letters,
    exact,
    normalize_text,
    regex,
)

try:  # tests/ as a package, or as a plain directory on sys.path
    from tests import test_rewards_helpers as helpers
except ImportError:
    import test_rewards_helpers as helpers

HUGE = "Answer: x\n" * 200_000  # 2 MB
NOT_UTF8 = bytes(range(128, 256)) * 8


# --- registry ------------------------------------------------------------------------------

def test_registry_and_config_name_the_same_verifiers():
    assert tuple(registry.VERIFIERS) == CONFIG_VERIFIERS


def test_each_verifier_has_its_instruction():
    assert registry.instruction("numeric") == STYLES["answer"].instruction
    assert registry.instruction("numeric", "boxed") == STYLES["boxed"].instruction
    assert "'Answer: <answer>'" in registry.instruction("exact")
    assert registry.instruction("regex") == registry.instruction("exact")
    assert "'Answer: <letter>'" in registry.instruction("choice", "boxed")  # style ignored
    assert "```python" in registry.instruction("python-tests")
    with pytest.raises(ValueError, match="allowed: numeric, exact"):
        registry.instruction("fuzzy")


def test_python_tests_gets_a_longer_item_limit_than_the_default():
    assert registry.item_timeout("python-tests", 2.0) >= 10.0
    assert registry.item_timeout("python-tests", 30.0) == 30.0
    assert registry.item_timeout("numeric", 2.0) == registry.item_timeout(None, 2.0) == 2.0


@pytest.mark.parametrize("name", list(registry.VERIFIERS))
@pytest.mark.parametrize("completion", [None, "", "   \n", HUGE, NOT_UTF8, "\ud800", 42])
def test_every_verifier_survives_hostile_replies(name, completion):
    result = registry.VERIFIERS[name](completion, "A")
    assert isinstance(result, RewardResult) and result.score == 0.0
    assert result.error in ERROR_CODES


# --- exact ---------------------------------------------------------------------------------

@pytest.mark.parametrize("completion,reference,score,fmt,parsed", [
    ("Answer: Paris", "paris", 1.0, 1.0, "paris"),
    ("It is the capital.\n**Answer:** *Paris.*", "Paris", 1.0, 1.0, "paris"),
    ('Answer: "Paris"', "PARIS", 1.0, 1.0, "paris"),
    ("Answer: \uff30\uff41\uff52\uff49\uff53", "Paris", 1.0, 1.0, "paris"),  # fullwidth: NFKC
    ("Answer:   New \t York ", "new york", 1.0, 1.0, "new york"),
    ("Answer: Stra\u00dfe", "STRASSE", 1.0, 1.0, "strasse"),  # casefold
    ("Answer: 42", 42, 1.0, 1.0, "42"),
    ("Paris", "Paris", 1.0, 0.0, "paris"),  # no tag: the last line
    ("Answer: Paris\nHope that helps", "paris", 1.0, 0.5, "paris"),  # tag not last
    ("Answer: Lyon", "Paris", 0.0, 1.0, "lyon"),
    ("Answer: Parisian", "Paris", 0.0, 1.0, "parisian"),
    ("Answer: Paris, France", "Paris", 0.0, 1.0, "paris, france"),
    ("```\nAnswer: Paris\n```\nAnswer: Lyon", "Paris", 0.0, 1.0, "lyon"),  # tags in code: no
])
def test_exact(completion, reference, score, fmt, parsed):
    assert exact(completion, reference) == RewardResult(score, fmt, parsed, None)


@pytest.mark.parametrize("completion,reference,error", [
    ("Answer: x", "", "bad_reference"), ("Answer: x", " \"\" ", "bad_reference"),
    ("Answer: x", None, "bad_reference"), ("Answer: x", True, "bad_reference"),
    ("Answer: x", ["x"], "bad_reference"), ("Answer: x", "x" * 2_000, "bad_reference"),
    ("", "x", "empty"), (None, "x", "empty"), (HUGE, "x", "too_long"),
    (NOT_UTF8, "x", "non_utf8"), ("Answer: \ud800", "x", "non_utf8"),
    ("Answer:", "x", "no_answer"), ("```\nAnswer: x\n```", "x", "no_answer"),
])
def test_exact_errors(completion, reference, error):
    result = exact(completion, reference)
    assert (result.score, result.error) == (0.0, error)


def test_normalize_text():
    assert normalize_text('  "\u201cHello,   World!\u201d"  ') == "hello, world"
    assert normalize_text("C++") == "c++" and normalize_text("x.") == "x"


def test_answer_text_reads_the_last_tag_outside_code():
    assert answer_text("Answer: a\nAnswer: b") == ("b", 1.0)
    assert answer_text("Answer: a\n```\nAnswer: c\n```") == ("a", 0.5)
    assert answer_text("one\n\ntwo\n") == ("two", 0.0)


# --- choice --------------------------------------------------------------------------------

@pytest.mark.parametrize("completion,reference,score,parsed", [
    ("Answer: B", "B", 1.0, "B"),
    ("Answer: (b)", "B", 1.0, "B"),
    ("So...\nB) Paris", "b", 1.0, "B"),
    ("Answer: b", "(B)", 1.0, "B"),
    ("Answer: B. Because it is.", "B)", 1.0, "B"),
    ("Answer: **C**", "C", 1.0, "C"),
    ("Answer: The answer is (C).", "C", 1.0, "C"),
    ("Answer: B, b", "B", 1.0, "B"),  # one letter, twice
    ("Answer: A or B", "B", 0.0, "A,B"),  # several letters: wrong
    ("Answer: A, B", "A", 0.0, "A,B"),
    ("Answer: (A)/(C)", "A", 0.0, "A,C"),
    ("Answer: I think A is wrong, so C", "C", 0.0, "A,C"),
    ("Answer: D", "B", 0.0, "D"),
    ("```\nAnswer: A\n```\nAnswer: C", "C", 1.0, "C"),
])
def test_choice(completion, reference, score, parsed):
    result = choice(completion, reference)
    assert (result.score, result.parsed, result.error) == (score, parsed, None)


@pytest.mark.parametrize("completion,reference,error", [
    ("Answer: B", "F", "bad_reference"), ("Answer: B", "AB", "bad_reference"),
    ("Answer: B", "", "bad_reference"), ("Answer: B", None, "bad_reference"),
    ("Answer: B", 2, "bad_reference"),
    ("Answer: Because", "B", "no_answer"), ("Answer: All of them", "A", "no_answer"),
    (HUGE, "B", "too_long"), (NOT_UTF8, "B", "non_utf8"), ("", "B", "empty"),
])
def test_choice_errors(completion, reference, error):
    result = choice(completion, reference)
    assert (result.score, result.error) == (0.0, error)


def test_chosen_letters():
    assert chosen_letters("a) an apple") == ["A"]  # the option's text is not a choice
    assert chosen_letters("C and D") == ["C", "D"]
    assert chosen_letters("Either") == []


# --- regex ---------------------------------------------------------------------------------

@pytest.mark.parametrize("completion,pattern,score", [
    ("Answer: 42", r"\d+", 1.0),
    ("Answer: 42.", r"\d+", 1.0),  # one trailing period is allowed
    ("Answer: 42 apples", r"\d+", 0.0),  # fullmatch, not search
    ("Answer: **2024-01-05**", r"\d{4}-\d{2}-\d{2}", 1.0),
    ("Answer: abc", "(?i)ABC", 1.0),
    ("Answer: abd", "ab[c]", 0.0),
    ("```\nAnswer: 1\n```\nAnswer: x", r"\d", 0.0),
])
def test_regex(completion, pattern, score):
    result = regex(completion, pattern)
    assert (result.score, result.error) == (score, None)


@pytest.mark.parametrize("pattern", ["(", "a{2,1}", "[z-a]", "", None, 7, "a" * 1_001])
def test_regex_unusable_pattern_is_bad_reference(pattern):
    result = regex("Answer: a", pattern)
    assert (result.score, result.error) == (0.0, "bad_reference")


# --- the pool: dispatch, per-verifier limits, memory --------------------------------------

@pytest.fixture(scope="module")
def pool():
    with VerifierPool() as shared:
        yield shared


def test_pool_dispatches_by_verifier_name(pool):
    items = [("Answer: 7", "7", None), ("Answer: Paris", "paris", "exact"),
             ("Answer: (b)", "B", "choice"), ("Answer: 12", r"\d+", "regex"),
             ("Answer: 7", "7", "numeric"), ("Answer: seven", "7", "exact")]
    completions, answers, names = zip(*items)
    results = pool.score(list(completions), list(answers), verifiers=list(names))
    assert results == [registry.VERIFIERS[n or "numeric"](c, a) for c, a, n in items]
    assert [r.score for r in results] == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    assert pool.score(["Answer: 7"], ["7"]) == [verify("Answer: 7", "7")]  # no names: as before


def test_pool_rejects_unknown_verifier_names_and_bad_lengths(pool):
    with pytest.raises(ValueError, match="unknown verifier"):
        pool.score(["a"], ["a"], verifiers=["fuzzy"])
    with pytest.raises(ValueError, match="verifiers"):
        pool.score(["a", "b"], ["a", "b"], verifiers=["exact"])


def test_catastrophic_pattern_times_out_and_the_batch_goes_on(pool):
    starts = pool.starts
    start = time.monotonic()
    results = pool.score(["Answer: " + "a" * 28 + "!", "Answer: 12"], ["(a+)+$", r"\d+"],
                         timeout_s=0.5, verifiers=["regex", "regex"])
    assert results[0] == RewardResult(0.0, 0.0, None, "timeout")
    # the hung process was replaced (on a loaded host a fresh one may itself overrun 0.5 s once
    # before it answers, and be replaced again: a CI run saw two starts)
    assert results[1].score == 1.0 and pool.starts >= starts + 1
    assert time.monotonic() - start < 20.0


def test_a_verifier_with_its_own_limit_gets_it(pool):
    """python-tests may take longer than the caller's per-item limit (an item sleeping 1.5 s
    under timeout_s=0.5 is scored, not timed out); the numeric items keep the caller's."""
    reply = "```python\nimport time\ntime.sleep(1.5)\nx = 1\n```"
    results = pool.score([reply], ["assert x == 1"], timeout_s=0.5, verifiers=["python-tests"])
    if check_isolation() is None:
        assert results[0] == RewardResult(1.0, 1.0, "pass", None)
    else:  # refused at once, where the code cannot be isolated
        assert results[0].error == "no_sandbox"


def test_memory_exhaustion_is_counted_the_worker_replaced_and_the_rest_scored():
    items, answers = ["Answer: 1", helpers.HOG, "Answer: 3"], ["1", "1", "3"]
    with VerifierPool(verify_fn=helpers.marker_verify, memory_bytes=512 * 2**20) as pool:
        results = pool.score(items, answers)
        assert results[1] == RewardResult(0.0, 0.0, None, "out_of_memory")
        assert [r.score for r in results] == [1.0, 0.0, 1.0]
        assert pool.errors["out_of_memory"] == 1 and pool.starts == 2
        assert pool.score(["Answer: 8"], ["8"])[0].score == 1.0  # still usable
    with VerifierPool(verify_fn=helpers.marker_verify, memory_bytes=None) as pool:
        assert pool.score([helpers.HOG], ["1"])[0].score == 1.0  # the limit made the difference
