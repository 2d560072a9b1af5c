"""Where the actors go: one placement group, a bundle for the learner and one per rollout worker.

Bundle 0 is the learner (`learner_threads` CPUs, plus one GPU when the cluster has any), bundles
1..N are the rollout workers (`threads_per_worker` CPUs each). With `rollout.placement=auto`
the group is PACKed when the whole layout fits on one node (no cross-node weight pushes) and
SPREAD otherwise, so a cluster of small machines still hosts it. A layout the cluster cannot
host fails within `timeout_s` with a one-line `ConfigError` saying what is missing.

    from launch.placement import make_placement
    layout = make_placement(cfg)            # after ray.init
    layout.learner_bundle, layout.worker_bundles, layout.node_ids()
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from common.config import Config, ConfigError

log = logging.getLogger("homerl.placement")


@dataclass
class Layout:
    """A ready placement group and which bundle each actor runs in."""

    pg: PlacementGroup
    learner_bundle: int
    """bundle index of the learner"""
    worker_bundles: list[int]
    """bundle index of rollout worker i"""
    learner_gpus: int
    """GPUs in the learner's bundle (0 or 1); the learner actor must ask for them to see them"""
    strategy: str
    """the placement group strategy used: PACK or SPREAD"""

    def learner_strategy(self) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=self.learner_bundle)

    def worker_strategy(self, i: int) -> PlacementGroupSchedulingStrategy:
        """Rollout worker i's bundle (a replacement goes into the same one)."""
        return PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=self.worker_bundles[i])

    def node_ids(self) -> list[str]:
        """Node id of each bundle, in bundle order (the learner's first)."""
        table = placement_group_table(self.pg)["bundles_to_node_id"]
        return [table.get(i, "") for i in range(len(self.worker_bundles) + 1)]

    def remove(self) -> None:
        ray.util.remove_placement_group(self.pg)


def _nodes() -> list[dict]:
    """Total resources of each alive node."""
    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def _strategy(choice: str, cpus: float, gpus: float, nodes: list[dict]) -> str:
    if choice != "auto":
        return choice.upper()
    fits_one = any(n.get("CPU", 0) >= cpus and n.get("GPU", 0) >= gpus for n in nodes)
    return "PACK" if fits_one else "SPREAD"


def _shortfall(cfg: Config, learner_gpus: int, nodes: list[dict]) -> str:
    """One line: what each bundle needs against the largest node and the cluster."""
    r = cfg.rollout
    need = f"learner needs {r.learner_threads} CPU" + (" + 1 GPU" if learner_gpus else "")
    total = ray.cluster_resources()
    free = ray.available_resources()
    big = max(nodes, key=lambda n: (n.get("CPU", 0), n.get("GPU", 0)), default={})
    return (f"cluster cannot host the layout: {need}, {r.num_workers} workers x "
            f"{r.threads_per_worker} CPU; cluster has {total.get('CPU', 0):g} CPU, "
            f"{total.get('GPU', 0):g} GPU on {len(nodes)} node(s) (largest node "
            f"{big.get('CPU', 0):g} CPU, {big.get('GPU', 0):g} GPU; "
            f"{free.get('CPU', 0):g} CPU free now)")


def make_placement(cfg: Config, timeout_s: float = 60.0) -> Layout:
    """Reserve the learner's and every worker's bundle; one-line ConfigError if it cannot fit."""
    r = cfg.rollout
    # A GPU goes to the learner only where the cluster has one: the same config then runs on
    # a CPU box and on a GPU cluster.
    learner_gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    learner = {"CPU": r.learner_threads, **({"GPU": learner_gpus} if learner_gpus else {})}
    bundles = [learner] + [{"CPU": r.threads_per_worker} for _ in range(r.num_workers)]
    nodes = _nodes()
    strategy = _strategy(r.placement, sum(b["CPU"] for b in bundles), learner_gpus, nodes)
    pg = placement_group(bundles, strategy=strategy)
    if not pg.wait(timeout_seconds=timeout_s):
        msg = _shortfall(cfg, learner_gpus, nodes)
        ray.util.remove_placement_group(pg)  # a pending group would grab resources later
        raise ConfigError(msg)
    layout = Layout(pg, 0, list(range(1, len(bundles))), learner_gpus, strategy)
    log.info("placement %s: bundle nodes %s", strategy,
             [n[:8] for n in layout.node_ids()])
    return layout
