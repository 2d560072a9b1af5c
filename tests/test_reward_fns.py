"""Reward functions in TRL's convention (`reward.fn`): loading, the call's arguments, what a
function may return, failures contained in the verifier process, weights and None, the
unscorable rule in the advantages, a bad spec refused before any actor, and tiny runs that
train on a TRL-style reward file, plain and chat."""

import json
import logging
import math

import numpy as np
import pytest
from conftest import own_lines

from common.config import RewardConfig
from common.types import RolloutSummary
from learner.advantages import group_advantages, zero_std_fraction
from rewards.fnbatch import (
    NO_REFERENCE,
    RewardFns,
    builtin_scores,
    check_reward_fns,
    verify_samples,
)
from rewards.sandbox.pool import VerifierPool
from rewards.userfns import TrainerState, as_scores, batch_kwargs, combine, fn_names, sample_columns

# The functions as a TRL user writes them (TRL's docs: `def reward_func(completions, **kwargs)`).
MYMOD = '''
import time


def reward_len(prompts, completions, completion_ids, trainer_state, answer, source,
               **kwargs):
    assert len(prompts) == len(completions) == len(completion_ids) == len(answer) == len(source)
    assert all(isinstance(p, str) for p in prompts), prompts
    assert all(isinstance(c, str) for c in completions), completions
    assert all(isinstance(t, int) for ids in completion_ids for t in ids)
    assert set(source) == {"mine"} and trainer_state.max_steps == 2
    assert trainer_state.global_step >= 0
    kwargs["log_metric"]("batch_size", len(completions))
    kwargs["log_extra"]("note", ["x"] * len(completions))
    return [len(c) / 100 for c in completions]


def reward_len_chat(prompts, completions, **kwargs):
    assert all(p[-1]["role"] == "user" for p in prompts), prompts
    return [len(c[0]["content"]) / 100 for c in completions]


def boom(completions, **kwargs):
    raise RuntimeError("boom in the user's code")


def hang(completions, **kwargs):
    time.sleep(600)


def short(completions, **kwargs):
    return [1.0]


def text(completions, **kwargs):
    return ["high"] * len(completions)


def half(completions, **kwargs):
    return [None if i % 2 else 1.0 for i in range(len(completions))]


def never(completions, **kwargs):
    return [None] * len(completions)


def hog(completions, **kwargs):
    block = bytearray(8 * 2**30)
    return [float(len(block))] * len(completions)


async def later(completions, **kwargs):
    return [2.0] * len(completions)


def huge(completions, **kwargs):  # finite as a Python float, inf as the rewards' float32
    return [1e39 if i % 2 else 0.5 for i in range(len(completions))]


def big(completions, **kwargs):  # finite as a float32; times a weight of 1e30 it is not
    return [1e10 if i % 2 else -1.0 for i in range(len(completions))]


def gen_breaks(completions, **kwargs):  # a generator that raises once it is consumed
    def rewards():
        yield 1.0
        raise RuntimeError("the generator broke midway")
    return rewards()
'''


@pytest.fixture
def mymod(tmp_path, monkeypatch):
    """`mymod` in tmp_path, on sys.path (a spawned verifier process inherits it)."""
    (tmp_path / "mymod.py").write_text(MYMOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def plain_samples(n=4):
    return [{"question": "2 + 3?", "answer": "5", "columns": {"answer": 5, "source": "mine"}}
            for _ in range(n)]


# -- the convention, on hand-built inputs ----------------------------------------------------

def test_weights_and_none_combine_as_trl_does():
    scores = np.array([[1.0, 0.5],          # both apply: 2 * 1 + 0.5 * 0.5
                       [np.nan, 0.5],       # one applies: its weighted reward alone
                       [np.nan, np.nan],    # none applies: unscorable, NaN
                       [0.0, np.nan]])
    out = combine(scores, [2.0, 0.5])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[[0, 1, 3]], [2.25, 0.25, 0.0])
    assert math.isnan(out[2])


@pytest.mark.parametrize("out, want", [
    ([1, 2.5, True, None], [1.0, 2.5, 1.0, None]),
    (np.array([0.5, np.nan, -1.0, 2.0], dtype=np.float32), [0.5, None, -1.0, 2.0]),
    ((x for x in [np.float64(1), np.int64(2), 0.0, None]), [1.0, 2.0, 0.0, None]),
])
def test_outputs_that_are_rewards(out, want):
    assert as_scores(out, 4) == (want, "")


