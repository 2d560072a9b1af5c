"""The Ray actor classes the driver starts, importable without torch, transformers or vLLM.

The real classes (`learner.learner.Learner`, `actors.hf_worker.HFRolloutWorker`,
`actors.vllm_worker.VLLMRolloutWorker`, `launch.one_copy.OneCopy`) import torch and
transformers at module level: 0.3 GiB of PSS and ~3.5 s in a driver that holds no model. Ray
needs only a class object in the driver, so each class here builds the real object inside its
actor process and forwards the named methods the driver calls (`launch.train`'s
`learner.train_step.remote(...)` is unchanged).
`tests/test_roles.py` checks each method list against the real class's public methods.
"""

from __future__ import annotations

import importlib

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
            "__doc__": f"`{module}.{cls_name}` built inside the actor (see launch/roles.py)."}
    return type(cls_name, (), body | {m: _forward(m) for m in methods})


Learner = _role("Learner", "learner.learner", LEARNER_METHODS)
HFRolloutWorker = _role("HFRolloutWorker", "actors.hf_worker", WORKER_METHODS)
VLLMRolloutWorker = _role("VLLMRolloutWorker", "actors.vllm_worker",
                          WORKER_METHODS + ("shutdown",))
OneCopy = _role("OneCopy", "launch.one_copy", tuple(sorted({*LEARNER_METHODS, *WORKER_METHODS})))
"""the learner whose own model also generates (rollout.engine=learner)"""
