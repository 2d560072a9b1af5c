"""The web app's callbacks (launch/py, launch/py), called as the page calls
them: real config validation, real tiny models, a real training run started and stopped."""

from __future__ import annotations

import json
import os
import socket
import time

import numpy as np
import pytest
from conftest import RAY, submit

from common import metrics as M
from common.presets import get_preset
from common.types import RolloutSummary
from launch.app.model_tabs import eval_sets, run_eval, try_model, verdict
from launch.app.runs import (
    FORM_FLAGS,
    FormError,
    _last_line,
    check_form,
    checkpoints,
    form_config,
    kill_run,
    list_runs,
    resume_run,
    run_status,
    start_run,
    stop_run,
    train_argv,
)
from launch.app.views import (
    SAMPLE_COLUMNS,
    curve_figure,
    curve_series,
    dashboard_url,
    latest_samples,
)
from launch.rundir.checkpoints import list_checkpoints
from launch.rundir.writer import RunWriter, read_jsonl, stop_requested


def test_form_becomes_the_cli_flags_of_launch_train():
    argv = train_argv({"preset": "tiny", "steps": 4.0, "lr": 0.001, "model": " ",
                              "seed": None, "engine": "hf"})
    assert argv == ["--preset", "tiny", "--run.steps", "4", "--grpo.lr", "0.001",
                    "--rollout.engine", "hf"]
    cfg = check_form({"preset": "tiny", "steps": 7.0, "group_size": 6, "lora_r": 4})
    assert (cfg.run.steps, cfg.rollout.group_size, cfg.lora.r) == (7, 6, 4)


@pytest.mark.parametrize("form, names", [
    ({"preset": "tiny", "steps": -3}, "run.steps"),
    ({"preset": "tiny", "engine": "tensorrt"}, "rollout.engine"),
    ({"preset": "nope"}, "--preset"),
    ({"preset": "tiny", "group_size": 2.5}, "--rollout.group_size"),
    ({"preset": "tiny", "lr": float("nan")}, "--grpo.lr"),
    ({"preset": "tiny", "level": 9}, "curriculum.level"),
    ({"preset": "tiny", "model": "nobody-has/this-model-xyz"}, "nobody-has/this-model-xyz"),
    ({"preset": "tiny", "colour": "red"}, "colour"),
])
def test_bad_form_is_one_line_naming_the_field_and_starts_nothing(tmp_path, form, names,
                                                                 monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FormError) as err:
        start_run(form, str(tmp_path / "runs"))
    assert names in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists() or not os.listdir(tmp_path / "runs")


def _summary(correct, fmt):
    n = len(correct)
    return RolloutSummary(
        rewards=np.array(correct, float) + 0.5 * np.array(fmt, float),
        correct=np.array(correct, float), format_score=np.array(fmt, float),
        lengths=np.full(n, 5), finish_reasons=["stop"] * n, prompt_index=[0] * n,
        reward_errors=[None] * n, answers=["1"] * n, sample_texts=[], version=0, num_prompts=1,
        gen_time_s=1.0, worker="w")


def test_rollout_rows_carry_strict_accuracy_and_completions():
    row = _summary([1, 1, 0, 0], [1, 0, 1, 0]).metrics()
    assert row[M.REWARD_STRICT] == 0.25  # right AND formatted: one of four
    assert row[M.REWARD_CORRECT] == 0.5 and row[M.REWARD_FORMAT] == 0.5
    assert row[M.ROLLOUT_COMPLETIONS] == 4


def test_curve_series_per_panel_skips_missing_and_non_finite_points():
    rows = [{M.STEP: 0, M.REWARD_MEAN: 0.1, M.STEP_S: 2.0, M.ROLLOUT_COMPLETIONS: 16},
            {M.STEP: 1, M.REWARD_MEAN: float("nan"), M.STEP_S: 4.0, M.ROLLOUT_COMPLETIONS: 16},
            {M.STEP: 2, M.REWARD_MEAN: 0.5, M.ENTROPY: 1.5}]
    series = curve_series(rows)
    assert series["reward"] == ([0, 2], [0.1, 0.5])
    assert series["completions / s"] == ([0, 1], [8.0, 4.0])
    assert series["entropy"] == ([2], [1.5])
    assert "KL to the reference" not in series  # no data, no empty panel


def _run_dir(tmp_path, steps=5, rows=3) -> str:
    run_dir = str(tmp_path / "run")
    cfg = get_preset("tiny").to_dict()
    cfg["run"]["steps"] = steps
    writer = RunWriter(run_dir, cfg)
    for k in range(rows):
        writer.log({M.STEP: k, M.REWARD_MEAN: k / 10, M.STEP_S: 1.0, M.ROLLOUT_COMPLETIONS: 8})
        writer.samples(k, [{"question": f"q{k}", "answer": "1", "completion": f"c{k}",
                            "reward": 0.5, "correct": 0.0, "error": None}])
    return run_dir


