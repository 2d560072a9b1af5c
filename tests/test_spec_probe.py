"""tools.spec_probe on vLLM's CPU engine with a tiny random Llama: the n-gram speculative
setting reaches the engine and the probe's figures add up (the timings it prints on the real
model are in README, "Decode against the bandwidth bound")."""

import pytest


@pytest.mark.parametrize("draft", [2])
def test_speculative_rollout_calls_run_and_are_counted(tiny_vllm_llama, draft):
    from tools.spec_probe import isolated

    r = isolated(draft, calls=1, model=tiny_vllm_llama)  # in a child: numba stays out of here
    assert r["draft"] == draft and r["lo"] <= r["call_s"] <= r["hi"]
    assert 0 < r["tokens"] <= 16 * 40  # 16 completions of at most 40 tokens
    assert r["per_completion"] == pytest.approx(r["tokens"] / 16)
    assert 0 <= r["nan"] <= r["tokens"]
    assert r["tok_s"] == pytest.approx(r["tokens"] / r["call_s"])


def test_a_setting_that_fails_is_one_line_naming_it(tmp_path):
    from tools.spec_probe import isolated

    with pytest.raises(RuntimeError, match="--draft 1 failed"):
        isolated(1, calls=1, model=str(tmp_path / "no-such-model"))
