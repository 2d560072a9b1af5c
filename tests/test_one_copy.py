"""One-copy mode (rollout.engine=learner, launch/driver/one_copy.py): the learner's own model
samples the rollouts, on-policy, and the run works as every other layout does (Ray, checkpoints,
resume, a killed learner restored). The tiny model is the hostile Qwen2 of test_onpolicy.py:
its generation_config.json carries a repetition penalty and a top-k that must not leak."""

import json
import os
import signal

import numpy as np
import pytest
import ray
import torch

from actors.weights import WeightVersionError
from common.types import RolloutCall, Sampling
from launch.driver.one_copy import OneCopy
from learner.advantages import plan_step
from tests.test_onpolicy import PROMPTS, G, make_cfg, typicality_z


def one_copy_cfg(path, mode="lora", kv_cache="auto"):
    cfg = make_cfg(path, engine="learner", mode=mode)
    cfg.rollout.kv_cache = kv_cache
    return cfg


def step(one: OneCopy, seed: int):
    """Sample with random rewards (the tiny model earns none), then the learner's step."""
    batch = one.generate(RolloutCall(PROMPTS, G, Sampling(seed=seed)))
    rng = np.random.default_rng(seed)
    rewards = rng.random(len(batch.rewards)).astype(np.float32)
    batch = type(batch)(**{**batch.__dict__, "rewards": rewards})
    plan, _ = plan_step(batch.summary(), one.cfg)
    return batch, one.train_step(plan, batch)


@pytest.mark.parametrize("mode", ["lora", "qlora"])
def test_the_learners_own_model_samples_on_policy_with_one_copy(hostile_qwen2, mode):
    one = OneCopy(one_copy_cfg(hostile_qwen2, mode))
    assert one.sampler.model is one.learner.model  # one copy: the sampler holds no model
    assert one.sampler.weights is None
    n_params = sum(p.numel() for p in one.learner.model.parameters())
    for s in range(3):  # LoRA B moves off 0 after the first step: the adapters are sampled
        batch, learned = step(one, s)
        assert batch.version == s and learned.version == s + 1
        assert learned.staleness == 0 and learned.active_seqs > 0
        assert 0 <= learned.logp_diff < 1e-3 and learned.logp_diff_max < 1e-2, learned
    assert one.learner.model.training  # back in train mode after each generate
    assert sum(p.numel() for p in one.learner.model.parameters()) == n_params
    z = typicality_z(one.learner, batch)  # the model's own repetition penalty did not leak
    assert abs(z) < 4.5, z


def test_pushes_carry_no_tensors_and_only_the_learners_version_is_served(hostile_qwen2):
    one = OneCopy(one_copy_cfg(hostile_qwen2))
    update = one.export()
    assert update.kind == "live" and update.tensors == {} and update.version == 0
    assert one.set_weights(update, 0) == 0
    step(one, 0)
    assert one.ping()["version"] == 1
    with pytest.raises(WeightVersionError, match="learner's own weights"):
        one.set_weights(update, 0)  # no other copy exists to serve version 0 from
    assert one.set_weights(one.export(), 1) == 1


def test_the_prefill_runs_the_lm_head_on_one_position_per_row(hostile_qwen2):
    """generate asks the model for the last position's logits only (logits_to_keep): a
    prefill of 16 x 512 tokens would otherwise make 16 x 512 x 151,936 fp32 logits (5 GB)."""
    one = OneCopy(one_copy_cfg(hostile_qwen2))
    widths = []
    head = one.learner.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, args, out: widths.append(args[0].shape[1]))
    try:
        one.generate(RolloutCall(PROMPTS, 2, Sampling(seed=0)))
    finally:
        hook.remove()
    assert widths and set(widths) == {1}, widths


def test_a_static_kv_cache_samples_what_the_dynamic_one_does(hostile_qwen2):
    """rollout.kv_cache=static (auto on a GPU: allocated once at the call's size) samples
    the same tokens with the same log-probs as the dynamic cache."""
    batches = {}
    for kind in ("static", "dynamic"):
        torch.manual_seed(0)
        one = OneCopy(one_copy_cfg(hostile_qwen2, kv_cache=kind))
        batches[kind] = one.generate(RolloutCall(PROMPTS, 4, Sampling(seed=3)))
    static, dynamic = batches["static"], batches["dynamic"]
    assert static.completion_ids == dynamic.completion_ids
    diff = max(float(np.abs(a - b).max()) for a, b in zip(static.logprobs, dynamic.logprobs))
    assert diff < 1e-4, diff  # the same sums, in another order


def test_a_one_copy_run_survives_a_killed_learner_and_resumes_through_ray(hostile_qwen2,
                                                                          tmp_path, ray_cluster,
                                                                          run_job):
    """One actor plays both roles; its death is the learner's: the run restores the last
    checkpoint and goes on, every step sampled by the newest weights, on-policy; then the
    finished run resumes for more steps."""
    from launch.driver.supervise import run_supervised
    from launch.driver.trainer import Trainer

    cfg = one_copy_cfg(hostile_qwen2)
    cfg.run.steps, cfg.run.checkpoint_every = 4, 2
    trainer = Trainer(cfg, str(tmp_path))
    assert trainer.pool.workers == [trainer.learner]  # one actor plays both roles
    pid = ray.get(trainer.learner.ping.remote())["pid"]
    original = trainer.step

    def step_then_kill(k):
        row = original(k)
        if k == 2:
            os.kill(pid, signal.SIGKILL)
        return row

    trainer.step = step_then_kill
    summary = run_supervised(trainer)
    assert summary["learner_restarts"] == 1 and summary["steps"] == 4
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["rollout/version"] for r in rows] == [0, 1, 2, 3]  # the newest weights each step
    for r in rows:
        assert r["policy/staleness"] == 0 and 0 <= r["policy/logp_diff"] < 1e-3, r
        assert r["memory/workers_rss_gb"] == 0  # the learner's process: counted once
    assert os.path.exists(tmp_path / "final" / "adapter_config.json")
    cfg.run.steps = 5
    _, rows, versions = run_job(cfg, tmp_path, resume=True)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4] and versions == [5]