@pytest.mark.parametrize("out, why", [
    ([1.0], "returned 1 rewards for 4 completions"),
    (["1", 2, 3, 4], "reward 0 is a str"),
    ([1, 2, float("inf"), 4], "reward 2 is inf"),
    ([1, 1e39, 3, 4], "reward 1 is 1e+39, not finite as a float32"),
    (np.array([1, 2, 3, -1e300]), "reward 3 is -1e+300, not finite as a float32"),
    ("1234", "returned a str"),
    (3.0, "returned a float"),
    ({"a": 1}, "returned a dict"),
])
def test_outputs_that_are_not(out, why):
    scores, got = as_scores(out, 4)
    assert scores is None and why in got


def test_call_arguments_plain_chat_and_columns():
    chat = {"question": "hi", "answer": "", "messages": [{"role": "user", "content": "hi"}],
            "columns": {"lang": "en", "completions": "dropped: a reserved name"}}
    arith = {"question": "1 + 1", "answer": "2"}  # a built-in task's sample: no columns
    kw = batch_kwargs([plain_samples(1)[0], chat, arith], ["a", "b", "c"], [[1], [2, 3], []],
                      TrainerState(3, 10))
    assert kw["prompts"] == ["2 + 3?", [{"role": "user", "content": "hi"}], "1 + 1"]
    assert kw["completions"] == ["a", [{"role": "assistant", "content": "b"}], "c"]
    assert kw["completion_ids"] == [[1], [2, 3], []]
    assert kw["answer"] == [5, None, "2"] and kw["source"] == ["mine", None, None]
    assert kw["lang"] == [None, "en", None]
    assert kw["trainer_state"].global_step == 3 and kw["trainer_state"].max_steps == 10
    assert list(sample_columns([chat])) == ["lang"]


def test_names_are_the_functions_made_unique():
    assert fn_names(["a:score", "b.c:score", "numeric", "d:f", "e:score"]) == [
        "score", "score_2", "numeric", "f", "score_3"]


# -- failures are contained in the verifier process ------------------------------------------

def test_each_failure_gets_its_own_code_and_the_pool_goes_on(mymod):
    kw = batch_kwargs(plain_samples(), ["a", "bb", "ccc", "dddd"], [[1]] * 4,
                      TrainerState(0, 2))
    with VerifierPool() as pool:
        got = {name: pool.call_fn(f"mymod:{name}", kw, 1.5) for name in
               ["reward_len", "boom", "hang", "short", "text", "hog", "later", "nope"]}
        again = pool.call_fn("mymod:reward_len", kw, 1.5)  # a fresh worker after hang and hog
        assert pool.starts >= 3
    assert got["reward_len"].scores == [0.01, 0.02, 0.03, 0.04] and not got["reward_len"].error
    assert got["reward_len"].logged == {"batch_size": [4.0]}
    assert got["later"].scores == [2.0] * 4  # async, as TRL allows
    want = {"boom": "fn_error", "hang": "fn_timeout", "short": "fn_bad_output",
            "text": "fn_bad_output", "hog": "out_of_memory", "nope": "fn_error"}
    assert {k: got[k].error for k in want} == want
    assert got["boom"].why == "RuntimeError: boom in the user's code"
    assert "Traceback" in got["boom"].trace and "raise RuntimeError" in got["boom"].trace
    assert "has no function nope" in got["nope"].why
    assert again.scores == [0.01, 0.02, 0.03, 0.04]


def test_reward_fns_weights_failures_builtins_and_one_log_per_function(mymod, caplog):
    fns = RewardFns(["mymod:reward_len", "mymod:boom", "numeric", "mymod:half"],
                    [1.0, 5.0, 2.0, 0.5], timeout_s=5.0)
    samples = plain_samples()
    texts = ["Answer: 5", "Answer: 4", "no", "5"]
    with VerifierPool() as pool, caplog.at_level(logging.WARNING, "homerl.rewards"):
        verified = verify_samples(pool, samples, texts, 2.0)
        first = fns.score(pool, samples, texts, [[1]] * 4, verified, TrainerState(0, 2), 2.0)
        fns.score(pool, samples, texts, [[1]] * 4, verified, TrainerState(1, 2), 2.0)
    right = [1.0, 0.0, 0.0, 1.0]
    assert first.per_fn["numeric"] == right and first.per_fn["boom"] == [0.0] * 4
    assert first.per_fn["half"] == [1.0, None, 1.0, None]
    want = [len(t) / 100 + 2 * r + (0.5 if i % 2 == 0 else 0.0)
            for i, (t, r) in enumerate(zip(texts, right))]
    np.testing.assert_allclose(first.rewards, want, rtol=1e-6)
    assert first.errors == {"fn_error": 4} and first.logged == {"batch_size": [4.0]}
    logged = [r.getMessage() for r in caplog.records if "boom" in r.getMessage()]
    assert len(logged) == 1 and "reward/error_fn_error" in logged[0]
    assert "RuntimeError: boom in the user's code" in logged[0] and "Traceback" in logged[0]


