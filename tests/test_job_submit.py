"""The README's cluster path: `ray start --head`, then `ray job submit ... python -m launch.train`.

Starts a real head node on 127.0.0.1 with its own ports, submits the tiny preset, waits for the
job to succeed and checks its run directory. The cluster is stopped at the end.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def head_node(tmp_path):
    if ray_is_connected():
        pytest.skip("a Ray session is already connected in this process")
    gcs, dash = _free_port(), _free_port()
    # The job's `python` is the one on the head node's PATH: put this venv first, as a user
    # who ran `. .venv/bin/activate` before `ray start` would have it.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # Ray 2.60's `ray start` turns token auth on; the job CLI sends ~/.ray/auth_token only
    # when RAY_AUTH_MODE=token (README says the same).
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PATH": path, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    subprocess.run([RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
                    "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
                    "--num-cpus", "2", "--disable-usage-stats"],
                   check=True, env=env, capture_output=True, timeout=180)
    try:
        yield f"http://127.0.0.1:{dash}", env
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)


def ray_is_connected() -> bool:
    import ray

    return ray.is_initialized()


def submit(cmd, env, attempts: int = 20):
    """`ray job submit`, retried while the head's job agent is still starting (a loaded machine
    can take a while after `ray start` returns); any other failure is returned at once."""
    for _ in range(attempts):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
        if "No available agent to submit job" not in proc.stdout + proc.stderr:
            return proc
        time.sleep(3)
    return proc


@pytest.mark.slow
def test_job_submit_runs_tiny_preset(head_node, tmp_path):
    address, env = head_node
    run_dir = tmp_path / "job-run"
    cmd = [RAY, "job", "submit", "--address", address, "--working-dir", str(REPO),
           "--runtime-env-json", json.dumps({"excludes": [".venv", "runs", ".git"]}),
           "--", "python", "-m", "launch.train", "--preset", "tiny", "--steps", "3",
           "--run-dir", str(run_dir)]
    proc = submit(cmd, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "succeeded" in proc.stdout
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert (run_dir / "final" / "adapter_config.json").exists()
    shutil.rmtree(run_dir, ignore_errors=True)
