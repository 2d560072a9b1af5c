"""Answer styles (rewards.styles): what each style's prompt asks for, what its format check pays,
and that a styled stage carries its style from the curriculum to the prompt, the verifier and
the held-out sets."""

import pytest
from test_curriculum import cfg_with
from test_tasks import ChatTokenizer

from actors.prompts import encode_prompts
from common.config import ConfigError
from launch.driver.curriculum import Curriculum, parse_stages
from launch.evaluate.sets import heldout_sets
from rewards.parsing import number_from_words, words
from rewards.sandbox.pool import VerifierPool
from rewards.styles import STYLES, get_style
from rewards.verifiers.reference import format_score, verify
from tasks.prompts import INSTRUCTION, instruction_for
from tasks.registry import make_task

WORKING = "3 + 4 = 7\n"
LINES = {"answer": "Answer: 7", "hash": "#### 7", "boxed": "\\boxed{7}", "result": "Result: 7"}
DIGIT_STYLES = [s for s in STYLES if not STYLES[s].in_words and not STYLES[s].one_line]


def test_every_digit_style_has_a_line_here():
    assert sorted(LINES) == sorted(DIGIT_STYLES)


@pytest.mark.parametrize("style", DIGIT_STYLES)
def test_each_style_pays_full_format_only_for_its_own_final_line(style):
    for other, line in LINES.items():
        want = 1.0 if other == style else 0.25  # another style's tag: a tagged answer
        assert format_score(WORKING + line, style) == want, (style, other)
        result = verify(WORKING + line, "7", style)
        assert result.score == 1.0 and result.format_score == want  # right in any style
        # the tag followed by more text: half for the asked style's, a quarter for another's
        assert format_score(WORKING + line + "\nMore text.", style) == (
            0.5 if other == style else 0.25), (style, other)
    assert format_score(WORKING + "so 7", style) == 0.0
    assert get_style(style).instruction != get_style(None).instruction or style == "answer"


def test_the_words_style_pays_only_for_the_number_in_words():
    def scored(text, style):
        r = verify(text, "7", style)
        return r.score, r.format_score

    assert scored(WORKING + "Answer: seven", "words") == (1.0, 1.0)
    assert scored(WORKING + "Answer: Seven.", "words") == (1.0, 1.0)
    assert scored(WORKING + "Answer: seven (7)", "words") == (1.0, 0.5)  # words, then more
    assert scored(WORKING + "Answer: eight", "words") == (0.0, 1.0)      # in words, but wrong
    # the same problem asked in digits and in words: each answer is wrong for the other ask
    assert scored(WORKING + "Answer: 7", "words") == (0.0, 0.25)  # the "answer" style's tag
    assert scored(WORKING + "Answer: seven", "answer") == (0.0, 0.5)
    assert scored(WORKING + "Answer: 7", "answer") == (1.0, 1.0)
    assert scored(WORKING + "#### seven", "words") == (1.0, 0.25)         # right, not tagged
    assert scored("Answer: seven\n3 + 4 = 7", "words") == (1.0, 0.5)      # the tag, not last
    assert scored(WORKING + "Answer: sevens", "words") == (0.0, 0.25)
    assert verify("The answer is seven.", "7", "words").error == "no_answer"
    assert verify(WORKING + "Answer: twenty-one", "21", "words").score == 1.0
    # the prompts differ only in what the number is asked in
    assert STYLES["words"].instruction == STYLES["answer"].instruction.replace(
        "<number>", "<number in words>")


def test_the_short_style_pays_only_for_a_reply_of_one_short_line_with_no_tag():
    def scored(text, style="short"):
        r = verify(text, "7", style)
        return r.score, r.format_score

    assert scored("7") == (1.0, 1.0)
    assert scored("3 + 4 = 7") == (1.0, 1.0)
    assert scored("The sum is 7.\n") == (1.0, 1.0)
    assert scored("8") == (0.0, 1.0)                        # short, but wrong
    assert scored(WORKING + "7") == (1.0, 0.0)              # working above: two lines
    for line in LINES.values():                             # any answer tag is not short
        assert scored(line) == (1.0, 0.0), line
        assert scored(WORKING + line) == (1.0, 0.0), line
    long_line = "The number of birds on the tree is now 7."  # one line, 41 characters
    assert len(long_line) == 41 and scored(long_line) == (1.0, 0.0)
    assert scored(long_line[:-2] + ".") == (0.0, 0.0)       # 40 characters, no number in it
    # a short reply is no other style's tag: on an "Answer:" prompt it earns no format score
    assert format_score("3 + 4 = 7", "answer") == 0.0
    assert format_score(WORKING + "Answer: 7", "answer") == 1.0
    assert get_style("short").instruction.startswith("Give just the answer")


