"""Curriculum stages, promotion, EWC consolidation at boundaries, SENT entropy and ordering."""

import json
import math

import pytest
import torch

from common.config import ConfigError
from common.presets import get_preset
from common.state_io import load_state
from launch.driver.curriculum import (
    PROMOTION_WINDOW,
    Curriculum,
    answer_entropy,
    parse_stages,
    sent_order,
)
from launch.driver.trainer import Trainer
from learner.ewc import ewc_penalty


def cfg_with(stages: str, steps: int):
    cfg = get_preset("tiny")
    cfg.curriculum.stages, cfg.run.steps = stages, steps
    return cfg


def test_parse_stages_fills_the_last_stage_and_rejects_bad_specs():
    stages = parse_stages("arith:1:3,arith:2@0.9", cfg_with("", 10))
    assert [(s.task, s.level, s.steps, s.promote_at) for s in stages] == [
        ("arith", 1, 3, None), ("arith", 2, 7, 0.9)]
    for bad, msg in [("arith:x", "bad stage"), ("arith:4:2", "level 1-3"),
                     ("arith:1:20", "need 20 steps")]:
        with pytest.raises(ConfigError, match=msg):
            parse_stages(bad, cfg_with("", 10))


def test_stage_transitions_at_the_right_steps():
    cfg = cfg_with("arith:1:2,arith:2:3,arith:3:1", 6)
    cfg.curriculum.replay = 0.0  # each stage's own prompts only (replay: the test below)
    cur = Curriculum(cfg)
    got = [cur.prompts(k) for k in range(6)]
    assert [s for s, _ in got] == [0, 0, 1, 1, 1, 2]
    assert [p[0]["level"] for _, p in got] == [1, 1, 2, 2, 2, 3]
    # Within a stage the data cursor restarts at 0: the same prompts as a fresh stage-2 task.
    fresh = Curriculum(cfg_with("arith:2:6", 6))
    assert got[2][1] == fresh.prompts(0)[1]


def test_the_default_curriculum_replays_earlier_stages():
    """Replay is the default continual method (docs/results.md, "Forgetting"): with no flag, a later
    stage's steps hold some of the earlier stages' prompts; one stage has none to replay."""
    cur = Curriculum(cfg_with("arith:1:5,arith:2:100", 105))
    steps = [cur.prompts(k)[1] for k in range(105)]
    levels = [p["level"] for step in steps[5:] for p in step]
    assert 0.1 < levels.count(1) / len(levels) < 0.4
    one = Curriculum(cfg_with("arith:2:20", 20))
    assert all(p["level"] == 2 for k in range(20) for p in one.prompts(k)[1])


def test_replay_mixes_earlier_stages_prompts_at_the_asked_rate_and_resumes_the_same():
    cfg = cfg_with("arith:1:10,arith:2:200", 210)
    cfg.rollout.prompts_per_step, cfg.curriculum.replay = 4, 0.25
    cur = Curriculum(cfg)
    got = [cur.prompts(k)[1] for k in range(210)]
    assert all(p["level"] == 1 for step in got[:10] for p in step)  # nothing earlier to replay
    stage1 = {p["question"] for step in got[:10] for p in step}
    replayed = [p for step in got[10:] for p in step if p["level"] == 1]
    share = len(replayed) / (200 * 4)
    assert 0.20 < share < 0.30, share  # 800 Bernoulli(0.25) draws: 0.25 +- 3.5 sd
    assert {p["question"] for p in replayed} <= stage1  # prompts stage 1 trained on
    # a resumed curriculum (state after step 99) draws the same replay prompts after it
    again = Curriculum(cfg)
    for k in range(100):
        again.prompts(k)
    resumed = Curriculum(cfg)
    resumed.load_state_dict(json.loads(json.dumps(again.state_dict())))
    assert [resumed.prompts(k)[1] for k in range(100, 210)] == got[100:]
    cfg.curriculum.replay = 0.0
    plain = Curriculum(cfg)
    assert all(p["level"] == 2 for k in range(210) for p in plain.prompts(k)[1] if k >= 10)


