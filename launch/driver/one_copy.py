"""One-copy mode (`rollout.engine=learner`): the learner's own model generates the rollouts.

On one card a separate rollout engine holds a second copy of the base (the learner's NF4 base
and the engine's 16-bit one: two copies, two CUDA contexts). Here one Ray actor plays both
roles on one copy: the learner's model (the NF4 or 16-bit base with its LoRA adapters unmerged)
samples with transformers' `generate` in eval mode, with a KV cache sized for the call and
released before the learner's step (actors/hf_worker.py), then trains on what it sampled. No
weights are exported or pushed: a rollout is always sampled by the learner's current weights,
so at staleness 0 the behaviour log-probs and the learner's are the same policy's
(`policy/logp_diff` shows the numerical noise between generate's cached decode and the
learner's packed forward).

The driver sees one actor that answers both interfaces (launch/driver/roles.py lists the
methods): the learner's (`train_step`, `save`, `load`, ...) and the rollout worker's
(`generate_split`, `set_weights`, `ping`, ...), and treats it as its learner and as its only
rollout worker (launch/driver/pool.py). Its death is the learner's: the run restores the last
checkpoint.

A plain class, as the learner and the workers are: tests and `tools.card_check` build it without
Ray.
"""

from __future__ import annotations

from actors.hf_worker import HFRolloutWorker
from actors.weights import WeightVersionError
from common.types import LearnerStep, RolloutBatch, RolloutCall, TrainBatch, TrainPlan, WeightUpdate
from learner.learner import Learner

LIVE = "live"
"""WeightUpdate.kind of one-copy mode: the weights live where they are sampled; no tensors"""


class OneCopy:
    """The learner and its rollout engine in one process, on one copy of the weights."""

    def __init__(self, cfg, name: str = "rollout-0", fn_code: dict[str, bytes] | None = None):
        self.cfg = cfg
        self.learner = Learner(cfg)
        self.sampler = HFRolloutWorker(cfg, name=name, policy=self.learner.model,
                                       fn_code=fn_code)

    # ---- the learner's role ----------------------------------------------------------------
    def ready(self) -> dict:
        return self.learner.ready()

    def nf4_state(self) -> dict:
        return self.learner.nf4_state()

    def close(self) -> None:
        self.learner.close()

    def placement(self) -> dict:
        return self.learner.placement()

    def consolidate(self, batches: list[TrainBatch] | None = None) -> dict:
        return self.learner.consolidate(batches)

    def train_step(self, plan: TrainPlan, *batches: RolloutBatch) -> LearnerStep:
        return self.learner.train_step(plan, *batches)

    def train_on(self, batch: TrainBatch) -> LearnerStep:
        return self.learner.train_on(batch)

    def export(self) -> WeightUpdate:
        """The version only: the sampler holds the learner's weights themselves."""
        return WeightUpdate(LIVE, self.learner.version, {})

    def save(self, path: str) -> None:
        self.learner.save(path)

    def load(self, path: str) -> int:
        return self.learner.load(path)

    def save_final(self, path: str, merged: bool = False) -> str:
        return self.learner.save_final(path, merged)

    # ---- the rollout worker's role -----------------------------------------------------------
    def ping(self) -> dict:
        return self.sampler.ping() | {"version": self.learner.version}

    def set_weights(self, update: WeightUpdate, version: int, rollback: bool = False) -> int:
        """A push of `version`: accepted when the learner holds it (its own weights are what
        is sampled); any other version cannot be served, since no other copy exists."""
        if update.kind != LIVE or version != self.learner.version:
            raise WeightVersionError(
                f"{self.sampler.name}: one-copy mode samples the learner's own weights "
                f"(version {self.learner.version}); cannot serve {update.kind} version {version}")
        return version

    def generate(self, call: RolloutCall) -> RolloutBatch:
        return self.generate_steps([call])[0]

    def generate_steps(self, calls: list[RolloutCall]) -> list[RolloutBatch]:
        self.sampler.version = self.learner.version  # what the batches are sampled with
        return self.sampler.generate_steps(calls)

    def generate_split(self, calls: list[RolloutCall]) -> tuple:
        self.sampler.version = self.learner.version
        return self.sampler.generate_split(calls)

    def sleep(self, level: int = 1) -> None:
        """Nothing to free for another process: the card has one."""

    def wake_up(self) -> None:
        """See `sleep`."""