def test_number_words_are_read_as_words_writes_them():
    for n in range(1000):
        text = words(n)
        assert number_from_words(text) == n
        assert number_from_words(text.replace("-", " ").capitalize() + ".") == n
        assert STYLES["words"].final_line.match(f"Answer: {text}"), text
    assert number_from_words("one hundred and five apples") == 105
    assert number_from_words("**Twenty-one**") == 21
    for text in ("7", "7 seven", "the sum is seven", "", None, "sevens"):
        assert number_from_words(text) is None, text
    assert not STYLES["words"].final_line.match("Answer: 7")
    assert not STYLES["words"].final_line.match("Answer: banana")


def test_default_style_is_the_answer_line_and_unknown_styles_are_refused():
    assert format_score("Answer: 7") == format_score("Answer: 7", "answer") == 1.0
    assert format_score("#### 7") == 0.25
    assert get_style(None).instruction == INSTRUCTION
    with pytest.raises(ValueError, match="allowed: answer, hash, boxed, result"):
        get_style("latex")
    assert verify("Answer: 7", "7", "latex").error == "verifier_crash"  # never raises


def test_the_verifier_pool_checks_each_item_against_its_own_style():
    texts = [WORKING + LINES["hash"], WORKING + LINES["hash"], WORKING + LINES["boxed"]]
    with VerifierPool() as pool:
        results = pool.score(texts, ["7", "7", "8"], styles=["hash", None, "boxed"])
        with pytest.raises(ValueError, match="2 styles"):
            pool.score(texts, ["7"] * 3, styles=["hash", None])
    assert [(r.score, r.format_score) for r in results] == [(1.0, 1.0), (1.0, 0.25), (0.0, 1.0)]


def test_styled_tasks_carry_their_style_and_default_tasks_none():
    plain, boxed = make_task("arith", 2, seed=3), make_task("arith", 2, seed=3, style="boxed")
    assert "style" not in plain.train_sample(0) and instruction_for(plain.train_sample(0)) == \
        INSTRUCTION
    s = boxed.train_sample(0)
    assert s == {**plain.train_sample(0), "style": "boxed"}  # the same problem, another ask
    assert instruction_for(s) == STYLES["boxed"].instruction
    assert all(h["style"] == "boxed" for h in boxed.heldout(5, "unseen"))
    assert boxed.level == 2  # the wrapped task's attributes


def test_a_styled_stage_asks_for_its_answer_line_in_the_prompt():
    cfg = cfg_with("arith:1:2,arith:2:2:hash", 4)
    cfg.curriculum.replay = 0.0  # replayed prompts keep their own stage's style
    cur = Curriculum(cfg)
    prompts = [cur.prompts(k)[1] for k in range(4)]
    assert all("style" not in p for p in prompts[0] + prompts[1])
    assert all(p["style"] == "hash" for p in prompts[2] + prompts[3])
    encoded = encode_prompts(_CharTokenizer(), prompts[0][:1] + prompts[2][:1], 10_000)
    keep, skipped, ids = encoded.keep, encoded.skipped, encoded.ids
    assert keep == [0, 1] and not skipped
    texts = ["".join(map(chr, t)) for t in ids]
    assert "'Answer: <number>'" in texts[0] and "'#### <number>'" in texts[1]


def test_stage_specs_with_styles_and_their_errors():
    stages = parse_stages("arith:1:3,arith:2::boxed@0.9", cfg_with("", 10))
    assert [(s.level, s.steps, s.style, s.promote_at) for s in stages] == [
        (1, 3, "answer", None), (2, 7, "boxed", 0.9)]
    with pytest.raises(ConfigError, match="style 'latex'; allowed: answer, hash, boxed"):
        parse_stages("arith:1:3:latex", cfg_with("", 10))
    with pytest.raises(ConfigError, match="bad stage"):
        parse_stages("arith:1:3:hash:x", cfg_with("", 10))


def test_heldout_set_names_take_a_style_suffix():
    sets = heldout_sets("arith-1,arith-2-boxed,arith-1-unseen-hash", 4, None)
    assert "style" not in sets["arith-1"][0]
    assert [s["style"] for s in sets["arith-2-boxed"]] == ["boxed"] * 4
    assert sets["arith-2-boxed"][0]["question"] == heldout_sets("arith-2", 1, None)[
        "arith-2"][0]["question"]
    assert sets["arith-1-unseen-hash"][0]["id"].startswith("arith-l1-unseen")
    with pytest.raises(ValueError, match="optionally ending in -STYLE"):
        heldout_sets("arith-2-latex", 4, None)
    assert [s["style"] for s in heldout_sets("arith-1-words", 2, None)["arith-1-words"]] == [
        "words"] * 2


class _CharTokenizer(ChatTokenizer):
    """Characters as token ids: the encoded prompt's text can be read back."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}
