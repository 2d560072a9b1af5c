"""Where the actors go: one placement group, a bundle for the learner and one per rollout worker.

Bundle 0 is the learner (`learner_threads` CPUs), bundles 1..N are the rollout workers
(`threads_per_worker` CPUs each); with a GPU (common/device.py) the learner and the one rollout
worker each ask for a share of the same card. With `rollout.placement=auto`
the group is PACKed when the whole layout fits on one node (no cross-node weight pushes) and
SPREAD otherwise, so a cluster of small machines still hosts it. A layout the cluster cannot
host fails within `timeout_s` with a one-line `ConfigError` saying what is missing.

    from launch.driver.placement import make_placement
    layout = make_placement(cfg)            # after ray.init
    layout.learner_bundle, layout.worker_bundles, layout.node_ids()
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from common.config import Config, ConfigError
from common.device import DeviceError, DevicePlan, driver_card, machine_gpus, plan_devices
from launch.plan import card as card_plan
from launch.plan import ram
from launch.plan.units import GiB

log = logging.getLogger("homerl.placement")

WAIT_NOTICE_S = 5.0
"""a restored run says it is waiting for capacity once its layout has not fit for this long"""


@dataclass
class Layout:
    """A ready placement group and which bundle each actor runs in."""

    pg: PlacementGroup
    learner_bundle: int
    """bundle index of the learner"""
    worker_bundles: list[int]
    """bundle index of rollout worker i"""
    learner_gpus: float
    """GPU share in the learner's bundle; the learner actor must ask for it to see the card"""
    strategy: str
    """the placement group strategy used: PACK or SPREAD"""
    worker_gpus: float = 0.0
    """GPU share in each worker's bundle"""

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

    def await_bundles(self, wait_s: float, who: str) -> None:
        """Return once every bundle has a node again. After a node is lost, Ray re-places its
        bundles where there is room; with none, this waits up to `wait_s` (run.
        wait_for_capacity_s), saying so once, then raises CapacityLostError."""
        deadline, said = time.monotonic() + wait_s, False
        while placement_group_table(self.pg).get("state") != "CREATED":
            if time.monotonic() > deadline:
                raise CapacityLostError(f"{who} lost its node and the cluster had no room for it "
                                        f"within run.wait_for_capacity_s={wait_s:g}")
            if not said:
                log.warning("%s lost its node: waiting up to %gs (run.wait_for_capacity_s) for "
                            "the cluster to host it again", who, wait_s)
                said = True
            time.sleep(1.0)


class CapacityLostError(RuntimeError):
    """A lost node's learner or worker found no room in the cluster in time."""


def _nodes() -> list[dict]:
    """Total resources of each alive node."""
    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def _strategy(choice: str, cpus: float, gpus: float, nodes: list[dict]) -> str:
    if choice != "auto":
        return choice.upper()
    fits_one = any(n.get("CPU", 0) >= cpus and n.get("GPU", 0) >= gpus for n in nodes)
    return "PACK" if fits_one else "SPREAD"


def _shortfall(cfg: Config, learner_gpus: float, nodes: list[dict]) -> str:
    """One line: what each bundle needs against the largest node and the cluster."""
    r = cfg.rollout
    need = f"learner needs {r.learner_threads} CPU" + (
        f" + {learner_gpus:g} GPU" if learner_gpus else "")
    total = ray.cluster_resources()
    free = ray.available_resources()
    big = max(nodes, key=lambda n: (n.get("CPU", 0), n.get("GPU", 0)), default={})
    return (f"cluster cannot host the layout: {need}, {r.num_workers} workers x "
            f"{r.threads_per_worker} CPU; cluster has {total.get('CPU', 0):g} CPU, "
            f"{total.get('GPU', 0):g} GPU on {len(nodes)} node(s) (largest node "
            f"{big.get('CPU', 0):g} CPU, {big.get('GPU', 0):g} GPU; "
            f"{free.get('CPU', 0):g} CPU free now)")


