"""Fault injection with real Ray actors and real processes: nothing is lost, nothing hangs.

* a rollout worker killed with SIGKILL mid-run is replaced, its share re-generated with the same
  seed and weights, and the run's metrics equal the uninterrupted run's;
* a hung worker (SIGSTOP) misses its call timeout, is treated as dead and replaced;
* stale or mismatched weight pushes are refused with a clear error; a push that keeps failing
  is retried, then raises WeightSyncError naming worker, version and reason (never a hang);
* half-written checkpoints are never resumed from; bad models/data are one-line errors.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace

import pytest
import ray
from conftest import own_lines

from actors.hf_worker import HFRolloutWorker
from actors.weights import WeightVersionError
from common.presets import get_preset
from common.types import RolloutCall, Sampling, WeightUpdate
from launch.driver.pool import WeightSyncError
from launch.driver.trainer import Trainer
from launch.rundir.checkpoints import list_checkpoints
from launch.rundir.writer import read_jsonl

KEYS = ("reward/mean", "loss/policy", "grad/norm", "rollout/tokens", "weights/version")



def tiny(steps=5, **rollout):
    cfg = get_preset("tiny")
    cfg.run.steps = steps
    cfg.run.checkpoint_every = 0
    for k, v in rollout.items():
        setattr(cfg.rollout, k, v)
    return cfg


def run_to_end(trainer):
    """trainer.run(), then its actors shut down whatever happened."""
    try:
        return trainer.run()
    finally:
        trainer.shutdown()


def run_with_fault(cfg, run_dir, fault_at: int | None, sig=signal.SIGKILL):
    """Run all steps; before step `fault_at`, send `sig` to the rollout worker's process."""
    trainer = Trainer(cfg, str(run_dir))
    try:
        rows = []
        for k in range(cfg.run.steps):
            if k == fault_at:
                for pid in trainer.pool.worker_pids():
                    os.kill(pid, sig)
            rows.append(trainer.step(k))
        trainer.end_on_final_weights()  # as finish() does
        versions = trainer.pool.worker_versions()
    finally:
        trainer.shutdown()
    return rows, versions


def checkpointed(steps=6, **rollout):
    """tiny() with a checkpoint every 2 steps: the config of test_train's resume test, so that
    both compare with one reference run (`reference_run`)."""
    cfg = tiny(steps, **rollout)
    cfg.run.checkpoint_every = 2
    return cfg


def clean_rows(reference_run, cfg) -> list[dict]:
    """metrics.jsonl of the run of `cfg` that nobody interrupted."""
    return read_jsonl(str(reference_run(cfg) / "metrics.jsonl"))


def test_killed_worker_is_replaced_and_nothing_is_lost(ray_cluster, reference_run, tmp_path):
    clean = clean_rows(reference_run, checkpointed())
    faulty, versions = run_with_fault(checkpointed(), tmp_path / "kill", fault_at=2)
    assert faulty[-1]["faults/worker_restarts"] >= 1
    assert clean[-1]["faults/worker_restarts"] == 0
    assert [r["step"] for r in faulty] == list(range(6))
    for key in KEYS:
        assert [r[key] for r in faulty] == [r[key] for r in clean], key
    assert versions == [6]  # the replacement caught up with the newest weights


def test_worker_killed_under_multi_step_calls_loses_nothing(ray_cluster, reference_run,
                                                            tmp_path):
    # No checkpoints here: a checkpoint waits for the rollouts in flight, so with one at step 2
    # the kill lands after the worker's last call and no share is re-run (that end is
    # test_a_worker_dead_after_its_last_call_is_replaced_at_the_end).
    cfg = dict(steps=6, max_staleness=3, steps_per_call=2)
    clean = clean_rows(reference_run, tiny(**cfg))
    # killed before step 2, which launches the call for steps (4, 5): both shares re-run
    faulty, versions = run_with_fault(tiny(**cfg), tmp_path / "kill", fault_at=2)
    assert faulty[-1]["faults/worker_restarts"] == 1
    for key in KEYS + ("rollout/version",):
        assert [r[key] for r in faulty] == [r[key] for r in clean], key
    assert versions == [6]


def test_a_worker_dead_after_its_last_call_is_replaced_at_the_end(ray_cluster, tmp_path):
    """Killed once every rollout is done: no rollout fails, so only the end-of-run check can
    see it; the final push must not be dropped on the dead actor."""
    trainer = Trainer(tiny(steps=2, max_staleness=0), str(tmp_path))
    try:
        trainer.step(0)
        trainer.step(1)
        (pid,) = trainer.pool.worker_pids()
        os.kill(pid, signal.SIGKILL)
        assert trainer.end_on_final_weights() == 1
        assert trainer.pool.restarts == 1
        assert trainer.pool.worker_versions() == [2]  # the replacement holds the final weights
        assert trainer.pool.worker_pids() != [pid]
    finally:
        trainer.shutdown()