def test_curve_figure_and_latest_samples_read_the_run_directory(tmp_path):
    run_dir = _run_dir(tmp_path)
    fig = curve_figure(run_dir)
    titles = [ax.get_title() for ax in fig.axes if ax.lines]
    assert titles == ["reward", "s / step", "completions / s"]
    assert list(fig.axes[0].lines[0].get_ydata()) == [0.0, 0.1, 0.2]
    rows = latest_samples(run_dir, n=2)
    assert [r[0] for r in rows] == [2, 1]  # newest first
    assert rows[0][SAMPLE_COLUMNS.index("completion")] == "c2"
    assert curve_figure(str(tmp_path)) is None  # no metrics yet: no figure


def test_run_status_from_the_directory_and_the_driver_process(tmp_path):
    run_dir = _run_dir(tmp_path, steps=5, rows=3)
    status = run_status(run_dir)  # rows written just now, but no driver process: not running
    assert (status.state, status.step, status.total) == ("stopped", 3, 5)
    # started by the app, its driver gone with a one-line error: failed, with that line
    with open(os.path.join(run_dir, "app.json"), "w") as f:
        json.dump({"pid": 2 ** 22 + 11, "command": []}, f)  # above pid_max: no such process
    with open(os.path.join(run_dir, "app.log"), "w") as f:
        f.write("loading\nlaunch.train: error: cpu-demo: the plan needs 9 GiB of RAM\ntrailer\n")
    status = run_status(run_dir)
    assert status.state == "failed" and "no checkpoint yet" in status.message
    assert status.message.endswith("launch.train: error: cpu-demo: the plan needs 9 GiB of RAM")
    # a live process that is not a driver (this one) is not taken for the run
    with open(os.path.join(run_dir, "app.json"), "w") as f:
        json.dump({"pid": os.getpid(), "command": []}, f)
    assert run_status(run_dir).state == "failed"
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        f.write("{}")
    assert run_status(run_dir).state == "finished"
    assert list_runs(str(tmp_path)) == [run_dir]


def test_eval_sets_take_builtin_sets_and_a_users_file_and_reject_bad_lines(tmp_path):
    good = tmp_path / "mine.jsonl"
    good.write_text('{"question": "What is 2 + 2?", "answer": "4"}\n'
                    '{"question": "Half of 10?", "answer": "#### 5"}\n')
    sets = eval_sets(["arith-1-unseen"], 7, str(good))
    assert list(sets) == ["arith-1-unseen", "mine"]
    assert len(sets["arith-1-unseen"]) == 7 and len(sets["mine"]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "What is 2 + 2?", "answer": "4"}\n{"question": "x"}\n')
    with pytest.raises(FormError, match=r"bad.jsonl:2: field 'answer'"):
        eval_sets([], 5, str(bad))
    with pytest.raises(FormError, match="problems per set"):
        eval_sets(["arith-1"], 0, None)
    with pytest.raises(FormError, match="pick a held-out set"):
        eval_sets([], 5, None)
    with pytest.raises(FormError, match="arith-9"):
        eval_sets(["arith-9"], 5, None)


def test_run_eval_scores_a_real_model_and_writes_the_json(tmp_path, tiny_llama):
    data = tmp_path / "three.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)})
                            + "\n" for i in range(3)))
    md, text, path = run_eval(["tiny-random-llama"], [], 5, str(data),
                                            out_dir=str(tmp_path / "evals"))
    with open(path) as f:
        saved = json.load(f)
    res = saved[0]["sets"]["three"]
    assert saved[0]["model"] == "tiny-random-llama" and res["n"] == 3
    assert f"| tiny-random-llama | three | 3 | {res['accuracy']:.1%}" in md
    assert "three" in text.splitlines()[0]
    with pytest.raises(FormError, match="samples"):
        run_eval(["tiny-random-llama"], [], 5, str(data), samples=1)
    with pytest.raises(FormError, match="pick at least one"):
        run_eval([], ["arith-1"], 5)


def test_verdict_of_hand_made_completions():
    assert verdict("3 + 4 = 7\nAnswer: 7", "7").startswith("correct: parsed "
                                                                         "answer 7, in the asked")
    wrong = verdict("I think it is 8", "7")
    assert wrong.startswith("wrong") and "not in the asked format" in wrong
    assert "error code no_answer" in verdict("no idea", "7")


