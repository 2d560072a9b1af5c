"""tools.compare.time_to_accuracy's arithmetic: when a run is scored, the interpolated time to
target, and the reward TRL gets (ours for the cpu-demo preset, the format bonus only after
working)."""

import json

import pytest
from conftest import without_ray

from tools.compare.time_to_accuracy import MARKS, Scorer, trl_reward
from tools.compare.tta_report import censored_median, time_to_target


def scorer(target=0.5, budget_s=200.0):
    return Scorer([], target, budget_s, 8)


def test_marks_stop_at_the_budget_and_each_is_used_once():
    s = scorer(budget_s=100.0)
    assert s.marks == [m for m in MARKS if m < 100] + [100.0]
    assert s.marks[0] == 15 and not s.due(14.9) and s.due(15.0)
    assert not s.record(65.0, 9, 0.1)  # below target, marks left: go on
    assert s.marks == [75, 90, 100.0] and not s.due(70.0) and s.due(76.0)
    assert s.record(95.0, 12, 0.6)  # the target: stop
    assert scorer(budget_s=40.0).record(41.0, 5, 0.1)  # the budget spent: stop


def test_time_to_target_interpolates_from_the_point_before():
    curve = [(30.0, 4, 0.20), (60.0, 8, 0.25), (90.0, 12, 0.35), (120.0, 16, 0.40)]
    assert time_to_target(curve, 0.30, base=0.20) == pytest.approx(75.0)  # 0.25 -> 0.35
    # reached at the first point: from the base model at 0 s, 0.20 -> 0.40 over 30 s
    assert time_to_target([(30.0, 4, 0.40)], 0.30, base=0.20) == pytest.approx(15.0)
    assert time_to_target([(30.0, 4, 0.40)], 0.30, base=0.45) == 30.0  # no slope: the point
    assert time_to_target([(30.0, 4, 0.20), (60.0, 8, 0.29)], 0.30, base=0.2) is None
    # 82 of 200 right reaches base 42/200 + 20 points, though 0.21 + 0.2 > 0.41 in floats
    reached = time_to_target([(30.0, 4, 0.39), (60.0, 8, 82 / 200)], 0.21 + 0.2, base=0.21)
    assert reached == pytest.approx(60.0)


def test_trl_gets_our_reward_with_the_bonus_only_after_working():
    reward = trl_reward(0.5)
    texts = ["3 + 4 = 7\nAnswer: 7", "Answer: 7", "3 + 4 = 8\nAnswer: 8", "so 7"]
    assert reward(None, texts, ["7"] * 4) == [1.5, 1.0, 0.0, 1.0]  # false working: no bonus


def test_a_run_that_missed_the_target_counts_as_the_slowest_in_the_median():
    assert censored_median([20.0, None, 30.0]) == 30.0  # not 25: the miss is the longest
    assert censored_median([20.0, None, None]) is None  # the median run never reached it
    assert censored_median([40.0, 10.0, 20.0]) == 20.0


def test_ours_flags_change_the_preset_and_a_bad_one_is_a_one_line_error(capsys):
    from common.presets import get_preset
    from tools.compare.time_to_accuracy import ours_config, parse_args

    cfg = ours_config("--grpo.entropy_rho 0.3 --rollout.group_size 4")
    assert cfg.grpo.entropy_rho == 0.3 and cfg.rollout.group_size == 4
    preset = get_preset("cpu-demo")
    assert preset.grpo.entropy_rho != 0.3 and preset.rollout.group_size != 4
    assert ours_config("").to_dict() == preset.to_dict()  # the preset's own values otherwise
    with pytest.raises(SystemExit) as e:
        parse_args(["--ours-flags", "--grpo.entropy_rho lots"])
    err = without_ray(capsys.readouterr().err).splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--grpo.entropy_rho" in err[0]


def test_a_report_of_one_system_has_no_ratio_against_the_other():
    import argparse

    from tools.compare.tta_report import report

    args = argparse.Namespace(n=100, gain=0.2, budget_s=600.0, seeds=[0], ours_flags="")
    run = {"system": "ours", "seed": 0, "tta_s": 90.0, "clock_s": 95.0, "steps": 5,
           "curve": [(95.0, 5, 0.41)], "setup_s": 9.0}
    lines = report([run], 0.2, 0.4, args)
    assert not any(line.startswith("trl") for line in lines)
    assert "1 evaluations, at steps 5" in lines[2], lines
    assert lines[-1] == "ratio TRL/ours: n/a (only ours run)"