def test_hung_worker_times_out_and_is_replaced(ray_cluster, reference_run, tmp_path):
    cfg = tiny(steps=3, call_timeout_s=8.0, max_staleness=0)
    clean = clean_rows(reference_run, tiny(steps=3, max_staleness=0))
    hung, _ = run_with_fault(cfg, tmp_path / "hung", fault_at=1, sig=signal.SIGSTOP)
    assert hung[-1]["faults/worker_restarts"] == 1
    assert [r["reward/mean"] for r in hung] == [r["reward/mean"] for r in clean]


def test_failed_push_is_retried_then_a_clear_error_not_a_hang(ray_cluster, tmp_path):
    trainer = Trainer(tiny(steps=2, max_staleness=0), str(tmp_path))
    try:
        trainer.step(0)
        pool, v = trainer.pool, trainer.pool.version
        bad = replace(ray.get(pool.payloads[v]), version=v)  # claims the version it replaces
        pool.push(ray.put(bad), v + 1)
        prompts = trainer.curriculum.prompts(1)[1]
        with pytest.raises(WeightSyncError) as e:
            pool.collect(pool.submit(1, prompts, seed=1))
    finally:
        trainer.shutdown()
    msg = str(e.value)
    assert "\n" not in msg and f"version {v + 1} after 3 tries" in msg
    assert f"update holds version {v}, push said {v + 1}" in msg  # the worker's own reason


def test_stale_and_mismatched_weights_are_refused():
    cfg = tiny()
    worker = HFRolloutWorker(cfg)
    payload = WeightUpdate("lora", 3, {}, scale=2.0)
    with pytest.raises(WeightVersionError, match="update holds version 3, push said 4"):
        worker.set_weights(payload, 4)
    assert worker.set_weights(payload, 3) == 3
    old = replace(payload, version=2)
    with pytest.raises(WeightVersionError, match="stale weights version 2 < current 3"):
        worker.set_weights(old, 2)
    assert worker.set_weights(old, 2, rollback=True) == 2


def test_prompts_refused_and_counted():
    cfg = tiny()
    cfg.rollout.max_prompt_tokens = 300  # chars: the tiny tokenizer is character-level
    worker = HFRolloutWorker(cfg)
    prompts = [{"question": "What is 1 + 2?", "answer": "3"},
               {"question": "   ", "answer": "1"},
               {"question": "What is " + "9 + " * 200 + "1?", "answer": "1801"}]
    batch = worker.generate(RolloutCall(prompts, 2, Sampling(seed=0)))
    assert batch.prompt_index == [0, 0]
    assert sorted(s["reason"] for s in batch.skipped) == ["empty_prompt", "prompt_too_long"]


