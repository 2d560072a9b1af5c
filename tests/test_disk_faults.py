"""Disk faults with real files on a real (small tmpfs) disk: nothing lost, nothing half-written.

* a checkpoint the full disk refuses is removed half-written, counted, and the run goes on
  (`run.checkpoint_fail_policy=continue`) or stops with one line (`stop`), keeping the previous;
  the same when the run directory turns read-only; one that is unwritable from the start is a
  one-line error before any actor starts;
* metrics and sample rows the disk refuses are kept and written with the next ones;
* a wandb that dies mid-run is turned off with one warning; metrics.jsonl keeps every row.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import own_lines
from test_faults import run_to_end, tiny

from launch.driver.trainer import Trainer
from launch.rundir.checkpoints import check_checkpoint, list_checkpoints
from launch.rundir.writer import RunWriter, read_jsonl, write_json

ROOT = Path(__file__).resolve().parents[1]


def fill(path, leave: int = 0) -> str:
    """Fill the disk holding `path` up to `leave` free bytes; returns the filler's path."""
    st = os.statvfs(path)
    filler = os.path.join(path, "filler")
    with open(filler, "wb") as f:
        f.write(b"\0" * (st.f_bavail * st.f_frsize - leave))
    return filler


def _mount_tmpfs(mnt, options: str) -> None:
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode})")


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs (a disk that can really fill up); skipped where mounting is not allowed."""
    mnt = tmp_path / "disk"
    _mount_tmpfs(mnt, "size=16m")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def remount(mnt, mode: str) -> None:
    """Make the tmpfs at `mnt` read-only ("ro") or writable again ("rw")."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True)


class FillsDisk(Trainer):
    """Fills the run's disk (leaving 64 KiB) while it writes the checkpoint of step FULL_AT."""

    FULL_AT = 2

    def checkpoint(self, step):
        if step != self.FULL_AT:
            return super().checkpoint(step)
        filler = fill(self.run_dir, leave=64 * 1024)
        try:
            return super().checkpoint(step)
        finally:
            os.remove(filler)


def test_a_full_disk_skips_one_checkpoint_and_keeps_the_run(ray_cluster, small_disk):
    cfg = tiny(steps=5)
    cfg.run.checkpoint_every = 2
    summary = run_to_end(FillsDisk(cfg, str(small_disk / "run")))
    run = small_disk / "run"
    rows = read_jsonl(str(run / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(5)) and summary["steps"] == 5
    assert [r["faults/checkpoint_failures"] for r in rows] == [0, 1, 1, 1, 1]
    assert [os.path.basename(p) for p in list_checkpoints(str(run))] == [
        "ckpt-000004", "ckpt-000005"]  # the run's end is a checkpoint too
    assert not [p for p in os.listdir(run) if p.startswith(".tmp-")]  # no half-written dir


def test_a_full_disk_with_policy_stop_is_one_line_and_keeps_the_previous_checkpoint(
        ray_cluster, small_disk):
    from launch.driver.checkpointing import CheckpointWriteError

    class FullAt4(FillsDisk):
        FULL_AT = 4

    cfg = tiny(steps=6)
    cfg.run.checkpoint_every, cfg.run.checkpoint_fail_policy = 2, "stop"
    with pytest.raises(CheckpointWriteError, match=r"checkpoint of step 4 not written "
                                                   r"\(OSError: .*No space left") as err:
        run_to_end(FullAt4(cfg, str(small_disk / "run")))
    assert "\n" not in str(err.value)
    run = str(small_disk / "run")
    assert [os.path.basename(p) for p in list_checkpoints(run)] == ["ckpt-000002"]
    check_checkpoint(os.path.join(run, "ckpt-000002"))  # intact


def test_an_unwritable_run_dir_is_one_line_before_anything_starts(tmp_path):
    mnt = tmp_path / "ro"
    _mount_tmpfs(mnt, "size=1m,ro")
    try:
        proc = subprocess.run([sys.executable, "-m", "launch.train", "--preset", "tiny",
                               "--steps", "2", "--run-dir", str(mnt / "run")],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "RAY_ADDRESS": ""})
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == (f"launch.train: error: --run-dir {mnt / 'run'}: {mnt} is "
                                   "not writable (a read-only file system)")


