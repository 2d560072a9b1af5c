"""Non-finite rewards end to end: a tiny run on a file task whose reward function returns 1e39
(finite as a Python float, inf as the rewards' float32) for some completions finishes, with the
failures counted and no NaN or inf in its metrics, samples or checkpoints. The parts: the
reward checks in tests/test_reward_fns.py, the learner's skip in tests/test_learner.py."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from launch.rundir.checkpoints import list_checkpoints

MYMOD = '''
def reward_len(completions, **kwargs):
    return [len(c) / 100 for c in completions]


def huge(completions, **kwargs):
    return [1e39 if i % 2 else 1.0 for i in range(len(completions))]


def extreme(completions, **kwargs):  # finite float32s whose gradient is not finite
    return [3e38 if i % 2 else -3e38 for i in range(len(completions))]
'''


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def numbers(row: dict):
    """Every float in a metrics or samples row, nested ones too."""
    for v in row.values():
        if isinstance(v, dict):
            yield from numbers(v)
        elif isinstance(v, float):
            yield v


def train(tmp_path, monkeypatch, *args) -> Path:
    """A 3-step tiny run on a file task, with MYMOD's functions in the cwd; its run dir."""
    from launch.train import main

    (tmp_path / "mymod.py").write_text(MYMOD)
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": i + 1}) + "\n"
                            for i in range(24)))
    run = tmp_path / "run"
    assert main(["--preset", "tiny", "--steps", "3", "--curriculum.task", "file",
                 "--curriculum.data_path", str(data), "--curriculum.heldout_size", "4",
                 "--run.sample_every", "1", *args, "--run-dir", str(run)]) == 0
    return run


def assert_checkpoints_finite(run: Path) -> list[str]:
    ckpts = list_checkpoints(str(run))
    assert ckpts  # step 2 (checkpoint_every) and the end, step 3
    for ckpt in ckpts:
        for name, t in load_file(f"{ckpt}/learner.safetensors").items():
            if np.issubdtype(t.dtype, np.floating):
                assert np.isfinite(t).all(), (ckpt, name)
    return ckpts


def test_a_reward_fn_returning_1e39_leaves_the_run_finite(tmp_path, monkeypatch, own_ray):
    run = train(tmp_path, monkeypatch, "--reward.fn", "mymod:reward_len,mymod:huge")
    metrics = rows_of(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for m in metrics:  # 2 prompts x G=4 a step: huge's call is bad output on all 8
        bad = [k for k, v in m.items() if isinstance(v, float) and not math.isfinite(v)]
        assert not bad, (m["step"], bad)
        assert m["reward/error_fn_bad_output"] == 8 and m["reward/fn/huge"] == 0.0
        assert m["learner/skipped_nonfinite"] == 0  # nothing non-finite got that far
    assert [m["weights/version"] for m in metrics] == [1, 2, 3]
    for s in rows_of(run / "samples.jsonl"):
        assert all(math.isfinite(v) for v in numbers(s)), s
        assert s["reward"] == pytest.approx(len(s["completion"]) / 100, abs=1e-6)
    assert_checkpoints_finite(run)


def test_updates_whose_gradient_is_not_finite_are_skipped_and_the_run_goes_on(
        tmp_path, monkeypatch, own_ray):
    """Rewards of +-3e38 are finite, and so are their advantages without std scaling, but the
    gradient norm is not: every update is skipped, counted, the weights stay at version 0 (no
    push: the workers sample version 0 throughout), and the checkpoints hold that state."""
    run = train(tmp_path, monkeypatch, "--reward.fn", "mymod:extreme",
                "--grpo.adv_scale", "none")
    metrics = rows_of(run / "metrics.jsonl")
    assert [m["learner/skipped_nonfinite"] for m in metrics] == [1, 2, 3]
    assert [m["weights/version"] for m in metrics] == [0, 0, 0]
    assert [m["rollout/version"] for m in metrics] == [0, 0, 0]
    assert all(not math.isfinite(m["grad/norm"]) for m in metrics)
    assert "reward/error_fn_bad_output" not in metrics[0]
    for ckpt in assert_checkpoints_finite(run):
        meta = json.loads((Path(ckpt) / "learner.json").read_text())["meta"]
        assert meta["version"] == 0 and meta["skipped_nonfinite"] >= 2
