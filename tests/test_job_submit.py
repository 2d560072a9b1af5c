"""docs/cluster.md's path: `ray start --head`, then `ray job submit ... python -m launch.train`.

Starts a real head node on 127.0.0.1 with its own ports and submits the tiny preset; the job has
its learner SIGKILLed mid-run and must still succeed, with every step logged once and the final
adapter saved. A second job resumes the run and is ended by `ray job stop`: it stops after its
step with a checkpoint. A third, with a relative --run-dir, is refused. The cluster is stopped
at the end. (One head for all: a head node costs ~20 s of the suite's 2 cores, and a job that
survives the kill has shown the plain path.)
"""

import json
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest
from conftest import RAY, REPO, submit  # head_node: conftest's fixture

from common import metrics as M
from launch.app.runs import JOB_RUNTIME_ENV
from launch.rundir.writer import read_jsonl


def job_cmd(address: str, run_dir, *flags: str, submit=()) -> list[str]:
    """docs/cluster.md's command, with its runtime env (the one the web app submits)."""
    return [RAY, "job", "submit", "--address", address, "--working-dir", str(REPO),
            "--runtime-env-json", json.dumps(JOB_RUNTIME_ENV), *submit,
            "--", "python", "-m", "launch.train", "--preset", "tiny", "--run-dir", str(run_dir),
            *flags]


def learner_pids(session: int) -> list[int]:
    """PIDs of `ray::Learner` actor processes of the cluster whose processes share `session`."""
    pids = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                title = f.read()
            if title.startswith(b"ray::Learner") and os.getsid(int(name)) == session:
                pids.append(int(name))
        except (ValueError, OSError):  # not a process, or it ended while we looked
            continue
    return pids


@pytest.mark.slow
def test_job_submit_survives_a_killed_learner_and_ray_job_stop_keeps_its_step(head_node,
                                                                               tmp_path):
    """SIGKILL the learner of a submitted job once 30 steps are logged (after the step-20
    checkpoint): the job still succeeds with every step logged once and the restart counted.
    Then a job resuming that run is stopped by `ray job stop` (SIGTERM, then SIGKILL after
    RAY_JOB_STOP_WAIT_TIME_S): the driver stops after its step with a checkpoint of it."""
    run_dir, steps = tmp_path / "job-kill", 120  # ~0.15 s a step: the kill lands mid-run
    cmd = job_cmd(head_node.address, run_dir, "--steps", str(steps),
                  "--run.checkpoint_every", "20")
    done: dict = {}
    job = threading.Thread(target=lambda: done.update(proc=submit(cmd, head_node.env)))
    job.start()
    killed, deadline = None, time.monotonic() + 400
    while killed is None and job.is_alive() and time.monotonic() < deadline:
        logged = os.path.exists(run_dir / "metrics.jsonl") and (
            run_dir / "metrics.jsonl").read_bytes().count(b"\n") >= 30
        pids = learner_pids(head_node.session) if logged else []
        if pids:
            os.kill(pids[0], signal.SIGKILL)
            killed = pids[0]
        time.sleep(0.05)
    job.join(timeout=600)
    proc = done["proc"]
    # If the job ended first, say how: its own output is the only clue on a CI machine.
    assert killed is not None, ("the job ended before its learner could be killed "
                                f"(exit {proc.returncode}):\n{proc.stdout[-3000:]}"
                                f"\n{proc.stderr[-2000:]}")
    assert proc.returncode == 0 and "succeeded" in proc.stdout, proc.stdout[-3000:]
    rows = read_jsonl(str(run_dir / "metrics.jsonl"))
    assert [r[M.STEP] for r in rows] == list(range(steps))  # each step once, none lost
    assert rows[-1][M.LEARNER_RESTARTS] == 1
    assert "the learner died" in proc.stdout  # the job log says what happened
    assert (run_dir / "final" / "adapter_config.json").exists()
    stop_a_resumed_job(head_node, run_dir, steps)
    shutil.rmtree(run_dir, ignore_errors=True)
    # a relative --run-dir would be in Ray's copy of --working-dir: refused in one line
    proc = submit(job_cmd(head_node.address, "runs/rel"), head_node.env)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "launch.train: error: --run-dir runs/rel: a relative path in a Ray job" in proc.stdout


def stop_a_resumed_job(head_node, run_dir, done: int) -> None:
    """`ray job stop` a job that resumed `run_dir` (`done` steps) once it has logged 5 more."""
    job = "homerl-stop-test"
    cmd = job_cmd(head_node.address, run_dir, "--resume", str(run_dir), "--steps", "100000",
                  submit=("--submission-id", job, "--no-wait"))
    proc = submit(cmd, head_node.env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows, deadline = run_dir / "metrics.jsonl", time.monotonic() + 300
    while rows.read_bytes().count(b"\n") < done + 5 and time.monotonic() < deadline:
        time.sleep(0.2)

    def ray_job(verb: str) -> subprocess.CompletedProcess:
        return subprocess.run([RAY, "job", verb, "--address", head_node.address, job],
                              env=head_node.env, capture_output=True, text=True, timeout=300)

    assert ray_job("stop").returncode == 0  # returns once the job has ended
    log = ray_job("logs").stdout
    steps = [r[M.STEP] for r in read_jsonl(str(rows))]
    assert f"launch.train: stopped at step {len(steps)} (SIGTERM); resume with --resume " \
           f"{run_dir}" in log, log[-3000:]
    assert done + 5 <= len(steps) and steps == list(range(len(steps)))
    assert (run_dir / f"ckpt-{len(steps):06d}").is_dir()  # the step it stopped after is kept