def test_a_model_cache_too_full_for_the_fp32_copy_is_one_line_and_leaves_nothing(small_disk,
                                                                                  tmp_path):
    """A bf16 model's fp32 copy (common/shared_weights.py) is written by the actors that load
    it: a full disk there is one line naming the cache and the ways out (exit 2, no run
    directory left), not an actor's traceback, and no half-written entry stays in the cache."""
    import torch

    from common.tiny_model import build_tiny_qwen2

    model, tokenizer = build_tiny_qwen2(seed=3)
    src = tmp_path / "bf16"
    model.to(torch.bfloat16).save_pretrained(src)
    tokenizer.save_pretrained(src)
    fill(str(small_disk), leave=64 * 1024)  # the copy needs ~0.4 MiB
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--preset", "tiny", "--model",
                           str(src), "--steps", "1", "--run-dir", str(run)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_ADDRESS": "", "HOMERL_CACHE": str(small_disk),
                               "HOMERL_SHARE_WEIGHTS": "1"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = own_lines(proc.stderr, "launch.train")
    assert len(err) == 1, proc.stderr[-3000:]
    assert proc.stderr.rstrip().splitlines()[-1] == err[0]  # last, below Ray's actor traceback
    assert err[0].startswith(f"launch.train: error: an actor could not start: CacheWriteError: "
                             f"the model cache {small_disk / 'models'} could not take bf16-")
    assert "(No space left on device)" in err[0] and "HOMERL_SHARE_WEIGHTS=0" in err[0], err[0]
    kib = 2 * (src / "model.safetensors").stat().st_size / 1024  # fp32: twice the bf16 bytes
    assert f"the fp32 copy of {src} takes about {kib:.1f} KiB)" in err[0], err[0]
    assert not run.exists()
    assert [p.name for p in (small_disk / "models").iterdir() if not p.name.endswith(".lock")
            ] == []


def test_a_model_cache_gone_read_only_still_serves_and_prunes_later(small_disk, tmp_path,
                                                                     monkeypatch):
    """Pruning stale conversions is housekeeping: on a cache this process cannot write (a
    shared cache, read-only to users) a stale entry stays and the live conversion is served;
    once the cache is writable again the stale one goes."""
    import torch

    from common.shared_weights import shared_checkpoint
    from common.tiny_model import build_tiny_qwen2

    def save_bf16(folder):
        model, tokenizer = build_tiny_qwen2(seed=3)
        model.to(torch.bfloat16).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return folder

    monkeypatch.setenv("HOMERL_CACHE", str(small_disk))
    monkeypatch.setenv("HOMERL_SHARE_WEIGHTS", "1")
    live, gone = save_bf16(tmp_path / "live"), save_bf16(tmp_path / "gone")
    served = shared_checkpoint(str(live), torch.float32)
    stale = Path(shared_checkpoint(str(gone), torch.float32)).name
    shutil.rmtree(gone)
    remount(small_disk, "ro")
    try:
        assert shared_checkpoint(str(live), torch.float32) == served
    finally:
        remount(small_disk, "rw")
    models = small_disk / "models"
    assert stale in [p.name for p in models.iterdir()]
    assert shared_checkpoint(str(live), torch.float32) == served
    assert sorted(p.name for p in models.iterdir() if not p.name.startswith(".")) == [
        Path(served).name]