def test_trl_updates_on_as_many_completions_as_ours(tmp_path):
    pytest.importorskip("trl")
    from common.presets import get_preset
    from tools.compare.time_to_accuracy import trl_args

    demo = get_preset("cpu-demo")
    ours = demo.rollout.prompts_per_step * demo.rollout.group_size
    for engine in ("hf", "vllm"):
        args = trl_args(demo, str(tmp_path), 0, engine)
        assert args.per_device_train_batch_size * args.gradient_accumulation_steps == ours
        assert args.generation_batch_size == ours
        assert args.num_generations == demo.rollout.group_size
        # TRL generates as a TRL user switches vLLM on (in its process), or with generate
        assert (args.use_vllm, args.vllm_mode) == ((True, "colocate") if engine == "vllm"
                                                   else (False, args.vllm_mode))


def test_trl_draws_the_training_problems_in_ours_order(tmp_path):
    """Seed for seed both systems train on the same problems: TRL's sampler walks its dataset
    (train_sample(0), (1), ...) as ours' driver does, each problem G times in a row."""
    pytest.importorskip("trl")
    from transformers import TrainerCallback

    from common.models import load_tokenizer, resolve_model
    from common.presets import get_preset
    from tools.compare.settings import trl_trainer
    from tools.compare.time_to_accuracy import trl_args, trl_reward

    cfg = get_preset("tiny")
    path = resolve_model(cfg.model.name)
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(64)]
    trainer = trl_trainer(path, load_tokenizer(path), rows, trl_reward(1.0),
                          trl_args(cfg, str(tmp_path), 3, "hf"), cfg.lora.r, cfg.lora.alpha,
                          TrainerCallback())
    g = cfg.rollout.group_size
    drawn = list(trainer._get_train_sampler())[: 3 * g]
    assert drawn == [i for i in range(3) for _ in range(g)]


def test_scoring_leaves_the_trainers_random_stream_where_it_was(tmp_path):
    """TRL samples from torch's global generator in the bench's process; loading an adapter to
    score it draws from that generator (peft initialises the LoRA layers before loading them),
    so without keep_rng a run's samples would depend on where the marks fall."""
    import torch

    from actors.eval_worker import load_for_eval
    from common.presets import get_preset
    from learner.learner import Learner
    from tasks.registry import make_task

    path = Learner(get_preset("tiny")).save_final(str(tmp_path / "policy"))
    samples = make_task("arith", 1, None, 0).heldout(2, "unseen")
    torch.manual_seed(0)
    want = torch.rand(4)
    torch.manual_seed(0)
    load_for_eval(path, torch.float32)
    assert not torch.equal(torch.rand(4), want)  # the load alone moves the stream
    torch.manual_seed(0)
    Scorer(samples, 0.5, 100.0, 4).score(path, 10.0, 1)
    assert torch.equal(torch.rand(4), want)


def _saved(tmp_path, name, seeds, base=0.21, gain=0.2):
    runs = [{"system": system, "seed": s, "clock_s": 100.0 + s, "steps": 5, "setup_s": 9.0,
             "curve": [[50.0, 2, base], [100.0 + s, 5, base + gain + 0.01]], "eval_s": 1.0}
            for s in seeds for system in ("ours", "trl")]
    args = {"seeds": seeds, "systems": "ours,trl", "n": 200, "trl_engine": "vllm", "gain": gain,
            "budget_s": 600.0, "out": name, "ours_flags": "", "report": False}
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps(
        {"args": args, "base": base, "target": base + gain, "runs": runs, "lines": []}))
    return str(d)


def test_join_reports_the_seeds_of_several_results_as_one_and_refuses_other_settings(
        tmp_path, capsys):
    from tools.compare.time_to_accuracy import main

    a, b = _saved(tmp_path, "a", [0, 1, 2]), _saved(tmp_path, "b", [3, 4])
    assert main(["--join", a, b, "--out", str(tmp_path / "ab")]) == 0
    joined = json.loads((tmp_path / "ab" / "results.json").read_text())
    assert joined["args"]["seeds"] == [0, 1, 2, 3, 4]
    assert [(x["system"], x["seed"]) for x in joined["runs"]][-2:] == [("ours", 4), ("trl", 4)]
    out = capsys.readouterr().out
    assert "seeds 0 1 2 3 4" in out and "5 of 5 seeds reached it" in out
    assert (tmp_path / "ab" / "tta.png").exists()
    for bad, name in ((_saved(tmp_path, "c", [5], base=0.3), "base accuracy"),
                      (_saved(tmp_path, "d", [6], gain=0.08), "gain"), (a, "(system, seed)"),
                      (str(tmp_path / "none"), "no results.json in")):
        with pytest.raises(SystemExit) as e:
            main(["--join", a, bad, "--out", str(tmp_path / "x")])
        assert name in str(e.value) and "\n" not in str(e.value)
