"""tools.compare.plain_loop: `--order trl` gives ours' learner the problems in the order TRL's
GRPOTrainer draws them (its RepeatSampler, shuffled with the run's seed); `stream` is ours'."""

import pytest

pytest.importorskip("trl")


@pytest.mark.parametrize("seed", [0, 7])
def test_trl_order_is_trls_sampler_draw(seed):
    from trl.trainer.utils import RepeatSampler

    from tools.compare.plain_loop import problem_order

    sampler = RepeatSampler(list(range(4000)), mini_repeat_count=1, batch_size=2, seed=seed)
    assert problem_order(seed, "trl") == list(sampler)
    assert problem_order(seed, "trl") != problem_order(seed + 1, "trl")
    assert problem_order(seed, "stream") == list(range(4000))