def test_promotion_rule_advances_early():
    cur = Curriculum(cfg_with("arith:1:50@0.8,arith:2", 100))
    for k in range(PROMOTION_WINDOW):
        assert cur.prompts(k)[0] == 0
        cur.observe(0.9)
    assert cur.prompts(PROMOTION_WINDOW)[0] == 1
    state = cur.state_dict()
    again = Curriculum(cfg_with("arith:1:50@0.8,arith:2", 100))
    again.load_state_dict(state)
    assert again.prompts(PROMOTION_WINDOW + 1) == cur.prompts(PROMOTION_WINDOW + 1)


def test_ewc_pulls_toward_the_anchor_to_the_known_optimum():
    # minimise 1/2 (theta - b)^2 + lam/2 F (theta - a)^2: optimum (b + lam F a) / (1 + lam F).
    a, b, lam, fisher = 1.0, 5.0, 3.0, 2.0
    theta = torch.tensor([b], requires_grad=True)
    opt = torch.optim.SGD([theta], lr=0.05)
    for _ in range(500):
        opt.zero_grad()
        loss = 0.5 * (theta - b).pow(2).sum() + ewc_penalty(
            {"w": theta}, {"w": torch.tensor([a])}, {"w": torch.tensor([fisher])}, lam)
        loss.backward()
        opt.step()
    assert theta.item() == pytest.approx((b + lam * fisher * a) / (1 + lam * fisher), abs=1e-4)


def test_answer_entropy_on_hand_built_clusters():
    assert answer_entropy(["4", "4", "4", "4"]) == 0.0
    assert answer_entropy(["4", "5", "4", "5"]) == pytest.approx(math.log(2))
    assert answer_entropy(["1", "2", "3", "4"]) == pytest.approx(math.log(4))
    # unparsed answers never agree with each other
    assert answer_entropy([None, None]) == pytest.approx(math.log(2))
    assert sent_order([0.5, 0.0, 0.5, 1.2]) == [1, 0, 2, 3]  # stable on ties



def test_curriculum_run_consolidates_at_the_boundary(run_job, tmp_path):
    cfg = cfg_with("arith:1:2,arith:2:2", 4)
    cfg.ewc.lam = 100.0
    cfg.run.checkpoint_every = 3  # one checkpoint, after the boundary
    _, rows, _ = run_job(cfg, tmp_path)
    assert [r["curriculum/stage"] for r in rows] == [0, 0, 1, 1]
    assert "ewc/fisher_sum" in rows[2] and "ewc/fisher_sum" not in rows[1]
    assert rows[2]["ewc/fisher_sum"] > 0
    assert rows[1]["loss/ewc"] == 0.0  # no anchor yet in stage 0
    # The anchor and Fisher are the learner's state from the boundary on, and a checkpoint
    # keeps them (test_learner checks the penalty itself once the policy moves).
    tensors, meta = load_state(str(tmp_path / "ckpt-000003"), "learner")
    assert meta["fisher"] and sorted(meta["fisher"]) == sorted(meta["params"])
    total = sum(float(tensors[f"fisher.{n}"].sum()) for n in meta["fisher"])
    assert total == pytest.approx(rows[2]["ewc/fisher_sum"], rel=1e-5)


def test_sent_order_is_computed_on_workers_and_cached(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("HOMERL_CACHE", str(tmp_path / "cache"))
    cfg = cfg_with("", 2)
    cfg.curriculum.sent, cfg.curriculum.sent_pool, cfg.curriculum.sent_samples = True, 6, 3

    def order(run):
        trainer = Trainer(cfg, str(tmp_path / run))
        try:
            return trainer.curriculum.orders[0]
        finally:
            trainer.shutdown()

    first = order("a")
    assert sorted(first) == list(range(6))
    (cached,) = (tmp_path / "cache" / "sent").glob("*.json")
    # A second run must read the cache, not recompute: give the cache an order no sampling
    # would produce and expect it back.
    entry = json.loads(cached.read_text())
    entry["order"] = first[::-1]
    cached.write_text(json.dumps(entry))
    assert order("b") == first[::-1]
