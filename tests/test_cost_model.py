"""tools.measure.cost_model: the scaling projection's arithmetic on hand-picked figures (pure)."""

import pytest

from tools.measure.cost_model import Calibration, Layout, amdahl, best_layouts, predict

CAL = Calibration(decode_a_s=0.05, decode_b_s=0.001, call_steps=100.0, rollout_speedup_2=1.25,
                  learner_s=4.0, learner_speedup_2=1.6, completions=16, sync_s=0.5,
                  weights_gb=0.5, adapter_mb=20.0, load_s=0.0)
WIDE = 1e9  # GB/s: bandwidth that never binds


def test_amdahl_reproduces_the_two_thread_measurement_and_its_limits():
    assert amdahl(1.6, 1) == pytest.approx(1.0)
    assert amdahl(1.6, 2) == pytest.approx(1.6)  # the fit goes through the measurement
    assert amdahl(2.0, 8) == pytest.approx(8.0)  # perfectly parallel
    assert amdahl(1.0, 8) == pytest.approx(1.0)  # not parallel at all
    p = 2 * (1 - 1 / 1.6)
    assert amdahl(1.6, 4) == pytest.approx(1 / ((1 - p) + p / 4))
    assert amdahl(1.6, 4) < amdahl(1.6, 8) < 1 / (1 - p)


def test_a_step_is_the_slower_of_rollout_and_learner_plus_sync():
    pr = predict(CAL, Layout(cores=2, workers=1, worker_threads=1, learner_threads=1,
                             share=False), WIDE)
    assert pr.rollout_s == pytest.approx(100 * (0.05 + 0.016))  # 6.6 s
    assert pr.learner_s == pytest.approx(4.0)
    assert pr.step_s == pytest.approx(6.6 + 0.5)
    assert pr.completions == 16 and pr.completions_per_s == pytest.approx(16 / 7.1)
    slow = predict(Calibration(**{**CAL.__dict__, "learner_s": 9.0}),
                   Layout(2, 1, 1, 1, share=False), WIDE)
    assert slow.step_s == pytest.approx(9.0 + 0.5)  # learner-bound


def test_the_boxs_bandwidth_floors_every_decode_step():
    pr = predict(CAL, Layout(cores=8, workers=4, worker_threads=1, learner_threads=4), 10.0)
    assert pr.rollout_s == pytest.approx(100 * 4 * 0.5 / 10.0)  # 4 workers x 0.5 GB / 10 GB/s
    assert pr.completions == 64


def test_more_threads_than_cores_stretch_the_step():
    alone = predict(CAL, Layout(cores=3, workers=1, worker_threads=2, learner_threads=1,
                                share=False), WIDE)
    shared = predict(CAL, Layout(cores=2, workers=1, worker_threads=2, learner_threads=1,
                                 share=False), WIDE)
    assert shared.step_s - 0.5 == pytest.approx(1.5 * (alone.step_s - 0.5))


def test_other_boxes_add_workers_and_a_network_hop():
    one = predict(CAL, Layout(cores=4, workers=2, worker_threads=1, learner_threads=2,
                              share=False), WIDE)
    three = predict(CAL, Layout(4, 2, 1, 2, nodes=3, share=False), WIDE, network_gb_s=0.01)
    assert three.completions == (2 + 2 * 4) * 16
    assert three.learner_s == pytest.approx(one.learner_s * 10 / 2)  # 10 workers' rows vs 2
    assert three.step_s == pytest.approx(max(three.rollout_s, three.learner_s) + 0.5 + 2.0)


def test_sharing_runs_the_rest_of_the_slower_role_on_the_idle_roles_cores():
    lay = Layout(cores=2, workers=1, worker_threads=1, learner_threads=1)
    rollout_bound = predict(CAL, lay, WIDE)  # rollout 6.6 s, learner 4.0 s
    step_2 = (0.05 + 0.016) / 1.25  # the worker's decode step on 2 threads
    assert rollout_bound.rollout_s == pytest.approx(4.0 + 100 * step_2 * (6.6 - 4.0) / 6.6)
    assert rollout_bound.learner_s == pytest.approx(4.0)
    assert rollout_bound.step_s == pytest.approx(rollout_bound.rollout_s + 0.5)
    slow = Calibration(**{**CAL.__dict__, "learner_s": 9.0})
    learner_bound = predict(slow, lay, WIDE)
    assert learner_bound.learner_s == pytest.approx(6.6 + (9.0 - 6.6) / 1.6)
    assert learner_bound.rollout_s == pytest.approx(6.6)
    # a box's bandwidth floors the borrowed decode step too: nothing to gain there
    floored = predict(CAL, lay, box_bandwidth_gb_s=0.5 / 0.066)
    assert floored.rollout_s == pytest.approx(6.6)


def test_a_workers_weight_load_lengthens_its_cycle_and_is_hidden_behind_a_long_update():
    loaded = Calibration(**{**CAL.__dict__, "load_s": 1.0})
    alone = Layout(cores=2, workers=1, worker_threads=1, learner_threads=1, share=False)
    assert predict(loaded, alone, WIDE).step_s == pytest.approx(1.0 + 6.6 + 0.5)
    slow = Calibration(**{**loaded.__dict__, "learner_s": 9.0})
    assert predict(slow, alone, WIDE).step_s == pytest.approx(9.0 + 0.5)  # load hidden
    # sharing: the worker decodes on its own core until the update (which began with its load)
    # ends, then on both
    shared = predict(loaded, Layout(2, 1, 1, 1), WIDE)
    step_2 = (0.05 + 0.016) / 1.25
    assert shared.rollout_s == pytest.approx(3.0 + 100 * step_2 * (6.6 - 3.0) / 6.6)
    assert shared.step_s == pytest.approx(1.0 + shared.rollout_s + 0.5)


