"""The README's cluster path: `ray start --head`, then `ray job submit ... python -m launch.train`.

Starts a real head node on 127.0.0.1 with its own ports, submits the tiny preset, waits for the
job to succeed and checks its run directory. The cluster is stopped at the end.
"""

import json
import shutil

import pytest
from conftest import RAY, REPO, submit  # head_node: conftest's fixture


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
