"""Shared fixtures: one local Ray cluster per pytest run, and the tiny models tests build.

* `ray_cluster`: a real local Ray cluster (4 logical CPUs), started on first use and kept for
  the rest of the run (starting one costs ~3-5 s). Tests that need a cluster of another shape
  (several nodes, a metrics port, a job head) take `own_ray` instead, which shuts the shared one
  down first; the next `ray_cluster` user starts it again.
* `head_node`: `ray start --head` of a test's own on 127.0.0.1 (free ports, private temp dir),
  yielding (dashboard address, env for the `ray` CLI); `submit` retries `ray job submit` while
  the head's job agent starts.
* `reference_run`: a finished run of a config nobody interrupted, made once per `make test`
  for the fault and resume tests that compare with it.
* `tiny_llama`: the cached `tiny-random-llama` checkpoint (Llama, 16-dim heads).
* `tiny_qwen2`: a tiny random Qwen2 checkpoint (tied embeddings, q/k/v biases, 32-dim heads,
  which vLLM's CPU backend accepts).
* `tiny_vllm_llama`: a tiny random Llama with 32-dim heads, for vLLM.
* `hostile_qwen2`: a tiny random Qwen2 with peaked next-token distributions whose
  generation_config.json carries sampling settings that must not leak into rollouts
  (test_onpolicy.py).

Models are random and built in memory from a config: no test downloads anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import ray

SHARED_CPUS = 4

# Under `pytest -n 2` (`make test`) each pytest process gets a Ray temp dir of its own:
# ray.cluster_utils.Cluster writes its address to <temp>/ray/ray_current_cluster, where a plain
# `ray.init(num_cpus=...)` in the other process (or a driver a test starts) would find it and try
# to join that cluster ("num_cpus and num_gpus must not be provided"): a CI run failed so.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["RAY_TMPDIR"] = f"/tmp/r{os.environ['PYTEST_XDIST_WORKER']}"  # short: socket paths
    os.makedirs(os.environ["RAY_TMPDIR"], exist_ok=True)

# Ray starts one idle worker process per logical CPU with every cluster, ahead of need: ~1.5 s of
# CPU a cluster start that the suite's many short-lived clusters (2 cores, two pytest processes)
# spend for workers few of them use. Actors start their worker on demand instead.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")


def start_shared_cluster() -> None:
    """Connect the shared local cluster, starting it if none is (see the module docstring)."""
    if not ray.is_initialized():
        # address="local": always a new cluster of this process's own, never one that another
        # test (or a driver that a test started) left behind and `ray.init()` would try to join
        ray.init(address="local", num_cpus=SHARED_CPUS, include_dashboard=False)


# a line Ray forwarded into a driver's stderr: "(raylet) ...", "(Learner pid=42) ...", colored
RAY_FORWARDED = re.compile(r"^(\x1b\[[0-9;]*m)?\([^()]*\b(pid=\d+|raylet|gcs_server)\b[^()]*\)")


def own_lines(err: str, prog: str) -> list[str]:
    """The lines of `err` (a program's stderr) that program printed itself ("launch.train: ..."):
    Ray forwards its actors' output (progress bars, tracebacks) to the same stream, and the
    shared cluster of a pytest process forwards an earlier test's actors, and its raylet's
    warnings (a disk nearly full), into whatever test is capturing at the time."""
    return [line for line in err.splitlines() if line.startswith(f"{prog}:")]


def without_ray(err: str) -> str:
    """`err` without the lines Ray forwarded into it (see `own_lines`), for a check that an
    in-process call printed exactly one line. (Split at newlines only: a forwarded progress
    bar's carriage returns stay inside its line.)"""
    return "\n".join(line for line in err.split("\n") if not RAY_FORWARDED.match(line)).strip()


@pytest.fixture
def ray_cluster():
    """The shared local cluster (see the module docstring)."""
    start_shared_cluster()
    yield


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
    """`reference_run(cfg) -> run dir` of a finished run of `cfg` that nobody interrupted, for
    the tests that compare a faulted or resumed run with it, or check a plain run's outputs.
    Made once per pytest run per config (the pytest processes of `make test` share it through a
    file lock), with the weight versions its workers ended on in worker_versions.json; read
    it, never write to it. Needs the shared cluster (`ray_cluster`)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "reference-runs"
    root.mkdir(exist_ok=True)

    def get(cfg) -> Path:
        from filelock import FileLock

        from launch.driver.trainer import Trainer

        blob = json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode()
        key = hashlib.sha256(blob).hexdigest()[:16]
        run_dir = root / key
        with FileLock(str(root / f"{key}.lock")):
            if not (run_dir / "summary.json").exists():
                shutil.rmtree(run_dir, ignore_errors=True)  # a half-made one
                start_shared_cluster()
                trainer = Trainer(cfg, str(run_dir))
                try:
                    trainer.run()
                    versions = trainer.pool.worker_versions()
                finally:
                    trainer.shutdown()
                (run_dir / "worker_versions.json").write_text(json.dumps(versions))
        return run_dir

    return get


@pytest.fixture
def own_ray():
    """For a test that starts a Ray cluster of its own: none is connected when it begins, and
    whatever it started is shut down after it."""
    if ray.is_initialized():
        ray.shutdown()
    yield
    if ray.is_initialized():
        ray.shutdown()


# `make test` splits the suite over two processes, and pytest-xdist (`--maxschedchunk 1`) hands
# tests out one at a time, in the order collected, as processes free up: a long test handed out
# last would leave the other process idle while it runs. So the tests known to take 5 s or more
# (tests/durations.json, seconds per test from a `--durations=0` run: `python -m
# tools.ops.test_durations LOG`) go first, longest first, within the own-cluster tests and then
# within the rest (`_order`); the rest keep their file order.
# (Without `--maxschedchunk 1`, xdist gives each process a run of consecutive tests to start
# with, and one process would get every long test.)
DURATIONS = json.loads((Path(__file__).with_name("durations.json")).read_text())
LONG_S = 5.0


def _order(item, together: float) -> tuple[int, float]:
    """The tests that start a Ray cluster of their own (`own_ray`, test_cluster.py's module-wide
    `three_nodes`) first, then the rest; in each group the long tests first, longest first, and
    the others in file order. Each pytest process then starts the shared cluster about once: it
    is shut down for every own_ray test and started again (~5-13 s) by the next user, which the
    long tests of the two kinds taken by length alone did ~14 times a run. The tests on
    `three_nodes` count as one test of their summed time (`together`), so that it is started
    once."""
    fixtures = set(getattr(item, "fixturenames", ()))
    seconds = together if "three_nodes" in fixtures else DURATIONS.get(item.nodeid, 0.0)
    own = bool({"own_ray", "three_nodes"} & fixtures)
    return 0 if own else 1, -seconds if seconds >= LONG_S else 0.0


def pytest_configure(config):
    """Ray 2.60 writes a token (~/.ray/auth_token) for a new local cluster when there is none:
    the two pytest processes of `make test`, starting their first clusters at once on a machine
    where Ray never ran, would each write one, and one cluster would run on a token the file no
    longer holds. The first process makes it, as docs/cluster.md says, before any cluster."""
    token = Path.home() / ".ray" / "auth_token"
    if token.exists() or os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    from filelock import FileLock

    with FileLock(os.path.join(tempfile.gettempdir(), "homerl-tests-ray-token.lock")):
        if not token.exists():
            make_ray_token(dict(os.environ))


def pytest_collection_modifyitems(config, items):
    together = sum(DURATIONS.get(i.nodeid, 0.0) for i in items
                   if "three_nodes" in getattr(i, "fixturenames", ()))
    items.sort(key=lambda item: _order(item, together))  # stable: the rest keep file order


def pytest_sessionfinish(session, exitstatus):
    if ray.is_initialized():
        # learners built in this process (in its Ray job) made a core-sharing flag file in
        # /dev/shm that no Trainer.shutdown removes: remove it with the cluster
        from common.core_lease import lease_key, remove_flag

        remove_flag(lease_key())
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    from common.models import TINY_MODEL_NAME, resolve_model

    return resolve_model(TINY_MODEL_NAME)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> str:
    from common.tiny_model import save_tiny_qwen2

    return str(save_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2")))


@pytest.fixture(scope="session")
def tiny_vllm_llama(tmp_path_factory) -> str:
    from common.tiny_model import save_tiny_vllm_model

    return str(save_tiny_vllm_model(tmp_path_factory.mktemp("tiny-vllm-llama")))


@pytest.fixture
def run_job(ray_cluster):
    """Run launch.train's Trainer to the end on the shared cluster:
    `run_job(cfg, run_dir, resume=False) -> (summary, metrics rows, worker versions)`."""
    import json
    import os

    from launch.driver.trainer import Trainer

    def run(cfg, run_dir, resume: bool = False):
        trainer = Trainer(cfg, str(run_dir), resume=resume)
        try:
            summary = trainer.run()
            versions = trainer.pool.worker_versions()
        finally:
            trainer.shutdown()
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        return summary, rows, versions

    return run


# docs/cluster.md's path (`ray start --head`, then `ray job submit`): a head node of a test's own
REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HeadNode(NamedTuple):
    address: str
    """the dashboard's http:// address (what `ray job submit --address` takes)"""
    env: dict
    """the environment for `ray job` commands against it"""
    session: int
    """the session id of every process of this cluster (raylet, GCS, actors)"""


@pytest.fixture
def head_node(tmp_path, own_ray):
    """A `ray start --head` cluster of its own (the shared test cluster is shut down first: two
    clusters on 2 cores starve each other), started as docs/cluster.md says on a machine where
    Ray never ran: a HOME of its own, so its token is made by `ray get-auth-token --generate`."""
    from common.model_cache import cache_dir

    # The job's `python` is the one on the head node's PATH: put this venv first, as a user
    # who ran `. .venv/bin/activate` before `ray start` would have it.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # Ray 2.60's `ray start` turns token auth on when ~/.ray/auth_token exists, and fails when
    # RAY_AUTH_MODE=token and it does not; the job CLI sends the token only when
    # RAY_AUTH_MODE=token. homerl's cache (the tiny models) stays where it is.
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PATH": path, "RAY_AUTH_MODE": "token",
           "HOME": str(tmp_path / "home"), "HOMERL_CACHE": str(cache_dir())}
    env.pop("RAY_ADDRESS", None)
    make_ray_token(env)
    gcs, dash = _free_port(), _free_port()
    # `--block` in a session of its own: teardown kills exactly this cluster's processes.
    # (`ray stop` would kill every Ray cluster on the machine, a user's running jobs included.)
    # A private --temp-dir keeps its `ray_current_cluster` address file out of /tmp/ray, where a
    # later plain `ray.init()` in this test session would find it and try to join the dead head.
    temp_dir = tempfile.mkdtemp(prefix="rayh", dir="/tmp")  # short: unix socket paths are capped
    log = tmp_path / "ray-start.log"
    with open(log, "wb") as out:
        head = subprocess.Popen(
            [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port",
             str(gcs), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
             "--num-cpus", "2", "--disable-usage-stats", "--temp-dir", temp_dir,
             *agent_ports()],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        wait_for_dashboard(address, env, head, log)
        yield HeadNode(address, env, head.pid)
    finally:
        _end_session(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _end_session(head: subprocess.Popen) -> None:
    """Kill `ray start --block` and every process of its session (its cluster)."""
    try:
        os.killpg(head.pid, signal.SIGTERM)
    except ProcessLookupError:  # a head that failed to start, and nothing of it left
        return
    try:  # `ray start --block` rarely exits on SIGTERM alone: don't wait long for it
        head.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=30)


def make_ray_token(env: dict) -> None:
    """`ray get-auth-token --generate` (docs/cluster.md's first step): ~/.ray/auth_token of
    env's HOME, made if missing (the command prints the token: kept off the test's output)."""
    subprocess.run([RAY, "get-auth-token", "--generate"], env=env, check=True,
                   capture_output=True, timeout=120)


def agent_ports() -> list[str]:
    """Free ports for the per-node agents: the defaults (e.g. 52365) may belong to another Ray
    cluster on this machine, and then this head never gets a job agent."""
    flags = ["--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
             "--runtime-env-agent-port", "--metrics-export-port", "--ray-client-server-port"]
    return [x for flag in flags for x in (flag, str(_free_port()))]


def wait_for_dashboard(address: str, env: dict, head, log: Path, attempts: int = 90) -> None:
    """Poll `ray job list` until the head answers (bounded), failing fast (with the end of its
    output, `log`) if the head died."""
    for _ in range(attempts):
        if head.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"ray start --head exited with {head.returncode}:\n{tail}")
        if subprocess.run([RAY, "job", "list", "--address", address], env=env,
                          capture_output=True, timeout=60).returncode == 0:
            return
        time.sleep(2)
    raise TimeoutError(f"Ray dashboard at {address} did not answer")


def submit(cmd, env, attempts: int = 20):
    """`ray job submit`, retried while the head's job agent is still starting (a loaded machine
    can take a while after `ray start` returns); any other failure is returned at once. The
    result is the job's end: see `_follow_to_the_end`."""
    for _ in range(attempts):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
        if "No available agent to submit job" not in proc.stdout + proc.stderr:
            return _follow_to_the_end(proc, cmd, env)
        time.sleep(3)
    return proc


_JOB_ID = re.compile(r"raysubmit_\w+")
_ENDED = ("succeeded", "failed", "was stopped")


def _follow_to_the_end(proc, cmd, env, timeout_s: float = 600.0):
    """`ray job submit` stops following the job's log when the dashboard closes the log
    socket, which a loaded machine can do mid-run (Ray's CLI then exits 0 with the job still
    RUNNING): in that case poll `ray job status` until the job ends and return its whole log
    and final status line, with exit 0 only if it succeeded."""
    job = _JOB_ID.search(proc.stdout)
    if job is None or any(f"Job '{job.group()}' {w}" in proc.stdout for w in _ENDED):
        return proc
    address = cmd[cmd.index("--address") + 1]
    ask = [RAY, "job", "status", "--address", address, job.group()]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = subprocess.run(ask, env=env, capture_output=True, text=True, timeout=120)
        if any(f"Job '{job.group()}' {w}" in status.stdout for w in _ENDED):
            break
        time.sleep(2)
    logs = subprocess.run([RAY, "job", "logs", "--address", address, job.group()], env=env,
                          capture_output=True, text=True, timeout=120).stdout
    ok = f"Job '{job.group()}' succeeded" in status.stdout
    return subprocess.CompletedProcess(proc.args, 0 if ok else 1, logs + status.stdout,
                                       proc.stderr + status.stderr)


HOSTILE = {"repetition_penalty": 1.3, "top_k": 5, "temperature": 0.3, "do_sample": True}
"""sampling settings a hub checkpoint may ship, none of which a rollout may apply"""


@pytest.fixture(scope="session")
def hostile_qwen2(tmp_path_factory):
    from common.tiny_model import save_tiny_qwen2

    return str(save_tiny_qwen2(tmp_path_factory.mktemp("qwen2-hostile"), init_std=0.5,
                               generation=HOSTILE))
