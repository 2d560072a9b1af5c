"""The run directory under faults: what a crash, a power cut, a full disk, a second driver or a
wrong directory does to a run, with real files and real processes (no Ray; the end-of-run
checkpoint, with Ray actors, is tests/test_run_end.py).

* `--run-dir` refuses a non-empty directory that is not a run of this project (a model dir);
* `--resume` drops a torn last metrics line with one warning, refuses a malformed config.json
  and the flags a resume may not change in one line, applies and records the ones it may;
* the metrics rewrite of a resume and every checkpoint write are durable: a process killed at
  each cut point in turn always leaves a whole, loadable checkpoint (keep_checkpoints 1), and
  every file and directory is fsync'ed before anything older is removed;
* one driver per run directory (flock), a dead holder's lock taken over;
* safetensors' full-disk errors keep their errno.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import own_lines, without_ray

from common.presets import get_preset
from common.state_io import save_state
from launch.cli import resolve_run
from launch.rundir import writer as writer_module
from launch.rundir.checkpoints import (
    DriverState,
    checkpoint_path,
    checkpoint_tmp,
    commit_checkpoint,
    list_checkpoints,
)
from launch.rundir.writer import RunWriter, _truncate_jsonl, read_jsonl, write_json

ROOT = Path(__file__).resolve().parents[1]
MARKER, LOCK, HISTORY = ".homerl-run", ".homerl-lock", "config-history.jsonl"  # run_dir.py's


def tiny_run_dir(path: Path, steps: int = 4) -> Path:
    """A run directory as a driver leaves it before training: marker and config.json."""
    cfg = get_preset("tiny")
    cfg.run.steps = steps
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text("{}\n")
    write_json(str(path / "config.json"), cfg.to_dict())
    return path


def refused(capsys, argv) -> str:
    """resolve_run(argv) must exit 2 with one stderr line; returns it."""
    with pytest.raises(SystemExit) as e:
        resolve_run(argv)
    assert e.value.code == 2
    err = without_ray(capsys.readouterr().err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ---- 1. --run-dir takes only a new, empty or pre-created run directory ------------------------
def test_run_dir_refuses_a_model_dir_and_any_other_non_run_directory(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"\0" * 16)
    err = refused(capsys, ["--preset", "tiny", "--run-dir", str(model)])
    assert err == (f"launch.train: error: --run-dir {model} is not empty and is not a homerl run "
                   "(it holds config.json, model.safetensors): pick a new or empty directory; "
                   "to continue a run of this project use --resume RUN_DIR")
    assert (model / "config.json").read_text() == '{"model_type": "llama"}'
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors"]
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("x")
    assert "is not a homerl run (it holds todo.txt)" in refused(
        capsys, ["--preset", "tiny", "--run-dir", str(other)])
    trained = tmp_path / "trained"  # a run with checkpoints but no metrics.jsonl
    (trained / "ckpt-000002").mkdir(parents=True)
    assert "already holds a run (ckpt-000002): continue it with --resume" in refused(
        capsys, ["--preset", "tiny", "--run-dir", str(trained)])


def test_run_dir_takes_an_empty_dir_and_the_web_apps_pre_created_one(tmp_path):
    from launch.cli import open_run

    (tmp_path / "empty").mkdir()
    app = tiny_run_dir(tmp_path / "app")  # app.runs.start_run: marker + config.json, then spawn
    (app / "app.log").write_text("")
    for d in (tmp_path / "empty", app, tmp_path / "new"):
        cfg, run_dir, resume, lock, _ = open_run(["--preset", "tiny", "--run-dir", str(d)])
        lock.release()
        assert run_dir == str(d) and not resume and (d / MARKER).exists()
        assert json.loads((d / HISTORY).read_text())["event"] == "start"


def test_a_relative_run_dir_in_a_ray_jobs_working_dir_copy_is_refused(tmp_path, capsys,
                                                                      monkeypatch):
    """Under `ray job submit --working-dir .` the driver runs in Ray's temporary copy of the
    directory (Ray tells it so in RAY_JOB_CONFIG_JSON_ENV_VAR): a relative --run-dir or
    --resume, the default run directory included, or launch.evaluate's --out, would be deleted
    with the cluster."""
    monkeypatch.chdir(tmp_path)
    job = {"runtime_env": {"working_dir": "gcs://_ray_pkg_0123abcd.zip"}, "metadata": {}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    err = refused(capsys, ["--preset", "tiny", "--run-dir", "runs/demo"])
    assert err == ("launch.train: error: --run-dir runs/demo: a relative path in a Ray job is "
                   f"inside Ray's temporary copy of --working-dir ({tmp_path}), deleted with the "
                   "cluster: give an absolute one ($PWD/runs/demo)")
    assert refused(capsys, ["--preset", "tiny"]).startswith("launch.train: error: --run-dir runs/")
    assert refused(capsys, ["--resume", "runs/demo"]).startswith(
        "launch.train: error: --resume runs/demo: a relative path in a Ray job")
    from launch.evaluate.__main__ import main as evaluate  # here: the only user of torch

    assert evaluate(["--model", "tiny-random-llama", "--out", "r.json"]) == 2
    assert without_ray(capsys.readouterr().err).startswith(
        "launch.evaluate: error: --out r.json: a relative path in a Ray job")
    assert not (tmp_path / "runs").exists()
    # an absolute path is taken; so is a relative one in a job without --working-dir, or outside
    for env in (job, {"runtime_env": {}, "metadata": {}}, None):
        if env is None:
            monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
        else:
            monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(env))
        run_dir = str(tmp_path / "abs") if env is job else "rel"
        _, got, _, _, _ = resolve_run(["--preset", "tiny", "--run-dir", run_dir])
        assert got == run_dir


# ---- 2 and 5. a torn metrics line; the resume's rewrite is atomic -----------------------------
def test_resume_drops_a_torn_last_metrics_line_with_one_warning(tmp_path, caplog):
    run = tiny_run_dir(tmp_path / "run")
    rows = "".join(json.dumps({"step": k, "x": k}) + "\n" for k in range(4))
    (run / "metrics.jsonl").write_text(rows + '{"step": 4, "x"')  # the driver died mid-write
    (run / "samples.jsonl").write_text('{"step": 0, "completion": "a"}\n{"step": 2, "compl')
    with caplog.at_level("WARNING", logger="homerl.train"):
        writer = RunWriter(str(run), get_preset("tiny").to_dict(), resume_step=3)
    warned = [r.message for r in caplog.records if "torn" in r.message]
    assert len(warned) == 2 and "metrics.jsonl: dropped a torn last line" in warned[0]
    assert [r["step"] for r in writer.metrics()] == [0, 1, 2]
    writer.log({"step": 3, "x": 3})  # appends after whole rows, not onto the torn one
    assert [r["step"] for r in read_jsonl(str(run / "metrics.jsonl"))] == [0, 1, 2, 3]
    assert (run / "samples.jsonl").read_text() == '{"step": 0, "completion": "a"}\n'


def test_the_resume_rewrite_of_metrics_keeps_the_old_file_if_it_fails(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    old = "".join(json.dumps({"step": k}) + "\n" for k in range(5))
    path.write_text(old)
    calls = []

    def dies_on_the_third_row(obj, *a, **kw):
        calls.append(obj)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return json.JSONEncoder().encode(obj)

    monkeypatch.setattr(writer_module.json, "dumps", dies_on_the_third_row)
    with pytest.raises(OSError):
        _truncate_jsonl(str(path), 4)
    monkeypatch.undo()
    assert path.read_text() == old and os.listdir(tmp_path) == ["metrics.jsonl"]
    from common import durable

    events = []
    monkeypatch.setattr(durable, "HOOK", lambda event, p: events.append((event, p)))
    _truncate_jsonl(str(path), 4)
    assert [e for e, _ in events] == ["write", "fsync", "rename", "fsync"]  # data, then the dir
    assert events[-1] == ("fsync", str(tmp_path))
    assert [r["step"] for r in read_jsonl(str(path))] == [0, 1, 2, 3]


# ---- 3 and 4. the resumed run's config ---------------------------------------------------------
@pytest.mark.parametrize("text,want", [
    ("{not json", "config.json: not valid JSON (Expecting property name"),
    ('{"run": {"steps": 4, "stepz": 5}}', "config.json: run: unknown key(s) ['stepz']"),
    ('{"run": {"steps": "many"}}', "config.json: run.steps"),
    ("[1, 2]", "config.json: not a run's config"),
])
def test_resume_with_a_bad_config_json_is_one_line(tmp_path, capsys, text, want):
    run = tiny_run_dir(tmp_path / "run")
    (run / "config.json").write_text(text)
    err = refused(capsys, ["--resume", str(run)])
    assert err.startswith(f"launch.train: error: --resume: {run}/") and want in err, err


def test_resume_refuses_flags_that_change_what_is_learnt(tmp_path, capsys):
    run = tiny_run_dir(tmp_path / "run")
    err = refused(capsys, ["--resume", str(run), "--grpo.lr", "0.5", "--seed", "7",
                           "--steps", "9"])
    assert f"--resume {run}: --grpo.lr, --run.seed cannot change on resume" in err, err
    assert "A resume may change: --run.steps, --run.checkpoint_every" in err
    assert "--preset cannot" in refused(capsys, ["--resume", str(run), "--preset", "cpu-demo"])
    assert "--run-dir" in refused(capsys, ["--resume", str(run), "--run-dir", str(tmp_path)])
    assert json.loads((run / "config.json").read_text())["run"]["steps"] == 4  # untouched


def test_resume_applies_the_flags_it_may_change_and_records_them(tmp_path):
    from launch.cli import open_run

    run = tiny_run_dir(tmp_path / "run")
    argv = ["--resume", str(run), "--steps", "9", "--run.keep_checkpoints", "3",
            "--seed", "0", "--preset", "tiny"]  # the run's own seed and preset: no change
    cfg, run_dir, resume, lock, _ = open_run(argv)
    lock.release()
    assert resume and cfg.run.steps == 9 and cfg.run.keep_checkpoints == 3
    assert cfg.grpo.lr == get_preset("tiny").grpo.lr
    resumed = [json.loads(x) for x in (run / HISTORY).read_text().splitlines()][-1]
    assert resumed["event"] == "resume" and resumed["argv"] == argv
    assert resumed["changes"] == {"run.steps": [4, 9], "run.keep_checkpoints": [2, 3]}


# ---- 6. checkpoints: durable, and whole at every cut point ------------------------------------
def _write_checkpoint(run_dir: str, step: int, keep: int) -> None:
    """What a Trainer checkpoint writes (a learner part, then the driver's), without Ray."""
    tmp = checkpoint_tmp(run_dir, step)
    save_state(tmp, "learner", {"w": np.full(256, step, np.float32)}, {"step": step})
    commit_checkpoint(run_dir, tmp, step, DriverState(step, 0, {}, 0), keep)


def test_every_file_and_directory_is_fsynced_before_an_older_checkpoint_goes(tmp_path,
                                                                             monkeypatch):
    from common import durable

    run = str(tmp_path)
    _write_checkpoint(run, 1, keep=1)
    events = []
    monkeypatch.setattr(durable, "HOOK", lambda event, p: events.append((event, p)))
    _write_checkpoint(run, 2, keep=1)
    new = checkpoint_path(run, 2)
    (into,) = [i for i, (e, p) in enumerate(events) if e == "rename" and p.endswith(new)]
    tmp = events[into][1].split(" -> ")[0]
    prune = min(i for i, (e, p) in enumerate(events) if p.startswith(os.path.join(run,
                                                                                  "ckpt-000001")))
    synced = {p for e, p in events[:into] if e == "fsync"}
    assert {os.path.join(tmp, n) for n in os.listdir(new)} | {tmp} <= synced
    assert ("fsync", run) in events[into:prune]  # the rename is on disk before the prune
    assert [os.path.basename(p) for p in list_checkpoints(run)] == ["ckpt-000002"]


_SWEEP = r"""
import json, os, shutil, sys
sys.path.insert(0, os.path.join(sys.argv[2], "tests"))
from test_run_dir import _write_checkpoint
from common import durable
from common.state_io import load_state
from launch.rundir.checkpoints import (check_checkpoint, list_checkpoints, load_driver_state,
                                       newest_readable)
from launch.rundir.writer import _truncate_jsonl, read_jsonl


root = sys.argv[1]
base = os.path.join(root, "base")
_write_checkpoint(base, 1, keep=1)
with open(os.path.join(base, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps({"step": k}) + "\n" for k in range(6))
out, n = [], 0
while True:
    n += 1
    run = os.path.join(root, f"cut-{n}")
    shutil.copytree(base, run)
    pid = os.fork()
    if pid == 0:  # the writer: killed at its nth cut point
        os.environ[durable.CUT_ENV], durable._cuts = str(n), 0
        _truncate_jsonl(os.path.join(run, "metrics.jsonl"), 4)
        _write_checkpoint(run, 2, keep=1)
        _write_checkpoint(run, 3, keep=1)
        os._exit(0)
    killed = os.WIFSIGNALED(os.waitpid(pid, 0)[1])
    listed = list_checkpoints(run)
    for ckpt in listed:
        check_checkpoint(ckpt)  # every listed one is whole
    newest = newest_readable(listed)
    step = load_driver_state(newest).step
    w = load_state(newest, "learner", numpy=True)[0]["w"]
    rows = read_jsonl(os.path.join(run, "metrics.jsonl"))
    out.append({"killed": killed, "newest": os.path.basename(newest), "step": step,
                "w": sorted(set(w.tolist())), "rows": len(rows), "listed": len(listed)})
    shutil.rmtree(run)
    if not killed:
        break
print(json.dumps(out))
"""


def test_a_whole_checkpoint_survives_a_kill_at_every_cut_point(tmp_path):
    """keep_checkpoints 1: the writer is SIGKILLed at each cut point of a metrics rewrite and
    two checkpoint writes in turn; each time the newest listed checkpoint loads whole (driver
    and learner of one step), and metrics.jsonl is the old file or the new one."""
    proc = subprocess.run([sys.executable, "-c", _SWEEP, str(tmp_path), str(ROOT)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    cuts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(cuts) > 30 and all(c["killed"] for c in cuts[:-1]) and not cuts[-1]["killed"]
    for c in cuts:
        assert c["w"] == [c["step"]] and c["newest"] == f"ckpt-{c['step']:06d}", c
        assert c["rows"] in (6, 4), c
    assert [c["step"] for c in cuts] == sorted(c["step"] for c in cuts)  # never back
    assert {c["step"] for c in cuts} == {1, 2, 3} and cuts[-1]["listed"] == 1


# ---- 7. one driver per run directory --------------------------------------------------------
_HOLD = """
import sys, time
from launch.rundir.ownership import lock_run
lock = lock_run(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_driver_is_refused_and_a_dead_holders_lock_is_taken_over(tmp_path):
    from launch.rundir.ownership import RunBusyError, lock_run

    run = tiny_run_dir(tmp_path / "run")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ""}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        for argv in (["--resume", str(run), "--steps", "6"],
                     ["--preset", "tiny", "--run-dir", str(run)]):
            proc = subprocess.run([sys.executable, "-m", "launch.train", *argv], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 2, proc.stderr[-2000:]
            (line,) = proc.stderr.strip().splitlines()
            assert line.startswith(f"launch.train: error: {run} is being written by another "
                                   f"driver (pid {holder.pid} on host "), line
            assert " since 20" in line
        assert time.monotonic() - t0 < 120  # refused before any actor starts
        with pytest.raises(RunBusyError, match=f"pid {holder.pid}"):
            lock_run(str(run))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = lock_run(str(run))  # the holder is dead: its flock went with it
    try:
        info = json.loads((run / LOCK).read_text())
        assert info["pid"] == os.getpid()
    finally:
        lock.release()
    assert json.loads((run / "config.json").read_text())["run"]["steps"] == 4  # untouched


# ---- 9. a full disk under safetensors keeps its errno -----------------------------------------
@pytest.mark.parametrize("raised,code", [
    (OSError(errno.ENOSPC, "No space left on device"), errno.ENOSPC),
    (Exception("Error while serializing: I/O error: Disk quota exceeded (os error 122)"),
     errno.EDQUOT),
    (Exception("Error while serializing: I/O error: No space left on device (os error 28)"),
     errno.ENOSPC),
])
def test_a_full_disk_under_safetensors_is_an_oserror_with_its_errno(tmp_path, monkeypatch,
                                                                     raised, code):
    import safetensors.numpy

    def save_file(*a, **kw):
        raise raised

    monkeypatch.setattr(safetensors.numpy, "save_file", save_file)
    with pytest.raises(OSError) as err:
        save_state(str(tmp_path), "driver", {"x": np.zeros(3)}, {})
    assert err.value.errno == code
    from common import durable

    assert durable.disk_full(err.value)
    assert err.value.filename == str(tmp_path / "driver.safetensors")
    assert str(tmp_path / "driver.safetensors") in str(err.value)


def test_a_bug_in_safetensors_is_not_taken_for_a_full_disk(tmp_path, monkeypatch):
    import safetensors.numpy

    def save_file(*a, **kw):
        raise TypeError("bad dtype")

    monkeypatch.setattr(safetensors.numpy, "save_file", save_file)
    with pytest.raises(TypeError):
        save_state(str(tmp_path), "driver", {"x": np.zeros(3)}, {})


# ---- every entry point that writes a run opens it the same way; no symlink is followed ---------
def _demo_refused(capsys, argv) -> str:
    from launch import demo

    with pytest.raises(SystemExit) as e:
        demo.main(argv)
    assert e.value.code == 2
    err = without_ray(capsys.readouterr().err)
    assert len(err.splitlines()) == 1 and err.startswith("launch.demo: error: "), err
    return err


def test_the_demo_opens_its_run_dir_as_launch_train_does(tmp_path, capsys):
    """launch.demo --run-dir gets launch.train's protections before anything is written: no
    directory that is not a run, no trained run (its final/ and checkpoints stay), no run a
    live driver holds, no --resume but of a stopped demo; a new directory is marked, locked and
    in the history."""
    from launch.rundir.ownership import lock_run

    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_text("x")
    assert "is not empty and is not a homerl run" in _demo_refused(
        capsys, ["--preset", "tiny", "--run-dir", str(model)])
    assert sorted(os.listdir(model)) == ["weights.bin"]
    trained = tiny_run_dir(tmp_path / "trained")
    (trained / "metrics.jsonl").write_text('{"step": 0}\n')
    (trained / "final").mkdir()
    before = sorted(os.listdir(trained))
    assert "already holds a run" in _demo_refused(
        capsys, ["--preset", "tiny", "--run-dir", str(trained)])
    assert sorted(os.listdir(trained)) == before
    busy = tiny_run_dir(tmp_path / "busy")
    held = lock_run(str(busy))
    try:
        assert "is being written by another driver (pid" in _demo_refused(
            capsys, ["--preset", "tiny", "--run-dir", str(busy)])
    finally:
        held.release()
    assert "holds no base-model scores (demo-before.json)" in _demo_refused(
        capsys, ["--resume", str(trained)])  # a run, but not a demo's
    (trained / "demo-before.json").write_text("{}")
    (trained / "demo.json").write_text("{}")
    assert "this demo has finished" in _demo_refused(capsys, ["--resume", str(trained)])


def test_the_lock_and_the_history_never_follow_a_planted_symlink(tmp_path, capsys):
    """A symbolic link planted as RUN_DIR/.homerl-lock or config-history.jsonl would make the
    lock truncate, or the history append to, any file its target names: refused in one line,
    the target untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in (LOCK, HISTORY):
        run = tiny_run_dir(tmp_path / f"run-{name}")
        (run / name).symlink_to(victim)
        with pytest.raises(SystemExit) as e:
            from launch.cli import open_run

            open_run(["--preset", "tiny", "--run-dir", str(run)])
        assert e.value.code == 2
        err = without_ray(capsys.readouterr().err)
        assert len(err.splitlines()) == 1 and "is a symbolic link" in err, err
        assert victim.read_text() == "precious\n"


def test_a_demo_refused_before_training_is_one_line_and_leaves_no_directory(tmp_path, capsys,
                                                                             monkeypatch):
    """A dataset the demo cannot use fails in its first seconds: one line (no traceback),
    exit 2, and the new run directory (its demo.log included) is gone, as launch.train leaves
    none."""
    from launch import demo
    from launch.driver import trainer

    monkeypatch.setattr(trainer, "connect", lambda cfg: pytest.fail("an actor would start"))
    bad = tmp_path / "bad.csv"
    bad.write_text("question,answer\n,1\n,2\n,3\n")
    run = tmp_path / "run"
    capsys.readouterr()
    assert demo.main(["--preset", "tiny", "--curriculum.task", "file", "--curriculum.data_path",
                      str(bad), "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    ours = own_lines(err, "launch.demo")
    assert len(ours) == 1 and ours[0].startswith("launch.demo: error: ") and \
        "missing prompt" in ours[0] and "Traceback" not in err, err
    assert not run.exists()


def test_an_untouched_run_goes_with_its_log_and_a_touched_one_keeps_it(tmp_path):
    """remove_if_untouched(also=...): the entry point's log goes with an otherwise untouched
    directory; a directory holding anything else stays whole, that log included."""
    from launch.rundir.ownership import HISTORY, remove_if_untouched

    for extra in ([], ["config.json"]):
        run = tmp_path / f"run{len(extra)}"
        run.mkdir()
        for name in (HISTORY, "demo.log", *extra):
            (run / name).write_text("x")
        remove_if_untouched(str(run))  # the log is not the module's own: kept
        assert (run / "demo.log").exists()
        remove_if_untouched(str(run), also=frozenset({"demo.log"}))
        assert run.exists() == bool(extra) and (not extra or (run / "demo.log").exists())
