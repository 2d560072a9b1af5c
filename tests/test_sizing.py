"""A CPU run sized from the machine (launch/plan/sizing.py): the split of cores between the learner
and the rollout workers, cut to the RAM plan, and the refusals. Pure arithmetic on the RAM plan
of the real Qwen2-0.5B shape (no model is loaded, no Ray)."""

import pytest
from conftest import without_ray

from common.config import ConfigError
from common.presets import get_preset
from launch.cli import resolve_run
from launch.plan.ram import budget
from launch.plan.sizing import _with_split, split

GiB = 2**30


@pytest.mark.parametrize("cores", [8, 14, 16, 32])
@pytest.mark.parametrize("ram_gb", [8.0, 16.0, 32.0])
def test_every_core_is_used_once_and_the_plan_fits(cores, ram_gb):
    cfg, why = split(get_preset("cpu-14core"), cores, ram_gb)
    r = cfg.rollout
    assert r.learner_threads + r.num_workers * r.threads_per_worker == cores
    assert 1 <= r.num_workers <= r.prompts_per_step and r.learner_threads >= cores // 2
    planned = sum(v for _, _, v in budget(cfg)) / GiB
    assert planned <= ram_gb and f"{planned:.2f} GiB planned" in why
    most = split(get_preset("cpu-14core"), cores, 1000.0)[0].rollout.num_workers
    if r.num_workers < most:  # cut by the RAM: one more worker would not have fitted
        one_more = _with_split(cfg, r.num_workers + 1, 1, 1)
        assert sum(v for _, _, v in budget(one_more)) / GiB > ram_gb
        assert "would need more than" in why


def test_fourteen_cores_and_sixteen_gb_give_the_presets_own_split():
    cfg, _ = split(get_preset("cpu-14core"), 14, 16.0)
    assert (cfg.rollout.learner_threads, cfg.rollout.num_workers,
            cfg.rollout.threads_per_worker) == (8, 6, 1)


def test_less_ram_means_fewer_workers_with_more_threads_each():
    roomy = split(get_preset("cpu-14core"), 32, 32.0)[0].rollout
    tight = split(get_preset("cpu-14core"), 32, 6.0)[0].rollout
    assert tight.num_workers < roomy.num_workers
    assert tight.threads_per_worker > roomy.threads_per_worker


@pytest.mark.parametrize("cores,ram_gb,want", [
    (1, 16.0, "at least 2 cores"),
    (14, 3.0, "try "),
])
def test_a_machine_too_small_is_one_line_saying_what_to_change(cores, ram_gb, want):
    with pytest.raises(ConfigError) as err:
        split(get_preset("cpu-14core"), cores, ram_gb)
    msg = str(err.value)
    assert "\n" not in msg and want in msg


def test_the_cli_sizes_a_new_run_and_refuses_cores_with_a_split_by_hand(tmp_path, capsys):
    cfg, _, _, _, _ = resolve_run(["--preset", "cpu-14core", "--cores", "8", "--ram-gb", "16",
                                   "--run-dir", str(tmp_path / "a")])
    assert (cfg.rollout.learner_threads, cfg.rollout.num_workers) == (5, 3)
    hand, _, _, _, _ = resolve_run(["--preset", "cpu-14core", "--rollout.num_workers", "2",
                                    "--run-dir", str(tmp_path / "b")])
    assert hand.rollout.num_workers == 2 and hand.run.cores == 0  # the hand's split wins
    demo, _, _, _, _ = resolve_run(["--preset", "cpu-demo", "--run-dir", str(tmp_path / "c")])
    assert demo.rollout == get_preset("cpu-demo").rollout  # a preset with run.cores 0: as is
    capsys.readouterr()
    with pytest.raises(SystemExit) as code:
        resolve_run(["--preset", "cpu-14core", "--cores", "8", "--rollout.num_workers", "2",
                     "--run-dir", str(tmp_path / "d")])
    assert code.value.code == 2
    err = without_ray(capsys.readouterr().err).splitlines()
    assert len(err) == 1 and "--cores" in err[0] and "--rollout.num_workers" in err[0]


def test_launch_plan_prints_the_split_and_why(capsys):
    from launch.plan.__main__ import main

    assert main(["--preset", "cpu-14core", "--cores", "16", "--ram-gb", "16"]) == 0
    out = capsys.readouterr().out
    assert "sized: 16 cores, 16.0 GiB: learner 9 threads, 7 rollout worker(s)" in out
    assert "rollout-6" in out and "rollout-7" not in out