def test_workers_on_other_boxes_borrow_no_cores():
    lay = Layout(cores=4, workers=2, worker_threads=1, learner_threads=2, nodes=2)
    fast = Calibration(**{**CAL.__dict__, "learner_s": 0.1})  # rollout-bound
    assert predict(fast, lay, WIDE).rollout_s == pytest.approx(6.6)
    slow = Calibration(**{**CAL.__dict__, "learner_s": 9.0})  # learner-bound: borrows 2 cores
    no_share = predict(slow, Layout(4, 2, 1, 2, nodes=2, share=False), WIDE)
    with_share = predict(slow, lay, WIDE)
    speedup = amdahl(1.6, 4) / amdahl(1.6, 2)
    assert with_share.learner_s == pytest.approx(6.6 + (no_share.learner_s - 6.6) / speedup)


def test_best_layouts_use_every_core_once_and_come_fastest_first():
    found = best_layouts(CAL, cores=14, box_bandwidth_gb_s=60.0, top=5)
    assert len(found) == 5
    rates = [pr.completions_per_s for _, pr in found]
    assert rates == sorted(rates, reverse=True)
    for lay, _ in found:
        assert lay.workers * lay.worker_threads + lay.learner_threads <= 14


def test_a_runs_layout_and_medians_are_read_past_its_warm_up(tmp_path):
    import json

    from tools.measure.cost_model import run_layout

    rollout = {"num_workers": 2, "threads_per_worker": 1, "learner_threads": 1,
               "prompts_per_step": 3, "group_size": 8, "share_cores": True}
    (tmp_path / "config.json").write_text(json.dumps({"rollout": rollout}))
    steps = [99.0, 50.0, 7.0, 6.0, 8.0]  # two warm-up steps, then 6-8 s
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"time/step_s": s, "time/rollout_s": s - 1, "time/learner_s": s - 2,
                    **({"time/weight_load_s": s / 10} if s < 50 else {})}) + "\n" for s in steps))
    lay, got = run_layout(str(tmp_path), cores=2)
    assert lay == Layout(2, 2, 1, 1, rows=12, share=True)
    assert got == {"step": 7.0, "rollout": 6.0, "learner": 5.0, "weight_load": 0.7}
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"time/step_s": 1.0}) + "\n")
    with pytest.raises(ValueError, match="fewer than 3 steps"):
        run_layout(str(tmp_path), cores=2)


def test_a_non_positive_figure_is_a_one_line_error(capsys):
    from tools.measure.cost_model import main

    with pytest.raises(SystemExit):
        main(["--learner-speedup-2", "0"])
    assert "--learner-speedup-2 must be > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--load-s", "-1"])
    assert "--load-s must be > 0 or 0" in capsys.readouterr().err
    assert main(["--load-s", "0", "--nodes", "1"]) == 0  # nothing to load: allowed


def _measured(s8_ms, s16_ms, s16_2t_ms, l1_s, l2_s):
    """tools.measure.cores' four measurements, hand-built in their JSON shape."""
    def row(batch, step_ms, prefill_s=0.8):
        return {"batch": batch, "step_ms": step_ms, "decode_tok_s": batch / step_ms * 1e3,
                "of_bound": 0.4, "bound_tok_s": 50.0, "prefill_s": prefill_s}

    def learner(median_s):
        return {"seqs": 8, "completion_len": 64,
                "rows": [{"median_s": median_s, "tokens_per_s": 8 * 64 / median_s,
                          "export_mb": 10 * 1e6 / 2**20}]}

    return {"decode_1": {"weights_gb": 1.98, "rows": [row(8, s8_ms), row(16, s16_ms)]},
            "decode_2": {"rows": [row(16, s16_2t_ms)]},
            "learner_1": learner(l1_s), "learner_2": learner(l2_s)}


def test_bench_cores_turns_measurements_into_the_cost_models_figures():
    """Decode's line through B = 8 and 16, the 2-thread speed-ups, the call's steps (new tokens
    + prefill in steps) and the learner scaled from the measured completion length."""
    from common.presets import get_preset
    from tools.measure.cores import calibration, per_core_table

    cfg = get_preset("cpu-14core")  # 256 new tokens
    m = _measured(s8_ms=300.0, s16_ms=400.0, s16_2t_ms=250.0, l1_s=40.0, l2_s=25.0)
    cal = calibration(m, cfg, completion_len=64)
    assert cal.decode_b_s == pytest.approx(0.1 / 8)
    assert cal.decode_a_s == pytest.approx(0.3 - 8 * 0.1 / 8)  # 0.2 s
    assert cal.rollout_speedup_2 == pytest.approx(1.6)
    assert cal.call_steps == pytest.approx(256 + 0.8 / 0.4)
    assert cal.learner_s == pytest.approx(40.0 * 256 / 64) and cal.completions == 8
    assert cal.learner_speedup_2 == pytest.approx(1.6)
    assert cal.weights_gb == 1.98 and cal.adapter_mb == pytest.approx(10.0)
    rows = per_core_table(m)
    assert rows[4].startswith("| decode | 2 | 16 | 64.0 | 32.0 |")  # 16 rows / 0.25 s, 2 cores
    assert rows[6] == "| learner | 2 | 8 x 64 | 20.5 | 10.2 | - |"
