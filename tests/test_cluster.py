"""Multi-node placement on one machine: a 3-node Ray cluster of 1 CPU each.

`ray.cluster_utils.Cluster` starts a head and two more raylets in this machine, each a separate
node to the scheduler, so a layout of learner + 2 workers (1 CPU each) can only be hosted by
SPREADing it over all three: the tiny preset must still train, sync weights across nodes and
finish. An impossible layout must fail fast with the one-line ConfigError.
"""

import json

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group_table

from common.config import ConfigError
from launch.placement import make_placement
from launch.presets import get_preset
from launch.train import Trainer


@pytest.fixture
def three_nodes(own_ray):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


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
    assert layout.strategy == "SPREAD"  # 3 x 1 CPU fits on no single 1-CPU node
    worker_nodes = [p["node_id"] for p in pings]
    assert len(set(worker_nodes)) == 2, worker_nodes
    assert len(set(bundle_nodes)) == 3, bundle_nodes  # the learner on the third node
    assert worker_nodes == [bundle_nodes[b] for b in layout.worker_bundles]
    assert versions == [last_version] * 2 and last_version == 3, (versions, last_version)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert summary["steps"] == 3