def test_a_builtin_verifier_as_a_function(mymod):
    samples = [{"question": "q", "answer": "Paris", "verifier": "exact"},
               {"question": "q", "answer": "5"},  # numeric: its own result is reused
               {"question": "q", "answer": ""}]   # no reference: not applicable
    texts = ["Answer: Paris", "Answer: 5.0", "Answer: 5"]  # 5.0: numeric, not exact
    with VerifierPool() as pool:
        verified = verify_samples(pool, samples, texts, 2.0)
        assert verified[2] is NO_REFERENCE
        assert [v.score for v in verified[:2]] == [1.0, 1.0]
        assert builtin_scores(pool, "exact", samples, texts, verified, 2.0) == [1.0, 0.0, None]
        assert builtin_scores(pool, "numeric", samples, texts, verified, 2.0) == [0.0, 1.0,
                                                                                  None]


def test_an_all_none_completion_is_unscorable(mymod):
    fns = RewardFns(["mymod:never", "mymod:half"], [1.0, 1.0], timeout_s=5.0)
    samples = plain_samples()
    with VerifierPool() as pool:
        got = fns.score(pool, samples, ["a"] * 4, [[1]] * 4, [NO_REFERENCE] * 4,
                        TrainerState(0, 2), 2.0)
    assert got.rewards[0] == 1.0 and math.isnan(got.rewards[1]) and got.errors == {}


def score_with(pool, specs, weights, texts=("a", "bb", "ccc", "dddd")):
    fns = RewardFns(list(specs), list(weights), timeout_s=5.0)
    return fns.score(pool, plain_samples(len(texts)), list(texts), [[1]] * len(texts),
                     [NO_REFERENCE] * len(texts), TrainerState(0, 2), 2.0)


def test_a_reward_beyond_float32_is_bad_output_never_an_infinite_reward(mymod):
    """1e39 is finite as a Python float and inf as the rewards' float32: the call is
    fn_bad_output (0 for that function, counted), the other function's rewards stand."""
    with VerifierPool() as pool:
        got = score_with(pool, ["mymod:reward_len", "mymod:huge"], [1.0, 1.0])
    assert np.isfinite(got.rewards).all()
    np.testing.assert_allclose(got.rewards, [0.01, 0.02, 0.03, 0.04], rtol=1e-6)
    assert got.per_fn["huge"] == [0.0] * 4 and got.errors == {"fn_bad_output": 4}


@pytest.mark.parametrize("specs, weights, want", [
    (["mymod:big"], [1e30], [-1e30, 0.0, -1e30, 0.0]),             # 1e10 x 1e30 = inf
    (["mymod:big", "mymod:big"], [1e30, -1e30], [0.0] * 4),         # inf - inf = NaN
])
def test_a_weighted_sum_that_is_not_finite_gives_0_counted(mymod, caplog, specs, weights, want):
    """Each function's rewards are finite, their weighted sum is not (float32): that
    completion's reward is 0, counted as fn_bad_output, and the first time is logged; an
    overflow to NaN is not mistaken for an unscorable completion."""
    with VerifierPool() as pool, caplog.at_level(logging.WARNING, "homerl.rewards"):
        got = score_with(pool, specs, weights)
    assert np.isfinite(got.rewards).all() and got.rewards.dtype == np.float32
    np.testing.assert_allclose(got.rewards, want, rtol=1e-6)
    assert got.errors == {"fn_bad_output": 2}
    assert got.per_fn["big"] == [-1.0, 1e10, -1.0, 1e10]  # what the function returned
    said = [r.getMessage() for r in caplog.records if "reward.weights" in r.getMessage()]
    assert len(said) == 1 and "reward/error_fn_bad_output" in said[0]


