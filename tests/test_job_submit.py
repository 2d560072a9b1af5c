"""The README's cluster path: `ray start --head`, then `ray job submit ... python -m launch.train`.

Starts a real head node on 127.0.0.1 with its own ports, submits the tiny preset, waits for the
job to succeed and checks its run directory. The cluster is stopped at the end.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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
def head_node(tmp_path, own_ray):
    """A `ray start --head` cluster of its own (the shared test cluster is shut down first: two
    clusters on 2 cores starve each other)."""
    gcs, dash = _free_port(), _free_port()
    # The job's `python` is the one on the head node's PATH: put this venv first, as a user
    # who ran `. .venv/bin/activate` before `ray start` would have it.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # Ray 2.60's `ray start` turns token auth on; the job CLI sends ~/.ray/auth_token only
    # when RAY_AUTH_MODE=token (README says the same).
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PATH": path, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    # `--block` in a session of its own: teardown kills exactly this cluster's processes.
    # (`ray stop` would kill every Ray cluster on the machine, a user's running jobs included.)
    # A private --temp-dir keeps its `ray_current_cluster` address file out of /tmp/ray, where a
    # later plain `ray.init()` in this test session would find it and try to join the dead head.
    temp_dir = tempfile.mkdtemp(prefix="rayh", dir="/tmp")  # short: unix socket paths are capped
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--num-cpus", "2",
         "--disable-usage-stats", "--temp-dir", temp_dir, *agent_ports()],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        wait_for_dashboard(address, env, head)
        yield address, env
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        shutil.rmtree(temp_dir, ignore_errors=True)


def agent_ports() -> list[str]:
    """Free ports for the per-node agents: the defaults (e.g. 52365) may belong to another Ray
    cluster on this machine, and then this head never gets a job agent."""
    flags = ["--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
             "--runtime-env-agent-port", "--metrics-export-port", "--ray-client-server-port"]
    return [x for flag in flags for x in (flag, str(_free_port()))]


def wait_for_dashboard(address: str, env: dict, head, attempts: int = 90) -> None:
    """Poll `ray job list` until the head answers (bounded), failing fast if the head died."""
    for _ in range(attempts):
        if head.poll() is not None:
            raise RuntimeError(f"ray start --head exited with {head.returncode}")
        if subprocess.run([RAY, "job", "list", "--address", address], env=env,
                          capture_output=True, timeout=60).returncode == 0:
            return
        time.sleep(2)
    raise TimeoutError(f"Ray dashboard at {address} did not answer")


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
