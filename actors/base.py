"""The one rollout-worker interface, shared by the HF and vLLM engines.

    set_weights(update: WeightUpdate, version, rollback=False) -> version
    generate(call: RolloutCall) -> RolloutBatch
    generate_steps(calls: list[RolloutCall]) -> list[RolloutBatch]
    generate_split(calls) -> (summary_1, ..., summary_k, batch_1, ..., batch_k)
    ping() -> {'name', 'version', 'pid', 'started_at', 'node_id', 'resources'}

`generate_split` is what the driver calls through Ray with `num_returns=2k`: the summaries come
back to the driver, the batches stay in the object store until the learner reads them, so
completions and log-probs cross the network once (worker -> learner), not twice.
"""

from __future__ import annotations

import os

from common.device import ray_placement
from common.types import RolloutBatch, RolloutCall


class RolloutWorker:
    """Base class: subclasses set `name` and `version` and implement `generate_steps`."""

    name: str = "rollout"
    version: int = 0
    started_at: float = 0.0
    """time.time() when the worker began to build its engine (the start order on a shared
    card: after the learner holds its model)"""

    def ping(self) -> dict:
        """Liveness plus where it runs: `node_id` (which cluster node holds this actor; None
        outside Ray) and `resources` (what Ray assigned it, e.g. a GPU share)."""
        return {"name": self.name, "version": self.version, "pid": os.getpid(),
                "started_at": self.started_at, **ray_placement()}

    def generate(self, call: RolloutCall) -> RolloutBatch:
        """G completions for each prompt of `call`, verified."""
        return self.generate_steps([call])[0]

    def generate_steps(self, calls: list[RolloutCall]) -> list[RolloutBatch]:
        raise NotImplementedError

    def generate_split(self, calls: list[RolloutCall]) -> tuple:
        """(summary per call..., batch per call...): call with Ray's num_returns=2*len(calls)."""
        batches = self.generate_steps(calls)
        return (*[b.summary() for b in batches], *batches)
