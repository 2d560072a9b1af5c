"""tools.compare.replay_trl: TRL's GRPOTrainer trains a few steps on a tiny random Llama, and
ours' learner, given TRL's batches in order from TRL's LoRA initialisation, ends each step where
TRL did, a step with no reward spread included (`python -m tools.compare.replay_trl` runs it on
the cpu-demo model)."""

import pytest
import torch

pytest.importorskip("trl")


def flat(tensors: dict, names: list[str]) -> torch.Tensor:
    return torch.cat([tensors[n].flatten().double() for n in names])


def test_ours_follows_trl_step_by_step_through_a_step_with_no_reward_spread(tmp_path):
    from common.presets import get_preset
    from tools.compare.replay_trl import record_trl, replay_ours

    cfg = get_preset("tiny")
    cfg.grpo.entropy_rho = 1.0  # every token, as TRL's default
    calls = []

    def reward(prompts, completions, **kwargs):  # spread, except on the second step
        calls.append(1)
        if len(calls) == 2:
            return [0.0] * len(completions)
        return [float(len(c) % 3) for c in completions]

    init, batches, trl_after = record_trl(cfg, 0, 3, str(tmp_path), reward)
    assert len(batches) == 3 and not batches[1].advantages.any()
    assert batches[0].advantages.any() and batches[2].advantages.any()
    ours_after = replay_ours(cfg, init, batches)
    names = sorted(init)
    start = flat(init, names)
    for t, o in zip(trl_after, ours_after):
        moved_trl, moved_ours = flat(t, names) - start, flat(o, names) - start
        assert float((moved_ours - moved_trl).norm() / moved_trl.norm()) < 1e-2
    # TRL moved on the step without spread (AdamW's momentum), and so did ours
    assert not torch.equal(flat(trl_after[1], names), flat(trl_after[0], names))
