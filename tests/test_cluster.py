"""Multi-node placement on one machine: a 3-node Ray cluster of 1 CPU each.

`ray.cluster_utils.Cluster` starts a head and two more raylets in this machine, each a separate
node to the scheduler, so a layout of learner + 2 workers (1 CPU each) can only be hosted by
SPREADing it over all three: the tiny preset must still train, sync weights across nodes and
finish. An impossible layout must fail fast with the one-line ConfigError.
"""

import glob
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group_table

from common.config import ConfigError
from common.core_lease import flag_path
from common.presets import get_preset
from launch.driver.placement import make_placement
from launch.driver.supervise import run_supervised
from launch.driver.trainer import Trainer
from launch.rundir.writer import read_jsonl

# Ray's GCS declares a node dead after 5 missed health checks 3 s apart; a lost machine is
# noticed in ~3 s here instead (the driver's handling of the loss is the same)
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


def connected_cluster(head_cpus: int, nodes: int):
    """A Cluster of a head with `head_cpus` and `nodes` more 1-CPU nodes, connected; yields it
    and shuts it down."""
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": head_cpus, "_system_config": FAST_HEALTH_CHECKS})
    for _ in range(nodes):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def three_nodes():
    """One 3-node cluster for this module's tests that only place and run (starting one costs
    ~20 s here); like `own_ray`, whatever was connected is shut down first."""
    if ray.is_initialized():
        ray.shutdown()
    yield from connected_cluster(head_cpus=1, nodes=2)


def tiny_cfg(num_workers: int, steps: int = 3):
    cfg = get_preset("tiny")
    cfg.rollout.num_workers = num_workers
    cfg.rollout.threads_per_worker = 1
    cfg.rollout.learner_threads = 1
    cfg.run.steps = steps
    return cfg


def test_impossible_layout_is_one_line_error(three_nodes):
    with pytest.raises(ConfigError) as e:
        make_placement(tiny_cfg(num_workers=5), timeout_s=2.0)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("cluster cannot host the layout: learner needs 1 CPU, "
                          "5 workers x 1 CPU; cluster has 3 CPU, 0 GPU on 3 node(s)"), msg
    # The refused group was removed, so it cannot grab CPUs from the next run.
    assert all(pg["state"] == "REMOVED" for pg in placement_group_table().values())


def test_tiny_run_spreads_over_nodes(three_nodes, tmp_path):
    trainer = Trainer(tiny_cfg(num_workers=2), str(tmp_path))
    try:
        summary = trainer.run()
        pings = ray.get([w.ping.remote() for w in trainer.pool.workers])
        versions = trainer.pool.worker_versions()
        last_version = ray.get(trainer.learner.ping.remote())
        layout = trainer.layout
        bundle_nodes = layout.node_ids()
    finally:
        trainer.shutdown()
    # the learner ran on another node than the driver: it removed its core-sharing flag file
    job = ray.get_runtime_context().get_job_id()
    assert not [n for n in ray.nodes() if os.path.exists(
        flag_path(f"{n['NodeID'][:16]}-{job}"))]
    assert layout.strategy == "SPREAD"  # 3 x 1 CPU fits on no single 1-CPU node
    worker_nodes = [p["node_id"] for p in pings]
    assert len(set(worker_nodes)) == 2, worker_nodes
    assert len(set(bundle_nodes)) == 3, bundle_nodes  # the learner on the third node
    assert worker_nodes == [bundle_nodes[b] for b in layout.worker_bundles]
    assert versions == [last_version] * 2 and last_version == 3, (versions, last_version)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert summary["steps"] == 3


@pytest.fixture
def spare_nodes(own_ray):
    """A head that hosts no actor (0 CPUs: the driver stays on it) and three 1-CPU nodes for a
    learner + 1 worker layout: one node to spare."""
    yield from connected_cluster(head_cpus=0, nodes=3)


class JoinWhenWaiting(logging.Handler):
    """Once the restored run says it is waiting for capacity, a new 1-CPU node joins: `ray start
    --address` in a session of its own (Cluster.add_node must run on the main thread, which is
    busy waiting for that node). Joining on the message, not after a fixed delay, proves the
    wait without sleeping longer than it takes."""

    def __init__(self, address: str, joined: list):
        super().__init__(logging.WARNING)
        self.address, self.joined = address, joined

    def emit(self, record: logging.LogRecord) -> None:
        if "to host the run again" not in record.getMessage() or self.joined:
            return
        ray_cli = str(Path(sys.executable).with_name("ray"))
        temp = tempfile.mkdtemp(prefix="rayn", dir="/tmp")
        self.joined.append(subprocess.Popen(
            [ray_cli, "start", "--address", self.address, "--num-cpus", "1", "--block",
             "--disable-usage-stats", "--temp-dir", temp], start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}))


class NodeLosingTrainer(Trainer):
    """Before step 2 the worker's node is removed; before step 5 the learner's, and a new node
    joins once the restored run says it is waiting for one (one node is left for two
    bundles)."""

    cluster: Cluster
    lost: list = []
    joined: list = []

    def _remove(self, where: dict) -> None:
        """Lose the node an actor runs on (`where`: its node_id and pid) as a machine is lost:
        the raylet and the actor (whose process would otherwise run on, orphaned, on this one
        machine) go at once."""
        node = next(n for n in self.cluster.list_all_nodes() if n.node_id == where["node_id"])
        self.lost.append(where["node_id"])
        self.cluster.remove_node(node, allow_graceful=False)
        try:
            os.kill(where["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass

    def step(self, k):
        if k == 2 and not self.lost:
            self._remove(ray.get(self.pool.workers[0].ping.remote()))
        elif k == 5 and len(self.lost) == 1:
            self._remove(ray.get(self.learner.placement.remote()))
        return super().step(k)


def test_lost_worker_and_learner_nodes_are_survived(spare_nodes, tmp_path, caplog):
    cfg = tiny_cfg(num_workers=1, steps=8)
    cfg.run.checkpoint_every = 2
    cfg.run.wait_for_capacity_s = 120.0
    NodeLosingTrainer.cluster, NodeLosingTrainer.lost = spare_nodes, []
    NodeLosingTrainer.joined = []
    joiner = JoinWhenWaiting(spare_nodes.address, NodeLosingTrainer.joined)
    logging.getLogger("homerl").addHandler(joiner)
    try:
        with caplog.at_level(logging.WARNING, logger="homerl"):
            summary = run_supervised(NodeLosingTrainer(cfg, str(tmp_path)))
    finally:
        logging.getLogger("homerl").removeHandler(joiner)
        for node in NodeLosingTrainer.joined:  # the node the test started itself
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(30)
        for node_id in NodeLosingTrainer.lost:  # a lost learner's core-sharing flag file
            for path in glob.glob(flag_path(f"{node_id[:16]}-*")):
                os.remove(path)
    rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(8))  # every step once; 4 was redone
    assert summary["learner_restarts"] == 1 and rows[-1]["faults/learner_restarts"] == 1
    # the worker on the lost node was replaced (Ray reports the node dead some seconds after
    # its raylet goes, so the failure shows a few steps later) and the count survived the
    # learner's restore
    assert rows[-1]["faults/worker_restarts"] >= 1, caplog.text
    assert summary["worker_restarts"] >= 1
    lost = NodeLosingTrainer.lost
    assert len(lost) == 2 and lost[0] != lost[1] and len(NodeLosingTrainer.joined) == 1
    assert ("waiting up to 120s (run.wait_for_capacity_s) for the cluster to host the run again"
            in caplog.text), caplog.text
    assert (tmp_path / "final" / "adapter_config.json").exists()