def make_placement(cfg: Config, devices: DevicePlan | None = None,
                   timeout_s: float = 60.0, wait_s: float = 0.0) -> Layout:
    """Reserve the learner's and every worker's bundle; one-line ConfigError if it cannot fit
    within `timeout_s`, or, with `wait_s` > 0 (a run restored after a lost node), a
    CapacityLostError after waiting that long, with a message while it waits.

    `devices` (common/device.py) says what GPU share each role asks for (default: none).
    """
    r = cfg.rollout
    devices = devices or DevicePlan("cpu", 0.0, 0.0)
    learner_gpus, worker_gpus = devices.learner_gpus, devices.worker_gpus

    def bundle(cpus, gpus):
        return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}

    workers = 0 if r.one_copy else r.num_workers  # one-copy mode: the learner generates
    bundles = [bundle(r.learner_threads, learner_gpus)] + [
        bundle(r.threads_per_worker, worker_gpus) for _ in range(workers)]
    nodes = _nodes()
    gpus = learner_gpus + worker_gpus * workers
    strategy = _strategy(r.placement, sum(b["CPU"] for b in bundles), gpus, nodes)
    pg = placement_group(bundles, strategy=strategy)
    if not pg.wait(timeout_seconds=min(timeout_s, WAIT_NOTICE_S) if wait_s > 0 else timeout_s):
        msg = _shortfall(cfg, learner_gpus, nodes)
        if wait_s > 0:
            log.warning("waiting up to %gs (run.wait_for_capacity_s) for the cluster to host "
                        "the run again: %s", wait_s, msg)
        if wait_s <= 0 or not pg.wait(timeout_seconds=wait_s):
            ray.util.remove_placement_group(pg)  # a pending group would grab resources later
            if wait_s > 0:
                raise CapacityLostError(f"{msg}; waited run.wait_for_capacity_s={wait_s:g}")
            raise ConfigError(msg)
    layout = Layout(pg, 0, list(range(1, len(bundles))), learner_gpus, strategy, worker_gpus)
    log.info("placement %s: bundle nodes %s", strategy,
             [n[:8] for n in layout.node_ids()])
    return layout


def start_local_cluster(num_cpus: int) -> None:
    """A Ray cluster of this process's own (`address="local"`: not one that a `ray start` left
    in /tmp/ray/ray_current_cluster, which Ray would join and then refuse num_cpus).

    Its ports listen on every interface (Ray does not bind a node to the loopback address), so
    they are closed by Ray's token authentication, on by default for a new local cluster from
    Ray 2.59 (pyproject's floor): a client without the token (~/.ray/auth_token) is refused.
    RAY_AUTH_MODE=disabled turns that off; then this says so, once, in one line."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        log.warning("RAY_AUTH_MODE=disabled: this run's Ray ports accept anyone who can reach "
                    "this machine; unset it to keep token authentication (docs/cluster.md)")
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    keep_token_private()


def keep_token_private() -> None:
    """Ray writes its token (~/.ray/auth_token, or RAY_AUTH_TOKEN_PATH) readable by every user
    of the machine (0644), and whoever reads it can join the cluster and run code as this user:
    make the file this user's alone (0600), saying so once. Nothing to do for a private file,
    a token given in RAY_AUTH_TOKEN, or a file of another user's."""
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        st = path.stat()
        if st.st_mode & 0o077 and st.st_uid == os.getuid():
            path.chmod(0o600)
            log.warning("%s was readable by other users of this machine (Ray makes it so): "
                        "made it yours alone (0600), as the token lets its reader run code "
                        "on this cluster", path)
    except OSError:  # no such file (the token is in RAY_AUTH_TOKEN), or not ours to change
        pass


class RayConnection:
    """A driver's hold on Ray. Created before `connect`, it remembers whether this process was
    already connected (a caller's own `ray.init`, kept); `leave()` then disconnects only a
    connection the run made itself. As a context manager it leaves on exit.

        with RayConnection() as conn:
            ...            # connect(cfg), train
            conn.leave()   # early, e.g. before printing an error line
    """

    def __init__(self) -> None:
        self.ours = not ray.is_initialized()

    def leave(self) -> None:
        if self.ours and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> RayConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.leave()