def test_a_generator_that_raises_is_fn_error_and_the_verifier_process_lives_on(mymod, caplog):
    """A function may return a generator; one that raises once consumed is the function's
    fault like any exception: fn_error with its traceback logged, in the same verifier
    process, which then scores the next batch."""
    with VerifierPool() as pool, caplog.at_level(logging.WARNING, "homerl.rewards"):
        broken = score_with(pool, ["mymod:gen_breaks"], [1.0])
        pid = pool.pid
        fine = score_with(pool, ["mymod:reward_len"], [1.0])
        assert pid is not None and pool.pid == pid and pool.starts == 1
    assert broken.rewards.tolist() == [0.0] * 4 and broken.errors == {"fn_error": 4}
    np.testing.assert_allclose(fine.rewards, [0.01, 0.02, 0.03, 0.04], rtol=1e-6)
    said = [r.getMessage() for r in caplog.records if "gen_breaks" in r.getMessage()]
    assert len(said) == 1 and "RuntimeError: the generator broke midway" in said[0]
    assert "Traceback" in said[0] and "in rewards" in said[0]  # the generator's own frame


# -- metrics and advantages ------------------------------------------------------------------

def summary(rewards, fn_scores, fn_errors=None, errors=None, logged=None):
    n = len(rewards)
    return RolloutSummary(
        rewards=np.array(rewards, dtype=np.float32), correct=np.zeros(n, np.float32),
        format_score=np.zeros(n, np.float32), lengths=np.ones(n, np.int64),
        finish_reasons=["stop"] * n, prompt_index=[i // 2 for i in range(n)],
        reward_errors=errors or [None] * n, answers=[None] * n, sample_texts=[], version=0,
        num_prompts=n // 2, fn_scores=fn_scores, fn_errors=fn_errors or {},
        fn_logged=logged or {})


def test_step_metrics_per_function_errors_and_unscorable():
    a = summary([0.5, float("nan")], {"f": [0.5, None], "g": [0.0, None]}, {"fn_error": 2},
                errors=["no_answer", None], logged={"m": [1.0]})
    b = summary([1.5, 2.5], {"f": [1.5, 2.5], "g": [0.0, 0.0]}, {"fn_error": 2,
                                                                  "fn_timeout": 2},
                logged={"m": [3.0]})
    m = RolloutSummary.concat([a, b]).metrics()
    assert m["reward/mean"] == pytest.approx(1.5)  # the unscorable one left out
    assert m["reward/fn/f"] == pytest.approx(1.5) and m["reward/fn/g"] == 0.0
    assert m["reward/error_fn_error"] == 4 and m["reward/error_fn_timeout"] == 2
    assert m["reward/error_no_answer"] == 1 and m["reward/errors"] == 7
    assert m["reward/unscorable"] == 1 and m["reward/logged/m"] == 2.0
    plain = summary([1.0, 0.0], {}).metrics()  # without reward.fn: no new keys
    assert not [k for k in plain if k.startswith(("reward/fn/", "reward/unscorable"))]


def test_unscorable_completions_leave_the_baseline_and_get_no_advantage():
    nan = float("nan")
    rewards = np.array([[1.0, nan, 3.0, nan],     # baseline of 1 and 3 only
                        [nan, nan, nan, nan],     # nothing scorable
                        [2.0, nan, nan, nan],     # one scorable: no signal
                        [1.0, 1.0, nan, 1.0],     # flat among the scorable
                        [0.0, 1.0, 2.0, 3.0]], dtype=np.float32)
    adv = group_advantages(rewards, scale="std")
    assert adv.dtype == np.float32 and np.isfinite(adv).all()
    s = np.std([1.0, 3.0], ddof=1)
    np.testing.assert_allclose(adv[0], [-1 / (s + 1e-4), 0, 1 / (s + 1e-4), 0], rtol=1e-5)
    assert (adv[1:4] == 0).all()
    np.testing.assert_allclose(adv[4], group_advantages(rewards[4:], scale="std")[0])
    np.testing.assert_allclose(group_advantages(rewards, scale="none")[0], [-1, 0, 1, 0])
    assert zero_std_fraction(rewards) == pytest.approx(3 / 5)


def test_unscorable_rule_matches_trl_s_arithmetic():
    """TRL's GRPOTrainer: nanmean and its nanstd over the group, then nan_to_num(0)."""
    torch = pytest.importorskip("torch")
    from trl.trainer.utils import nanstd

    rng = np.random.default_rng(0)
    r = rng.normal(size=(6, 8)).astype(np.float32)
    r[rng.random(r.shape) < 0.3] = np.nan
    t = torch.tensor(r)
    trl = (t - torch.nanmean(t, dim=1, keepdim=True)) / (nanstd(t, dim=1).unsqueeze(1) + 1e-4)
    trl = torch.nan_to_num(trl, nan=0.0).numpy()
    np.testing.assert_allclose(group_advantages(r, scale="std"), trl, rtol=1e-4, atol=1e-5)


# -- a bad spec stops the run before any actor -----------------------------------------------

@pytest.mark.parametrize("spec, want", [
    ("nomod:score", "reward.fn: nomod:score: module nomod not found (cwd "),
    ("mymod:nope", "reward.fn: mymod:nope: module mymod ("),
    ("broken:f", "reward.fn: broken:f: importing broken failed: NameError: name "),
])
def test_a_bad_spec_is_one_line_before_any_actor(mymod, monkeypatch, capsys, spec, want):
    import launch.train as train
    from launch.driver import trainer

    (mymod / "broken.py").write_text("x = undefined_name\n")
    monkeypatch.setattr(trainer, "connect", lambda cfg: pytest.fail("an actor would start"))
    capsys.readouterr()
    assert train.main(["--preset", "tiny", "--reward.fn", f"numeric,{spec}",
                       "--run-dir", str(mymod / "run")]) == 2
    err = capsys.readouterr().err
    ours = own_lines(err, "launch.train")
    assert len(ours) == 1 and ours[0].startswith(f"launch.train: error: {want}"), err
    assert "Traceback" not in err and not (mymod / "run" / "metrics.jsonl").exists()


def test_check_passes_good_specs_and_builtins(mymod):
    check_reward_fns(RewardConfig(fn="mymod:reward_len,exact,mymod:boom"))  # imports: fine


# -- end to end: a TRL reward file trains a tiny run through the real workers ---------------

def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_data(path, chat: bool):
    rows = []
    for i in range(24):
        q = f"What is {i} + {i % 5}?"
        prompt = [{"role": "user", "content": q}] if chat else q
        rows.append({"prompt": prompt, "answer": i + i % 5, "source": "mine"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_trl_reward_file_trains_plain_and_chat_runs_unchanged(tmp_path, monkeypatch,
                                                                own_ray):
    """The user's project dir is the cwd (as under `ray job submit --working-dir .`): Ray puts
    it on the workers' path, and the verifier process imports `mymod` from there."""
    from launch.train import main

    (tmp_path / "mymod.py").write_text(MYMOD)
    monkeypatch.chdir(tmp_path)
    common = ["--preset", "tiny", "--steps", "2", "--curriculum.task", "file",
              "--curriculum.heldout_size", "4", "--run.sample_every", "1",
              "--reward.fn_timeout_s", "2"]
    plain = tmp_path / "plain"  # two workers: samples.jsonl gets all 8 completions of a step
    assert main([*common, "--rollout.num_workers", "2",
                 "--curriculum.data_path", write_data(tmp_path / "p.jsonl", False),
                 "--reward.fn", "mymod:reward_len,mymod:boom,mymod:hang,mymod:short",
                 "--reward.weights", "1,1,1,1", "--run-dir", str(plain)]) == 0
    metrics, samples = rows_of(plain / "metrics.jsonl"), rows_of(plain / "samples.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:  # 2 prompts x G=4 completions a step; each failing function: 0 on all 8
        assert m["reward/error_fn_error"] == 8 and m["reward/error_fn_timeout"] == 8
        assert m["reward/error_fn_bad_output"] == 8
        assert m["reward/fn/boom"] == m["reward/fn/hang"] == m["reward/fn/short"] == 0.0
        assert m["reward/logged/batch_size"] == 4.0 and m["reward/unscorable"] == 0
        step = [s for s in samples if s["step"] == m["step"]]
        assert len(step) == 8  # every completion: 2 workers x SAMPLE_ROWS
        want = np.mean([len(s["completion"]) / 100 for s in step])
        assert m["reward/mean"] == pytest.approx(want, abs=1e-6)
        assert m["reward/fn/reward_len"] == pytest.approx(want, abs=1e-6)
    for s in samples:
        assert s["reward"] == pytest.approx(len(s["completion"]) / 100, abs=1e-6)
        assert s["fn"] == {"reward_len": pytest.approx(len(s["completion"]) / 100),
                           "boom": 0.0, "hang": 0.0, "short": 0.0}
    chat = tmp_path / "chat"
    assert main([*common, "--curriculum.data_path", write_data(tmp_path / "c.jsonl", True),
                 "--reward.fn", "mymod:reward_len_chat", "--run-dir", str(chat)]) == 0
    for m in rows_of(chat / "metrics.jsonl"):
        assert "reward/error_fn_error" not in m and "reward/fn/reward_len_chat" in m
    for s in rows_of(chat / "samples.jsonl"):
        assert s["reward"] == pytest.approx(len(s["completion"]) / 100, abs=1e-6)