@pytest.mark.parametrize("argv,msg", [
    (["--model", "/nonexistent/model"], "/nonexistent/model"),
    (["--curriculum.task", "gsm8k", "--curriculum.data_path", "{bad}"], "no usable"),
])
def test_bad_model_or_data_is_one_line_error(tmp_path, argv, msg):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n[]\n")
    argv = [a.replace("{bad}", str(bad)) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--preset", "tiny",
                           "--run-dir", str(tmp_path / "run"), *argv],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(err) == 1 and msg in err[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("damage", ["old_pickle", "garbage_json", "truncated_tensors",
                                    "missing_tensor"])
def test_damaged_or_old_checkpoint_is_a_one_line_error(reference_run, tmp_path, damage):
    """`--resume` on a checkpoint it cannot read: one stderr line naming the file, exit 2, and
    nothing unpickled (a checkpoint holds no pickle at all)."""
    cfg = tiny(steps=2)  # checkpoint_every 0: the run's end, ckpt-000002, is its only one
    shutil.copytree(reference_run(cfg), tmp_path, dirs_exist_ok=True)  # a copy to damage
    ckpt = tmp_path / "ckpt-000002"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "COMPLETE", "driver.json", "driver.safetensors", "learner.json", "learner.safetensors"]
    if damage == "old_pickle":  # what the code before plain-state checkpoints wrote
        (ckpt / "driver.json").unlink()
        (ckpt / "driver.pkl").write_bytes(b"\x80\x04K\x01.")
        want = "no driver.json: written by an older homerl (driver.pkl, a pickle)"
    elif damage == "garbage_json":
        (ckpt / "learner.json").write_text("{not json")
        want = "learner.json: damaged"
    elif damage == "truncated_tensors":
        data = (ckpt / "learner.safetensors").read_bytes()
        (ckpt / "learner.safetensors").write_bytes(data[: len(data) // 2])
        want = "learner.safetensors: damaged or missing"
    else:
        head = json.loads((ckpt / "driver.json").read_text())
        head["tensors"].append("pending.9.0.rewards")
        (ckpt / "driver.json").write_text(json.dumps(head))
        want = "driver.safetensors: lacks 1 tensors, e.g. pending.9.0.rewards"
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--resume", str(tmp_path),
                           "--steps", "3"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_ADDRESS": ""})
    err = own_lines(proc.stderr, "launch.train")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(err) == 1 and want in err[0] and str(ckpt) in err[0], err
    assert "Traceback" not in proc.stderr


class LearnerKillingTrainer(Trainer):
    """Sends SIGKILL to the learner's process before step `KILL_AT` (first life only)."""

    KILL_AT = 3

    def step(self, k):
        if k == self.KILL_AT and self.learner_restarts == 0:
            os.kill(ray.get(self.learner.placement.remote())["pid"], signal.SIGKILL)
        return super().step(k)


def test_killed_learner_is_restored_from_the_checkpoint_and_nothing_is_lost(
        ray_cluster, reference_run, tmp_path):
    from launch.driver.supervise import run_supervised

    want = clean_rows(reference_run, checkpointed())
    faulty = run_supervised(LearnerKillingTrainer(checkpointed(), str(tmp_path / "kill")))
    assert want[-1]["faults/learner_restarts"] == 0 and faulty["learner_restarts"] == 1
    rows = read_jsonl(str(tmp_path / "kill" / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(6))  # each step once; 2 and 3 were redone
    assert [r["faults/learner_restarts"] for r in rows] == [0, 0, 1, 1, 1, 1]
    for key in KEYS:  # restored exactly: the same numbers as the run nobody killed
        assert [r[key] for r in rows] == [r[key] for r in want], key
    assert os.path.isdir(tmp_path / "kill" / "final")


def test_a_learner_that_keeps_dying_stops_the_run_with_one_line(ray_cluster, tmp_path):
    from launch.driver.supervise import LearnerLostError, run_supervised

    class AlwaysKill(LearnerKillingTrainer):
        KILL_AT = 1

        def step(self, k):
            if k == self.KILL_AT:
                os.kill(ray.get(self.learner.placement.remote())["pid"], signal.SIGKILL)
            return Trainer.step(self, k)

    cfg = tiny(steps=3)
    cfg.run.max_learner_restarts = 1
    with pytest.raises(LearnerLostError, match=r"died 2 times \(run.max_learner_restarts=1\)"):
        run_supervised(AlwaysKill(cfg, str(tmp_path)))


def test_resume_skips_half_written_and_damaged_checkpoints(ray_cluster, reference_run, tmp_path,
                                                          caplog):
    """One run (a copy of the reference run of `checkpointed()`), three kinds of bad checkpoint:
    a crash mid-write leaves a temp dir, or (between rename and marker on a filesystem without
    atomic rename) a ckpt dir without COMPLETE: both are never listed; the newest complete one
    with damaged tensors is refused with a warning, and the run resumes from the one before it
    and ends with one row per step."""
    cfg = checkpointed()  # 6 steps, a checkpoint every 2, the newest 2 kept
    shutil.copytree(reference_run(cfg), tmp_path, dirs_exist_ok=True)
    os.makedirs(tmp_path / ".tmp-ckpt-000008-999")
    os.makedirs(tmp_path / "ckpt-000008")
    (tmp_path / "ckpt-000008" / "learner.json").write_bytes(b"truncated")
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path))] == [
        "ckpt-000004", "ckpt-000006"]  # the run's end (step 6) is one too
    data = (tmp_path / "ckpt-000006" / "learner.safetensors").read_bytes()
    (tmp_path / "ckpt-000006" / "learner.safetensors").write_bytes(data[: len(data) // 2])
    cfg.run.steps = 7
    with caplog.at_level("WARNING", logger="homerl.train"):
        resumed = Trainer(cfg, str(tmp_path), resume=True)
    try:
        assert resumed.start == 4
        resumed.run()
    finally:
        resumed.shutdown()
    assert any("ckpt-000006" in r.message and "previous checkpoint" in r.message
               and "ckpt-000004" in r.message for r in caplog.records)
    rows = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == list(range(7))


def test_a_hung_learner_step_is_killed_and_restored(ray_cluster, tmp_path):
    from launch.driver.supervise import run_supervised

    class StopsLearner(Trainer):
        """SIGSTOPs the learner's process as step 3's update starts (first life only)."""

        def _learner_step(self, plan, batches):
            if self.learner_version == 3 and self.learner_restarts == 0:
                os.kill(ray.get(self.learner.placement.remote())["pid"], signal.SIGSTOP)
            return super()._learner_step(plan, batches)

    cfg = tiny(steps=5)
    cfg.run.checkpoint_every, cfg.run.learner_timeout_s = 2, 5.0
    summary = run_supervised(StopsLearner(cfg, str(tmp_path)))
    assert summary["learner_restarts"] == 1
    rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(5))
    assert [r["faults/learner_restarts"] for r in rows] == [0, 0, 1, 1, 1]
