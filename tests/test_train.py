"""End-to-end tiny runs on a real local Ray cluster: outputs, staleness, weight sync, resume."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import own_lines

from actors.eval_worker import load_for_eval
from common.presets import get_preset
from launch.driver.trainer import Trainer
from launch.rundir.writer import read_jsonl

REQUIRED = ["step", "reward/mean", "reward/format", "loss/policy", "time/step_s",
            "time/rollout_s", "time/learner_s", "time/sync_s", "rollout/tokens_per_s",
            "weights/version", "faults/worker_restarts"]



def tiny_cfg(steps=4, **rollout):
    cfg = get_preset("tiny")
    cfg.run.steps = steps
    for k, v in rollout.items():
        setattr(cfg.rollout, k, v)
    return cfg


@pytest.fixture
def run_tiny(run_job):
    def run(run_dir, steps=4, resume=False, **rollout):
        return run_job(tiny_cfg(steps, **rollout), run_dir, resume)
    return run


def reference(reference_run, cfg) -> tuple[dict, list[dict], list[int]]:
    """(summary, metrics rows, the workers' final weight versions) of the reference run of `cfg`."""
    run_dir = reference_run(cfg)
    read = lambda name: json.loads((run_dir / name).read_text())  # noqa: E731
    return read("summary.json"), read_jsonl(str(run_dir / "metrics.jsonl")), read(
        "worker_versions.json")


# Plain runs that other tests compare with (`reference_run`) serve the checks of a run's outputs
# too: (3 steps, staleness 0, no checkpoint but the end) is test_faults' hung-worker reference,
# (6, 1, a checkpoint every 2 steps) the resume test's below; a run of its own would cost a
# Trainer start (~20 CPU-s) more.
@pytest.mark.parametrize("steps,staleness,every", [(3, 0, 0), (6, 1, 2)])
def test_tiny_run_end_to_end(reference_run, steps, staleness, every):
    cfg = tiny_cfg(steps, max_staleness=staleness)
    cfg.run.checkpoint_every = every
    summary, rows, versions = reference(reference_run, cfg)
    assert [r["step"] for r in rows] == list(range(steps))
    for key in REQUIRED:
        assert all(key in r for r in rows), key
    assert [r["weights/version"] for r in rows] == list(range(1, steps + 1))
    # Rollout k was generated with version max(0, k - staleness).
    assert [r["rollout/version"] for r in rows] == [max(0, k - staleness) for k in range(steps)]
    assert [r["policy/staleness"] for r in rows] == [k - max(0, k - staleness)
                                                    for k in range(steps)]
    # a step whose rollout used pushed weights reports the worker's load of them; step 0's
    # rollout (version 0, the weights the worker started with) loaded none
    loads = [r["time/weight_load_s"] for r in rows]
    assert loads[0] == 0.0 and all(x > 0 for x in loads[1 + staleness:]), loads
    if staleness == 0:  # same weights on both sides: the engines' numerical mismatch alone
        assert all(r["policy/logp_diff"] < 1e-3 for r in rows), [r["policy/logp_diff"]
                                                                   for r in rows]
    assert versions == [steps]  # the last push reached the worker
    run_dir = reference_run(cfg)
    assert Path(summary["final"]).parent == run_dir  # the final model is saved in the run
    for name in ("config.json", "summary.json", "curves.png", "samples.jsonl"):
        assert (run_dir / name).exists(), name
    model, tok = load_for_eval(summary["final"], dtype=__import__("torch").float32)
    assert model.config.vocab_size == len(tok)


def test_steps_per_call_launches_consecutive_steps_together(reference_run):
    _, rows, versions = reference(reference_run, tiny_cfg(6, max_staleness=3, steps_per_call=2))
    assert [r["step"] for r in rows] == list(range(6))
    # Calls (0,1) and (2,3) go out at the start with version 0; (4,5) only once its last step
    # is within staleness 3, at step 2 with version 2. One step per call would give 1 for step 4.
    assert [r["rollout/version"] for r in rows] == [0, 0, 0, 0, 2, 2]
    assert all(k - r["rollout/version"] <= 3 for k, r in enumerate(rows))
    assert versions == [6]  # run() ends with the workers on the final weights


def test_wandb_offline_logging(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = get_preset("tiny")
    cfg.run.steps, cfg.run.wandb_project = 2, "homerl-test"
    trainer = Trainer(cfg, str(tmp_path))
    try:
        trainer.run()
    finally:
        trainer.shutdown()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_two_workers_split_prompts(run_tiny, tmp_path):
    cfg_rows = run_tiny(tmp_path, steps=2, num_workers=2, learner_threads=1,
                        threads_per_worker=1, prompts_per_step=3)
    _, rows, versions = cfg_rows
    assert versions == [2, 2]
    assert all(r["rollout/tokens"] > 0 for r in rows)


@pytest.mark.parametrize("rollout", [{}, {"max_staleness": 3, "steps_per_call": 2}])
def test_resume_reproduces_uninterrupted_run(run_tiny, reference_run, tmp_path, rollout):
    full = read_jsonl(str(reference_run(tiny_cfg(6, **rollout)) / "metrics.jsonl"))
    # Interrupted run: stops after 4 steps (checkpoint at step 2), then resumes to 6. Its end
    # (step 4) is a checkpoint too: removed here, as a run killed before its end has none.
    run_tiny(tmp_path / "b", steps=4, **rollout)
    ckpts = sorted(p.name for p in (tmp_path / "b").iterdir() if p.name.startswith("ckpt-"))
    assert ckpts == ["ckpt-000002", "ckpt-000004"]
    shutil.rmtree(tmp_path / "b" / "ckpt-000004")
    _, resumed, _ = run_tiny(tmp_path / "b", steps=6, resume=True, **rollout)
    assert [r["step"] for r in resumed] == list(range(6))
    assert any(r["grad/norm"] > 0 for r in full[2:])  # the resumed steps do train
    for key in ("reward/mean", "loss/policy", "grad/norm", "rollout/tokens", "weights/version",
                "rollout/version", "policy/logp_diff", "policy/entropy"):
        assert [r[key] for r in resumed] == [r[key] for r in full], key


def _rollout(lengths, reasons, rewards):
    import numpy as np

    from common.types import RolloutBatch

    n = len(lengths)
    return RolloutBatch(
        prompt_ids=[[5, 6]] * n, completion_ids=[[7] * k for k in lengths],
        logprobs=[np.zeros(k, np.float32) for k in lengths],
        entropy=[np.ones(k, np.float32) for k in lengths], finish_reasons=reasons,
        texts=[""] * n, prompt_index=[i // 4 for i in range(n)],
        correct=np.zeros(n, np.float32), format_score=np.zeros(n, np.float32),
        rewards=np.asarray(rewards, np.float32), reward_errors=[None] * n, version=3,
        num_prompts=n // 4)


def test_shares_join_with_the_slowest_times_and_offset_prompts():
    from dataclasses import replace

    from common.types import RolloutSummary

    a = replace(_rollout([3, 4, 5, 6], ["stop"] * 4, [1, 0, 1, 0]), gen_time_s=2.0,
                load_s=0.5, lent_share=1.0, worker="rollout-0").summary()
    b = replace(_rollout([2, 2, 2, 2], ["stop"] * 4, [0, 0, 1, 1]), gen_time_s=3.0,
                load_s=0.25, lent_share=0.0, worker="rollout-1").summary()
    both = RolloutSummary.concat([a, b])
    assert (both.gen_time_s, both.load_s, both.lent_share) == (3.0, 0.5, 0.5)
    assert both.prompt_index == [0, 0, 0, 0, 1, 1, 1, 1] and both.num_prompts == 2
    assert both.metrics()["time/weight_load_s"] == 0.5 and both.worker == "rollout-0,rollout-1"


@pytest.mark.parametrize("rule", ["keep", "mask", "soft_penalty"])
def test_overlong_rules_shape_the_train_batch(rule):
    """reward.overlong on one group of 4 (max_new_tokens 8, buffer 0.25: ramp over 7..8)."""
    import numpy as np

    from learner.advantages import plan_step

    cfg = get_preset("tiny")
    cfg.rollout.group_size, cfg.rollout.max_new_tokens = 4, 8
    cfg.reward.overlong = rule
    rb = _rollout([3, 8, 7, 8], ["stop", "length", "stop", "length"], [1.0, 0.0, 1.0, 0.5])
    plan, stats = plan_step(rb.summary(), cfg)
    assert rb.summary().metrics()["rollout/truncated"] == 2 and plan.version == 3
    if rule == "mask":
        assert plan.keep.tolist() == [True, False, True, False]
    else:
        assert plan.keep is None
    rewards = np.array([1.0, 0.0, 1.0, 0.5])
    if rule == "soft_penalty":  # L_cache = 2 tokens: 7 -> -0.5, 8 -> -1
        rewards += [0.0, -1.0, -0.5, -1.0]
        assert stats["reward/overlong_penalty"] == pytest.approx(-2.5 / 4)
    centered = rewards - rewards.mean()
    want = centered / (rewards.std(ddof=1) + 1e-4)
    np.testing.assert_allclose(plan.advantages, want, rtol=1e-5)


def train_until_rows(args: list[str], rows: Path, at_least: int, **env):
    """`launch.train --steps 1000 ARGS` on a local cluster of its own, in a session of its own
    (signals to its group reach only it), returned once `rows` holds `at_least` rows."""
    proc = subprocess.Popen([sys.executable, "-m", "launch.train", "--steps", "1000", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "RAY_ADDRESS": "", **env})
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline and not (
            rows.exists() and rows.read_text().count("\n") >= at_least):
        time.sleep(0.5)
    return proc


def test_a_local_run_starts_its_own_cluster_past_a_ray_start_address_file_and_stops_on_ctrl_c(
        tmp_path):
    """`ray start` (and ray.cluster_utils.Cluster) leave <RAY_TMPDIR>/ray/ray_current_cluster,
    which a plain ray.init() joins: launch.train without RAY_ADDRESS must start its own cluster
    all the same (it asks for num_cpus, which Ray refuses when joining, and the file may be
    stale: here it names a port nothing listens on). Then a terminal's Ctrl-C (SIGINT to the
    whole process group, the local cluster's processes included) stops the run after its step
    with a checkpoint, exit 0 and how to resume (one run for both: each costs a cluster)."""
    import tempfile

    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: socket paths are capped
    run, rows = tmp_path / "run", tmp_path / "run" / "metrics.jsonl"
    try:
        (ray_tmp / "ray").mkdir()
        (ray_tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:1\n")
        proc = train_until_rows(["--preset", "tiny", "--run-dir", str(run)], rows, 1,
                                RAY_TMPDIR=str(ray_tmp))
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C
        out, err = proc.communicate(timeout=120)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, err[-3000:]
    assert "launch.train: stopping after this step, with a checkpoint" in err
    steps = [r["step"] for r in read_jsonl(str(rows))]
    assert 1 <= len(steps) < 1000 and steps == list(range(len(steps)))
    assert f"launch.train: stopped at step {len(steps)} (Ctrl-C); resume with --resume {run}" in out
    assert (run / f"ckpt-{len(steps):06d}").is_dir() and not (run / "final").exists()


def test_sigterm_to_the_driver_stops_after_its_step_and_to_its_group_stops_at_once(tmp_path):
    """SIGTERM to a local run's driver alone (`kill PID`, `docker stop`) does what Ctrl-C does:
    the step ends with a checkpoint, exit 0 and how to resume. Sent to the process group
    (`timeout`, systemd's stop) it also ends the local cluster's daemons, so the step can never
    finish and leaving Ray would wait on a dead raylet: the run stops at once, exit 130, with
    one line naming the resume, and nothing of the group is left. The second run is the first
    one resumed, and carries on without a gap."""
    run, rows = tmp_path / "run", tmp_path / "run" / "metrics.jsonl"
    proc = train_until_rows(["--preset", "tiny", "--run-dir", str(run)], rows, 1)
    os.kill(proc.pid, signal.SIGTERM)  # the driver alone
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    first = len(read_jsonl(str(rows)))
    assert f"launch.train: stopped at step {first} (SIGTERM); resume with --resume {run}" in out
    assert (run / f"ckpt-{first:06d}").is_dir()

    proc = train_until_rows(["--resume", str(run)], rows, first + 1)
    os.killpg(proc.pid, signal.SIGTERM)  # the whole group: Ray's daemons too
    out, err = proc.communicate(timeout=60)  # a driver waiting on the dead raylet: no end
    assert proc.returncode == 130, err[-3000:]
    assert err.rstrip().splitlines()[-1] == (
        "launch.train: SIGTERM reached the local Ray cluster too (a signal to the process "
        f"group): stopped now; resume with --resume {run} (from its last checkpoint)")
    steps = [r["step"] for r in read_jsonl(str(rows))]
    assert len(steps) > first and steps == list(range(len(steps)))
    deadline = time.monotonic() + 60  # the daemons die with the driver, the actors with them
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


def test_drain_finishes_the_rollouts_in_flight_for_their_own_steps(ray_cluster, tmp_path):
    """Trainer.drain (tools.compare.time_to_accuracy pauses its clock after it): the rollout
    already launched for step 1 is collected, still of version 0, and step 1 trains on it without a
    new one."""
    from launch.driver.pool import Rollout

    cfg = get_preset("tiny")
    cfg.run.steps, cfg.rollout.max_staleness = 3, 1
    trainer = Trainer(cfg, str(tmp_path))
    try:
        trainer.step(0)
        assert sorted(trainer.pending) == [1] and not isinstance(trainer.pending[1].work, Rollout)
        trainer.drain()
        assert isinstance(trainer.pending[1].work, Rollout)
        row = trainer.step(1)
        assert row["rollout/version"] == 0 and row["weights/version"] == 2
    finally:
        trainer.shutdown()


@pytest.mark.parametrize("on", [True, False])
def test_a_cpu_learner_runs_with_tcmalloc_when_it_is_installed(ray_cluster, tmp_path, on):
    """run.learner_tcmalloc: the learner actor's process maps libtcmalloc_minimal (LD_PRELOAD
    through its Ray runtime_env) and trains with it; switched off, it maps glibc's only."""
    import ray

    from common.memory import tcmalloc_env

    if not tcmalloc_env():
        pytest.skip("libtcmalloc_minimal is not installed (make tcmalloc, as root)")
    cfg = get_preset("tiny")
    cfg.run.steps, cfg.run.learner_tcmalloc = 2, on
    trainer = Trainer(cfg, str(tmp_path))
    try:
        pid = ray.get(trainer.learner.placement.remote())["pid"]
        with open(f"/proc/{pid}/maps") as f:
            assert ("libtcmalloc_minimal" in f.read()) == on
        assert trainer.run()["steps"] == 2
    finally:
        trainer.shutdown()


def test_a_step_that_refuses_every_prompt_is_one_line(ray_cluster, tmp_path, capsys):
    """Prompts all longer than rollout.max_prompt_tokens (a user's dataset at the default 256)
    surface at the first step, on the worker: one line naming the setting, exit 1, not a
    traceback."""
    from launch.train import main

    capsys.readouterr()
    assert main(["--preset", "tiny", "--rollout.max_prompt_tokens", "8",
                 "--run-dir", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    ours = own_lines(err, "launch.train")
    assert ours == ["launch.train: error: step 0: every prompt was refused (prompt_too_long); "
                    "check rollout.max_prompt_tokens and the data; no step was trained"], err


def test_sigterm_stops_after_the_step_where_asked_and_a_second_one_stops_at_once():
    """stop_on_interrupt(sigterm=True), launch.train's and launch.demo's: SIGTERM (`ray job
    stop`, `kill PID`) sets the event as Ctrl-C does, naming itself; a second raises
    KeyboardInterrupt; the previous handler is back afterwards. Without `sigterm` (homerl's
    train()) SIGTERM is left alone. In a process of its own: a SIGTERM that missed the handler
    would end pytest."""
    code = """if True:
        import os, signal
        from launch.driver.supervise import stop_on_interrupt
        before, lines = signal.getsignal(signal.SIGTERM), []
        with stop_on_interrupt("p") as event:
            print("default keeps SIGTERM:", signal.getsignal(signal.SIGTERM) is before)
        try:
            with stop_on_interrupt("p", lines.append, sigterm=True) as event:
                os.kill(os.getpid(), signal.SIGTERM)
                print("first:", event.on_step(0, {}), lines)
                os.kill(os.getpid(), signal.SIGTERM)
                print("second: went on")
        except KeyboardInterrupt:
            print("second: KeyboardInterrupt")
        print("restored:", signal.getsignal(signal.SIGTERM) is before)
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).parents[1]).stdout.splitlines()
    assert out == [
        "default keeps SIGTERM: True",
        "first: SIGTERM ['\\np: SIGTERM: stopping after this step, with a checkpoint (a second "
        "signal: now, without one)']",
        "second: KeyboardInterrupt",
        "restored: True"], out
