"""What a run's Ray cluster lets in: every port of a local cluster but its Prometheus
endpoints refuses a client without the cluster's token; pyproject's Ray floor is a version
that turns token authentication on for new local clusters; the cluster docs and the AWS config
keep every port but SSH off the internet."""

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from importlib.metadata import version
from pathlib import Path

import grpc
import psutil
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
TOKEN_AUTH_BY_DEFAULT = Version("2.59")  # Ray's first release with token auth on by default
HEAD = ("import json, ray, time; from launch.driver.placement import start_local_cluster; "
        "start_local_cluster(1); ray.get(ray.remote(lambda: 1).remote()); "
        "print('UP', json.dumps(ray.nodes()[0], default=str), "
        "ray.get_runtime_context().gcs_address, flush=True); time.sleep(600)")
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


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory):
    """start_local_cluster (what launch.train and launch.evaluate call) in a process of its
    own, with one task run (so a worker process listens too), for a user on whose machine Ray
    never ran (a HOME of its own, where Ray makes the token): (process, node info, GCS, HOME)."""
    home = tmp_path_factory.mktemp("home")
    head = subprocess.Popen([sys.executable, "-c", HEAD], env=_env(HOME=str(home)), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        line = ""
        while not line.startswith("UP"):
            line = head.stdout.readline()
            assert line or head.poll() is None, "the local cluster did not start"
        node, gcs = line.removeprefix("UP ").rsplit(" ", 1)
        time.sleep(3)  # the dashboard agent opens its HTTP port a moment after the node is up
        yield head, json.loads(node), gcs.strip(), home
    finally:
        head.kill()
        head.wait()


def test_a_runs_local_cluster_refuses_a_client_without_its_token(local_cluster, tmp_path):
    """A client with no token is refused by the GCS, one that sends the token (the same
    user's HOME, RAY_AUTH_MODE=token) joins: the refusal is the token's, not the network's.
    The token Ray made is the user's alone: another user of the machine cannot read it."""
    _, _, address, home = local_cluster
    assert not address.startswith("127.")  # reachable from the network: hence the token
    stranger = _env(HOME=str(tmp_path))  # no ~/.ray/auth_token there
    assert _join(address, stranger) == "refused"
    assert _join(address, _env(HOME=str(home), RAY_AUTH_MODE="token")) == "joined"
    assert (home / ".ray" / "auth_token").stat().st_mode & 0o777 == 0o600


def _listening(pid: int) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every socket the process and its descendants listen on."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    names = {p.pid: p.name() for p in procs}
    return sorted({(c.laddr.ip, c.laddr.port, names[c.pid])
                   for c in psutil.net_connections("inet")
                   if c.status == psutil.CONN_LISTEN and c.pid in names})


def _rpc(host: str, port: int, method: str, token: str | None) -> str:
    """The status code name of one unary call with an empty request."""
    metadata = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        call = channel.unary_unary(method, request_serializer=bytes,
                                   response_deserializer=bytes)
        try:
            call(b"", timeout=10, metadata=metadata)
            return "OK"
        except grpc.RpcError as e:
            return e.code().name


def _get(host: str, port: int, token: str | None) -> tuple[int, bytes]:
    """HTTP GET / : (status, first bytes)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/",
                                                           headers=headers), timeout=10) as r:
            return r.status, r.read(64)
    except urllib.error.HTTPError as e:
        return e.code, b""


def test_every_port_of_a_local_cluster_refuses_a_client_without_the_token_but_metrics(
        local_cluster):
    """Each listening socket of the cluster's processes, asked from this machine without the
    token: every gRPC service (GCS, node manager, object manager, dashboard agent, each core
    worker) answers a real method UNAUTHENTICATED and the same call with the token passes; the
    agents' HTTP ports answer 401; what answers anyone is Prometheus text (read-only counters),
    as docs/cluster.md's ports table says. A port of a kind not listed here fails the test."""
    head, node, gcs, home = local_cluster
    host, token = node["NodeManagerAddress"], (home / ".ray" / "auth_token").read_text()
    grpc_methods = {
        int(gcs.rsplit(":", 1)[1]): "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
        node["NodeManagerPort"]: "/ray.rpc.NodeManagerService/GetNodeStats",
        node["ObjectManagerPort"]: "/ray.rpc.ObjectManagerService/Pull",
        node["MetricsAgentPort"]: "/ray.rpc.ReporterService/GetTraceback",
    }
    kinds = set()
    for address, port, name in _listening(head.pid):
        at = host if address in ("::", "0.0.0.0") else address
        method = grpc_methods.get(port)
        if method is None and address == "::":  # a driver's or worker's core worker
            method = "/ray.rpc.CoreWorkerService/GetCoreWorkerStats"
        if method:
            answer = _rpc(at, port, method, None)
            if answer == "UNAVAILABLE" and (address, port, name) not in _listening(head.pid):
                continue  # an idle worker process that exited since: nothing listens there
            assert answer == "UNAUTHENTICATED", (port, name, method)
            assert _rpc(at, port, method, token.strip()) == "OK", (port, name, method)
            kinds.add(method.split("/")[1])
            continue
        status, body = _get(at, port, None)
        if status == 401:  # the dashboard agent's and the runtime-env agent's HTTP servers
            assert _get(at, port, token.strip())[0] != 401, (port, name)
            kinds.add(f"http-{name}")
        else:
            assert (status, body[:7]) == (200, b"# HELP "), (address, port, name, status)
            kinds.add("prometheus")
    assert {"ray.rpc.NodeInfoGcsService", "ray.rpc.NodeManagerService",
            "ray.rpc.ObjectManagerService", "ray.rpc.ReporterService",
            "ray.rpc.CoreWorkerService", "prometheus"} <= kinds, kinds


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


def test_keep_token_private_makes_a_shared_token_file_the_users_alone(tmp_path, monkeypatch,
                                                                       caplog):
    from launch.driver.placement import keep_token_private

    token = tmp_path / "token"
    token.write_text("t" * 64)
    token.chmod(0o644)  # as Ray writes it
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    with caplog.at_level("WARNING", logger="homerl.placement"):
        keep_token_private()
        assert token.stat().st_mode & 0o777 == 0o600
        assert token.read_text() == "t" * 64
        assert [r.getMessage().split(" was ")[0] for r in caplog.records] == [str(token)]
        keep_token_private()  # private already: nothing to say
        assert len(caplog.records) == 1
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "none"))
    keep_token_private()  # no file (a token in RAY_AUTH_TOKEN): nothing to do, no error
