"""Reward shaping (rewards/shaping.py) and how a rollout worker applies it
(actors/rollout_batch.py): the format bonus, its gates, the working requirement and the overlong
penalty, on hand-made completions."""


import numpy as np
import pytest

from actors.prompts import EncodedPrompts
from actors.rollout_batch import Origin, Sampled, Scorer, verified_batch
from common.config import Config, RewardConfig
from common.memory import Footprint
from common.models import load_tokenizer
from rewards.sandbox.pool import VerifierPool
from rewards.shaping import format_bonus


def test_overlong_penalty_by_hand():
    from rewards.shaping import overlong_penalty

    # max 40 tokens, buffer 0.25 -> L_cache 10: no penalty up to 30, a ramp to -1 at 40
    assert overlong_penalty(12, 40, 0.25) == 0.0
    assert overlong_penalty(30, 40, 0.25) == 0.0
    assert overlong_penalty(31, 40, 0.25) == pytest.approx(-0.1)
    assert overlong_penalty(35, 40, 0.25) == pytest.approx(-0.5)
    assert overlong_penalty(40, 40, 0.25) == pytest.approx(-1.0)
    assert overlong_penalty(41, 40, 0.25) == -1.0
    assert overlong_penalty(3, 4, 0.1) == 0.0 and overlong_penalty(4, 4, 0.1) == -1.0  # >= 1 token
    with pytest.raises(ValueError, match="buffer_frac"):
        overlong_penalty(3, 4, 0.0)


def test_format_bonus_only_for_right_answers_by_hand():
    from rewards.shaping import combine

    correct = np.array([1.0, 1.0, 0.0, 0.0])
    fmt = np.array([1.0, 0.5, 1.0, 0.0])
    np.testing.assert_allclose(combine(correct, fmt, 0.5), [1.5, 1.25, 0.5, 0.0])
    # gated: the formatted guess (row 2) earns nothing, right answers keep their bonus
    np.testing.assert_allclose(combine(correct, fmt, 0.5, if_correct=True), [1.5, 1.25, 0.0, 0.0])


def test_format_gate_steps_gate_the_bonus_for_early_policy_versions_only():
    from actors.rollout_batch import format_gated
    from common.config import ConfigError, RewardConfig

    gate = RewardConfig(format_gate_steps=50)
    assert format_gated(gate, 0) and format_gated(gate, 49)
    assert not format_gated(gate, 50) and not format_gated(gate, 200)
    assert not format_gated(RewardConfig(), 0)                    # default: never gated
    assert format_gated(RewardConfig(format_if_correct=True), 500)  # always gated
    with pytest.raises(ConfigError, match="reward.format_gate_steps"):
        RewardConfig(format_gate_steps=-1)


def test_a_worker_pays_the_format_bonus_only_after_working_when_asked(tiny_llama):
    """verified_batch on hand-written completions, real tokenizer and verifier: with
    reward.format_needs_working the bare `Answer: 7` earns nothing while the formatted answer
    after working keeps its bonus; the format metric itself is unchanged."""
    texts = ["3 + 4 = 7\nAnswer: 7", "Answer: 7", "Answer: 8", "3 + 4 = 7"]
    tok = load_tokenizer(tiny_llama)
    comps = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    n = len(texts)
    sampled = Sampled(comps, [[0.0] * len(c) for c in comps], [[0.0] * len(c) for c in comps],
                      ["stop"] * n)
    prompts = [{"question": "What is 3 + 4?", "answer": "7"}]

    def rewards(needs_working: bool):
        cfg = Config()
        cfg.reward = RewardConfig(format_needs_working=needs_working)
        with VerifierPool() as pool:
            batch = verified_batch(prompts, EncodedPrompts([0], [], [[1, 2]]), n, sampled,
                                   Scorer(tok, pool, None, cfg, 0),
                                   Origin("w", 0.0, 0.0, Footprint(), Footprint()))
        return batch

    plain, gated = rewards(False), rewards(True)
    np.testing.assert_allclose(plain.rewards, [1.5, 1.5, 0.5, 1.0])
    np.testing.assert_allclose(gated.rewards, [1.5, 1.0, 0.0, 1.0])
    assert gated.working_valid == [1.0, 0.0, 0.0, 0.0]  # reward/working_valid, whatever pays
    assert gated.summary().metrics()["reward/working_valid"] == pytest.approx(0.25)
    np.testing.assert_array_equal(gated.format_score, plain.format_score)  # metrics unchanged


def test_format_bonus_pays_only_after_working_when_asked():
    import numpy as np

    from rewards.shaping import format_bonus

    fmt = np.array([1.0, 1.0, 0.5], np.float32)
    texts = ["3 + 4 = 7\nAnswer: 7", "Answer: 7", "2 * 3 = 6\n6"]
    assert format_bonus(fmt, texts, True).tolist() == [1.0, 0.0, 0.5]
    assert format_bonus(fmt, texts, False).tolist() == [1.0, 1.0, 0.5]


def test_a_one_line_style_needs_no_working_for_its_bonus():
    """The `short` style asks for no working: its one-line reply keeps the bonus when
    reward.format_needs_working zeroes a bare `Answer: 7` on an answer prompt."""
    import numpy as np

    from rewards.shaping import format_bonus

    fmt = np.array([1.0, 1.0, 1.0], np.float32)
    texts = ["7", "Answer: 7", "3 + 4 = 7\nAnswer: 7"]
    styles = ["short", "answer", None]
    assert format_bonus(fmt, texts, True, styles=styles).tolist() == [1.0, 0.0, 1.0]
    assert format_bonus(fmt, texts, True).tolist() == [0.0, 0.0, 1.0]  # no styles: all need it


def test_other_style_tags_pay_nothing_when_the_bonus_is_off():
    """reward.other_tag_bonus false: on a prompt asking for \\boxed{N}, an `Answer: 7` line
    (format score 0.25) earns no bonus; the asked tag, last or not, still does."""
    import numpy as np

    from launch.cli import parse_config
    from rewards.shaping import format_bonus
    from rewards.verifiers.reference import format_score

    texts = ["3 + 4 = 7\nAnswer: 7", "3 + 4 = 7\n\\boxed{7}", "3 + 4 = 7\n\\boxed{7}\nDone.",
             "3 + 4 = 7"]
    fmt = np.array([format_score(t, "boxed") for t in texts], np.float32)
    assert fmt.tolist() == [0.25, 1.0, 0.5, 0.0]
    assert format_bonus(fmt, texts, True).tolist() == [0.25, 1.0, 0.5, 0.0]
    assert format_bonus(fmt, texts, True, other_tag=False).tolist() == [0.0, 1.0, 0.5, 0.0]
    cfg, _ = parse_config(["--preset", "tiny", "--reward.other_tag_bonus", "false"])
    assert cfg.reward.other_tag_bonus is False
    assert parse_config(["--preset", "tiny"])[0].reward.other_tag_bonus is True


def test_working_is_asked_of_numeric_answers_only():
    """`format_needs_working` is an arithmetic rule: a one-word exact answer or a choice letter
    has no working to show, so its format bonus stands."""
    texts = ["Answer: B", "Answer: 7", "Answer: 7"]
    fmt = np.ones(3, dtype=np.float32)
    got = format_bonus(fmt, texts, True, verifiers=["choice", "numeric", None])
    assert got.tolist() == [1.0, 0.0, 0.0]
