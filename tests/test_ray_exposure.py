"""What a run's Ray cluster lets in: a local cluster's ports refuse a client without the
cluster's token; pyproject's Ray floor is a version that turns token authentication on for
new local clusters; the cluster docs and the AWS config keep every port but SSH off the
internet."""

import os
import subprocess
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
TOKEN_AUTH_BY_DEFAULT = Version("2.59")  # Ray's first release with token auth on by default
JOIN = ("import ray; ray.init(address={!r}); "
        "print('JOINED', ray.get(ray.remote(lambda: 2).remote()), flush=True)")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _join(address: str, env: dict, wait_s: float = 90.0) -> str:
    """'joined', 'refused' (the GCS answered: authentication) or 'neither', within wait_s."""
    proc = subprocess.Popen([sys.executable, "-c", JOIN.format(address)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()  # extend() takes each line as it comes
    end = time.monotonic() + wait_s
    try:
        while time.monotonic() < end:
            text = "".join(lines)
            if "JOINED 2" in text:
                return "joined"
            if "InvalidAuthToken" in text or "AuthenticationError" in text:
                return "refused"
            if proc.poll() is not None and not reader.is_alive():
                return "neither"
            time.sleep(0.2)
        return "neither"
    finally:
        proc.kill()
        proc.wait()


def test_a_runs_local_cluster_refuses_a_client_without_its_token(tmp_path):
    """start_local_cluster (what launch.train and launch.evaluate call) in a process of its
    own; a client with no token is refused by the GCS, one that sends the token (the same
    user's HOME, RAY_AUTH_MODE=token) joins: the refusal is the token's, not the network's."""
    head = subprocess.Popen(
        [sys.executable, "-c", "import ray, time; from launch.driver.placement import "
         "start_local_cluster; start_local_cluster(1); "
         "print('GCS', ray.get_runtime_context().gcs_address, flush=True); time.sleep(600)"],
        env=_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        line = ""
        while not line.startswith("GCS"):
            line = head.stdout.readline()
            assert line or head.poll() is None, "the local cluster did not start"
        address = line.split()[1]
        assert not address.startswith("127.")  # reachable from the network: hence the token
        stranger = _env(HOME=str(tmp_path))  # no ~/.ray/auth_token there
        assert _join(address, stranger) == "refused"
        assert _join(address, _env(RAY_AUTH_MODE="token")) == "joined"  # sends ~/.ray's token
    finally:
        head.kill()
        head.wait()


def test_the_ray_floor_turns_token_auth_on_for_local_clusters():
    text = (ROOT / "pyproject.toml").read_text()
    reqs = [Requirement(line.strip().strip('",').split("#")[0].strip().strip('",'))
            for line in text.splitlines() if line.strip().startswith('"ray[')]
    (ray_req,) = reqs
    floor = min(Version(s.version) for s in ray_req.specifier if s.operator == ">=")
    assert floor >= TOKEN_AUTH_BY_DEFAULT
    assert Version(version("ray")) in ray_req.specifier


def test_the_cluster_docs_list_the_ports_and_keep_them_off_the_internet():
    doc = (ROOT / "docs" / "cluster.md").read_text()
    section = doc.split("## Ports", 1)[1].split("\n## ", 1)[0]
    for port in ("6379", "8265", "10001", "8080", "52365", "--min-worker-port"):
        assert port in section, port
    assert "RAY_AUTH_MODE=disabled" in section and "internet" in section


def test_the_aws_config_takes_a_security_group_that_admits_ssh_from_one_address():
    cfg = yaml.safe_load((ROOT / "cluster_configs" / "aws-gpu.yaml").read_text())
    text = (ROOT / "cluster_configs" / "aws-gpu.yaml").read_text()
    for node_type in cfg["available_node_types"].values():
        assert node_type["node_config"]["SecurityGroupIds"], node_type
    assert "--port 22" in text and "/32" in text