def test_try_model_greedy_is_repeatable_and_rejects_bad_input(tiny_llama):
    first, verdict = try_model("tiny-random-llama", "What is 3 + 4?", True, "7",
                                             max_new_tokens=8)
    again, _ = try_model("tiny-random-llama", "What is 3 + 4?", True, "",
                                       max_new_tokens=8)
    assert first == again and first and verdict.split(":")[0] in ("correct", "wrong")
    sampled, _ = try_model("tiny-random-llama", "What is 3 + 4?", False, "",
                                         max_new_tokens=8, seed=1)
    assert isinstance(sampled, str)
    with pytest.raises(FormError, match="expected answer"):
        try_model("tiny-random-llama", "What is 3 + 4?", True, "seven")
    with pytest.raises(FormError, match="prompt"):
        try_model("tiny-random-llama", "  ", True, "")
    with pytest.raises(FormError, match="runs/none/final"):
        try_model("runs/none/final", "What is 3 + 4?", True, "")


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def test_start_stop_resume_a_real_run_keeps_one_row_per_step(tmp_path, own_ray, tiny_llama):
    """The page's Start, Stop and Resume: a real driver in its own process; Stop checkpoints
    the step it stops at, Resume redoes nothing and the run ends with one row per step."""
    root = str(tmp_path / "runs")
    run_dir = start_run({"preset": "tiny", "steps": 40}, root)
    try:
        assert run_status(run_dir).state == "running"
        _wait(lambda: run_status(run_dir).step >= 3, 240, "3 steps")
        assert stop_run(run_dir).startswith("stop asked")
        _wait(lambda: run_status(run_dir).state != "running", 120, "the driver to stop")
        status = run_status(run_dir)
        assert status.state == "stopped" and 3 <= status.step < 40, status
        assert list_checkpoints(run_dir)[-1].endswith(f"ckpt-{status.step:06d}")
        assert stop_requested(run_dir)  # kept until the run starts again
        with pytest.raises(FormError, match="not a run directory"):
            resume_run(str(tmp_path))
        resume_run(run_dir)
        _wait(lambda: run_status(run_dir).state != "running", 300, "the resumed run")
        final = run_status(run_dir)
        assert final.state == "finished", (final, _last_line(f"{run_dir}/app.log"))
        with pytest.raises(FormError, match="already finished"):
            resume_run(run_dir)
        steps = [r[M.STEP] for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))]
        assert steps == list(range(40))
        assert not stop_requested(run_dir)
        assert checkpoints(root) == [os.path.join(run_dir, "final")]
    finally:
        kill_run(run_dir)


def test_app_refuses_a_taken_port_in_one_line(capsys):
    app = pytest.importorskip("launch.app.ui", reason="gradio not installed (.[app])")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert app.main(["--port", str(port)]) == 2
    assert f"--port: 127.0.0.1:{port} is taken" in capsys.readouterr().err


@pytest.mark.parametrize("preset", ["tiny", "cpu-demo", "cpu-14core"])
def test_a_presets_form_values_give_back_the_preset(preset):
    """Picking a preset fills the Train form; starting with those values runs that preset."""
    app = pytest.importorskip("launch.app.ui", reason="gradio not installed (.[app])")
    form = dict(zip(FORM_FLAGS, [preset, *app.preset_values(preset)]))
    assert form_config(form).to_dict() == get_preset(preset).to_dict()


@pytest.mark.slow
def test_under_a_dashboard_address_start_submits_a_ray_job(tmp_path, head_node, monkeypatch):
    """RAY_ADDRESS=http://head:8265: Start submits launch.train as a Ray job and follows it."""
    address, env, _ = head_node
    warm = submit([RAY, "job", "submit", "--address", address, "--", "python", "-c", "0"], env)
    assert warm.returncode == 0, warm.stdout[-2000:]  # the head's job agent is up
    for key in ("PATH", "RAY_AUTH_MODE", "HOME", "HOMERL_CACHE"):  # HOME: the head's token
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("RAY_ADDRESS", address)
    run_dir = start_run({"preset": "tiny", "steps": 3}, str(tmp_path / "runs"))
    try:
        with open(os.path.join(run_dir, "app.json")) as f:
            command = json.load(f)["command"]
        assert command[1:3] == ["job", "submit"]
        # the dashboard's Stop (ray job stop) lets the driver end its step with a checkpoint
        runtime_env = json.loads(command[command.index("--runtime-env-json") + 1])
        assert int(runtime_env["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"]) >= 60
        _wait(lambda: run_status(run_dir).state != "running", 400, "the Ray job")
        log = open(os.path.join(run_dir, "app.log")).read()
        assert run_status(run_dir).state == "finished", log[-3000:]
        assert "succeeded" in log
        steps = [r[M.STEP] for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))]
        assert steps == [0, 1, 2]
        assert dashboard_url() == address
    finally:
        kill_run(run_dir)