def test_a_run_dir_holding_a_run_is_refused_unless_resumed(tmp_path):
    """A second run into a run's directory would append to its metrics.jsonl (two runs mixed in
    one curve): refused in one line, before any actor starts, and the run's files untouched."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--preset", "tiny",
                           "--steps", "2", "--run-dir", str(run)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_ADDRESS": ""})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == (f"launch.train: error: --run-dir {run} already holds a run "
                                   f"(metrics.jsonl): continue it with --resume {run}, or pick "
                                   "another --run-dir")
    assert (run / "metrics.jsonl").read_text() == '{"step": 0}\n'
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


def test_a_run_dir_gone_read_only_skips_the_checkpoint_and_keeps_the_run(ray_cluster,
                                                                          small_disk):
    class ReadOnlyAt2(Trainer):
        def checkpoint(self, step):
            if step != 2:
                return super().checkpoint(step)
            remount(small_disk, "ro")
            try:
                return super().checkpoint(step)
            finally:
                remount(small_disk, "rw")

    cfg = tiny(steps=5)
    cfg.run.checkpoint_every = 2
    run = small_disk / "run"
    summary = run_to_end(ReadOnlyAt2(cfg, str(run)))
    rows = read_jsonl(str(run / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(5)) and summary["steps"] == 5
    assert [r["faults/checkpoint_failures"] for r in rows] == [0, 1, 1, 1, 1]
    assert [os.path.basename(p) for p in list_checkpoints(str(run))] == [
        "ckpt-000004", "ckpt-000005"]  # the run's end is a checkpoint too


def test_metrics_rows_refused_by_a_full_disk_are_written_later_not_lost(small_disk):
    writer = RunWriter(str(small_disk / "run"), tiny().to_dict())
    writer.log({"step": 0, "x": 1.0})
    writer.samples(0, [{"completion": "a"}])
    samples = small_disk / "run" / "samples.jsonl"
    fill(str(small_disk))
    pad = "x" * 8192  # more than the slack of the file's last block
    writer.log({"step": 1, "pad": pad})
    writer.samples(1, [{"completion": pad}, {"completion": "b"}])  # refused, not raised
    writer.log({"step": 2, "pad": pad})
    assert [r["step"] for r in writer.metrics()] == [0]  # nothing half-written
    assert [r["step"] for r in read_jsonl(str(samples))] == [0]
    os.remove(small_disk / "filler")
    writer.log({"step": 3, "x": 4.0})
    writer.samples(3, [{"completion": "c"}])
    assert [r["step"] for r in writer.metrics()] == [0, 1, 2, 3]
    assert [r["completion"][:1] for r in read_jsonl(str(samples))] == list("axbc")


_DEAD_WANDB = """
import json, os, sys
import psutil

from launch.rundir.writer import RunWriter
from test_faults import tiny
cfg = tiny().to_dict()
cfg["run"]["wandb_project"] = "homerl-test"
writer = RunWriter(sys.argv[1], cfg)
writer.log({"step": 0, "x": 1.0})
service = psutil.Process().children(recursive=True)  # wandb's service, its only children
names = sorted(p.name() for p in service)
for p in service:
    p.kill()
psutil.wait_procs(service, timeout=30)
for k in range(1, 4):
    writer.log({"step": k, "x": float(k)})
writer.summary({"steps": 4})
sys.modules.pop("transformers", None)
import transformers  # a module wandb hooks: the hook must be gone with the dead service
print(json.dumps({"names": names, "wandb": writer.wandb is None, "error": writer.wandb_error,
                  "steps": [r["step"] for r in writer.metrics()]}))
"""


def test_a_dead_wandb_turns_wandb_off_and_the_run_keeps_every_row(tmp_path):
    """Real wandb (offline) in its own process: its service is SIGKILLed mid-run (what a full
    disk or an OOM kill does to it); logging goes on into metrics.jsonl, summary() does not
    raise, and a later import of a module wandb hooks (transformers) does not raise either."""
    pytest.importorskip("psutil")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_API_KEY": "",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    # An earlier wandb run in this test process left its service's address in WANDB_SERVICE;
    # inherited, the child would use that service instead of starting its own to kill.
    env.pop("WANDB_SERVICE", None)
    proc = subprocess.run([sys.executable, "-c", _DEAD_WANDB, str(tmp_path / "run")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert any(n.startswith("wandb") for n in out["names"]), out
    assert out["wandb"] and "Connection" in out["error"]
    assert out["steps"] == [0, 1, 2, 3]


def test_config_json_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """The web app reads config.json while the driver rewrites it (a CI run once read it empty):
    a write that fails midway leaves the previous file whole and no temp file behind."""
    path = str(tmp_path / "config.json")
    write_json(path, {"run": {"steps": 40}})

    def dies_midway(obj, f, **kw):
        f.write('{"run": ')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", dies_midway)
    with pytest.raises(OSError):
        write_json(path, {"run": {"steps": 80}})
    monkeypatch.undo()
    assert json.loads(Path(path).read_text()) == {"run": {"steps": 40}}
    assert os.listdir(tmp_path) == ["config.json"]
