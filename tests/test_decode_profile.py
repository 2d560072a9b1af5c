"""tools.measure.decode_profile on the HF engine with a tiny random Llama (the vLLM path runs the
same `profile` on VLLMEngine; its engine is tested in test_vllm_worker)."""

import math

import pytest

from tools.measure.decode_profile import HFEngine, best_time, profile, prompt_ids


@pytest.fixture(scope="module")
def hf_tiny():
    from common.models import resolve_model

    return HFEngine(resolve_model("tiny-random-llama"), threads=1)


def test_rows_come_as_a_rollout_brings_them(hf_tiny):
    prompts, copies = prompt_ids(hf_tiny.tok, 16)
    assert (len(prompts), copies) == (2, 8)  # 2 prompts x G = 8
    prompts, copies = prompt_ids(hf_tiny.tok, 4)
    assert (len(prompts), copies) == (4, 1) and len(set(map(tuple, prompts))) == 4


def test_every_row_runs_the_fixed_length_and_the_figures_agree(hf_tiny):
    """EOS is masked until N tokens: the step time is (t_N - t_1) / (N - 1) of whole rows."""
    prompts, copies = prompt_ids(hf_tiny.tok, 8)
    assert hf_tiny.run(prompts, copies, 6) == 8 * 6
    (row,) = profile(hf_tiny, [8], new_tokens=4, repeats=1, bandwidth=10e9, weights=10**6,
                     kv_per_token=100.0, name="hf")
    # finite, not positive: a tiny model's step is ~1 ms, within timing noise on a busy machine
    assert row["batch"] == 8 and math.isfinite(row["step_ms"]) and row["step_ms"] != 0
    assert row["decode_tok_s"] == pytest.approx(8 / (row["step_ms"] / 1e3))
    assert row["bound_tok_s"] < 8 * 10e9 / 10**6  # the KV bytes take some of it
    assert row["of_bound"] == pytest.approx(row["decode_tok_s"] / row["bound_tok_s"])
    assert row["bound_tok_s"] == row["memory_bound_tok_s"]  # no compute roof given
    # a compute roof below the memory bound is the bound
    (low,) = profile(hf_tiny, [8], new_tokens=4, repeats=1, bandwidth=10e9, weights=10**6,
                     kv_per_token=100.0, name="hf", compute_tok_s=5.0)
    assert low["bound_tok_s"] == 5.0 < low["memory_bound_tok_s"]
    assert low["of_bound"] == pytest.approx(low["decode_tok_s"] / 5.0)


def test_the_compute_roof_is_two_flops_per_weight_per_token():
    from tools.measure.roofline import compute_bound, gemm_rate

    assert compute_bound(2e9, 10**6) == pytest.approx(1000.0)
    rate = gemm_rate(1, n=128, repeats=2)
    assert 1e6 < rate < 1e14  # FLOP/s of a real product on this machine, whatever it is


def test_a_row_that_stops_early_is_an_error():
    class Short:
        def run(self, prompts, copies, new_tokens):
            return len(prompts) * copies * new_tokens - 1

    with pytest.raises(RuntimeError, match="stopped early"):
        best_time(Short(), [[1, 2]], 8, 4, repeats=1)


def test_the_op_breakdown_names_the_matrix_products_and_leaves_python_last(hf_tiny):
    """--ops: one profiled call; the shares are of that call's wall time (so they and the
    Python remainder sum to ~1), and a decoder's time is in its matrix products."""
    from tools.measure.decode_profile import op_shares

    rows = op_shares(hf_tiny, 8, new_tokens=4, top=6)
    assert len(rows) == 7 and rows[-1]["op"] == "python"
    ops = rows[:-1]
    assert [r["ms_per_step"] for r in ops] == sorted((r["ms_per_step"] for r in ops),
                                                     reverse=True)
    assert all(r["calls"] > 0 and 0 < r["share"] < 1 for r in ops)
    assert sum(r["share"] for r in rows) <= 1.0 + 1e-6
    assert any(r["op"] in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear")
               for r in ops), [r["op"] for r in ops]