def connect(cfg: Config) -> DevicePlan:
    """Join the cluster named by RAY_ADDRESS (set by `ray job submit`), else start a local one,
    and decide each role's device (common/device.py). A config that does not fit the card is
    refused by the planner before any actor starts. Call `refuse_missing_gpu` first (the
    Trainer does, before it loads any data), so a GPU config on a machine without one fails in
    seconds, before Ray starts."""
    r = cfg.rollout
    if local_cpu_run(cfg) or local_gpu_run(cfg):
        check_ram(cfg, gpu=not local_cpu_run(cfg))  # every process of the run is on this machine
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        else:
            # a cluster is joined only when RAY_ADDRESS names it
            start_local_cluster(r.learner_threads + (
                0 if r.one_copy else r.num_workers * r.threads_per_worker))
    devices = plan_devices(cfg.model.device, ray.cluster_resources().get("GPU", 0),
                           r.num_workers, r.one_copy)
    if devices.device == "cuda":
        check_card(cfg, devices)
    return devices


def local_cpu_run(cfg: Config) -> bool:
    """A run that starts its own Ray cluster on this machine and trains on its CPU."""
    return (not ray.is_initialized() and not os.environ.get("RAY_ADDRESS") and (
        cfg.model.device == "cpu" or (cfg.model.device == "auto" and not machine_gpus())))


def local_gpu_run(cfg: Config) -> bool:
    """A run that starts its own Ray cluster on this machine and trains on its GPU."""
    return (not ray.is_initialized() and not os.environ.get("RAY_ADDRESS") and (
        cfg.model.device == "cuda" or (cfg.model.device == "auto" and bool(machine_gpus()))))


def check_ram(cfg: Config, gpu: bool = False) -> None:
    """Refuse (one line) a local run whose RAM plan (`gpu`: the host side of a GPU run)
    exceeds the memory available now."""
    import psutil

    ram.check(cfg, psutil.virtual_memory().available / GiB, gpu=gpu)


def refuse_missing_gpu(cfg: Config) -> None:
    """A local run that asks for a GPU on a machine without one: one line, in seconds. (With a
    cluster named or already connected, `plan_devices` checks the cluster's GPUs instead.)"""
    if (cfg.model.device == "cuda" and not os.environ.get("RAY_ADDRESS")
            and not ray.is_initialized() and not machine_gpus()):
        raise DeviceError(f"{cfg.preset}: model.device=cuda but this machine has no CUDA GPU; "
                          "run a CPU preset (cpu-demo) or pass --model.device cpu")


def check_card(cfg: Config, devices: DevicePlan) -> None:
    """The card's plan must fit (launch/plan/card.py); a card time-sliced by the learner and an
    engine also allows no overlap, and gives the engine its share."""
    if devices.shared_card and cfg.rollout.max_staleness:
        raise ConfigError(f"rollout.max_staleness: must be 0 when the learner and the rollout "
                          f"engine share one GPU (they take turns on it); got "
                          f"{cfg.rollout.max_staleness}")
    card = driver_card()  # torch asked in a subprocess: no CUDA context in the driver
    gpu_gb = cfg.model.gpu_memory_gb or (card.total_gb if card else 0.0)
    if card and card.total_gb:
        gpu_gb = min(gpu_gb, card.total_gb)  # a cap above the card holds nothing back
    if not gpu_gb:
        log.warning("the driver sees no GPU to size the plan by: pass --gpu-memory-gb N")
        return
    card_plan.check(cfg, gpu_gb, card.capability if card else None)
    # the engine's share; its KV cache is the plan's
    if devices.shared_card and not cfg.rollout.engine_memory_gb:
        cfg.rollout.engine_memory_gb = round(card_plan.engine_bytes(cfg) / GiB, 2)
