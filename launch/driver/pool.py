"""The rollout worker pool: placement, fan-out, weight pushes, and replacement of dead workers.

Used only by the driver. Prompts of a step are split into contiguous shares, one per worker;
each share carries its own sampling seed, so a share re-generated on a replacement worker with
the same weights gives the same completions: a worker death loses no step and duplicates none.

Rollouts move by reference: a worker's `generate_split` returns each share's RolloutSummary and
RolloutBatch as separate objects (`num_returns`); the driver fetches only the summaries and
hands the batch ObjectRefs to the learner, so completions and log-probs cross the network once.
The driver owns those objects (it submitted the task), so they outlive a worker that dies after
returning them.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass, replace

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from common.types import RolloutCall, RolloutSummary, Sampling
from launch.driver.placement import Layout

log = logging.getLogger("homerl.pool")

START_TIMEOUT_S = 600.0
"""a new worker must load its model and answer within this (seconds); calls get call_timeout_s"""
PUSH_TRIES = 3
"""a weight push a worker refused or failed to load is tried this many times in all"""


class WeightSyncError(RuntimeError):
    """A worker could not load a weight version after PUSH_TRIES attempts."""


@dataclass
class Share:
    """One worker's part of one step's rollout."""

    worker: int
    call: RolloutCall
    version: int
    summary: ray.ObjectRef | None = None
    """ObjectRef of the share's RolloutSummary (the driver fetches it)"""
    batch: ray.ObjectRef | None = None
    """ObjectRef of the share's RolloutBatch (only the learner fetches it)"""
    actor: object = None
    """the actor handle the share was last launched on"""


@dataclass
class Pending:
    """All shares of one step, in flight."""

    step: int
    shares: list[Share]


@dataclass
class Rollout:
    """A step's finished rollout as the driver holds it: summaries here, batches by reference."""

    summary: RolloutSummary
    """the shares' summaries joined in order"""
    batches: list[ray.ObjectRef]
    """the shares' RolloutBatch refs, in the same order (for Learner.train_step)"""


@dataclass
class Slot:
    """One step's rollout: its curriculum stage, prompts, and the work (in flight or done)."""

    stage: int
    prompts: list[dict]
    work: Pending | Rollout


class WorkerPool:
    """N rollout actors of one class, kept alive and at a known weight version."""

    def __init__(self, cfg, worker_cls, layout: Layout | None = None, tag: str = "",
                 nf4: ray.ObjectRef | None = None, learner=None,
                 fn_code: dict[str, bytes] | None = None):
        """`layout`: where each worker goes (launch/driver/placement.py); None: anywhere. `nf4`: the
        learner's NF4 bytes (QLoRA), handed to every worker, replacements included.
        `learner`: one-copy mode (launch/driver/one_copy.py): the learner's actor is the one worker,
        and its death is the learner's (the run restores its checkpoint), never replaced
        here. `fn_code`: the packed `by-value:` reward functions every worker gets, replacements
        included."""
        self.cfg, self.tag, self.nf4, self.learner = cfg, tag, nf4, learner
        self.fn_code = fn_code
        self.remote_cls = None if learner is not None else ray.remote(worker_cls)
        self.layout = layout
        self.payloads: dict[int, ray.ObjectRef] = {}  # version -> export ref in the object store
        self.version = 0
        self.restarts = 0
        self.workers = [learner] if learner is not None else [
            self._spawn(i) for i in range(cfg.rollout.num_workers)]
        self.versions = [0] * len(self.workers)
        self.push_refs: list[list[tuple[int, ray.ObjectRef]]] = [[] for _ in self.workers]
        try:
            ray.get([w.ping.remote() for w in self.workers], timeout=START_TIMEOUT_S)
        except RayActorError:  # one could not start: leave none running
            kill_and_wait(self.workers)
            raise

    def _spawn(self, i: int):
        opts = {"num_cpus": self.cfg.rollout.threads_per_worker, "name": None,
                "max_restarts": 0, "max_concurrency": 1,
                "num_gpus": self.layout.worker_gpus if self.layout else 0}
        if self.layout is not None:
            opts["scheduling_strategy"] = self.layout.worker_strategy(i)
        name = f"rollout-{i}" + (f"-r{self.restarts}" if self.restarts else "")
        opts["name"] = f"{name}:{self.tag}" if self.tag else name
        extra = {"nf4": self.nf4} if self.nf4 is not None else {}
        if self.fn_code:
            extra["fn_code"] = self.fn_code
        return self.remote_cls.options(**opts).remote(self.cfg, name=name, **extra)

    # ---- weights -------------------------------------------------------------------------
    def push(self, payload_ref: ray.ObjectRef, version: int, initial: bool = False) -> None:
        """Queue `version` (`payload_ref`: an ObjectRef of the learner's WeightUpdate) on
        every worker, after whatever each is running now.

        `initial`: only record the update (workers already hold it, e.g. the base model),
        so a replacement can be given it later.
        """
        self.payloads[version] = payload_ref
        oldest_needed = version - self.cfg.rollout.max_staleness - 1
        for v in [v for v in self.payloads if v < oldest_needed]:
            del self.payloads[v]  # no rollout can need it any more
        if not initial:
            for i, w in enumerate(self.workers):
                self._settle_pushes(i)  # surface earlier failures now; keeps the list short
                self.push_refs[i].append((version, w.set_weights.remote(payload_ref, version)))
        self.versions = [version] * len(self.workers)
        self.version = version

    # ---- rollouts ------------------------------------------------------------------------
    def submit(self, step: int, prompts: list[dict], seed: int, group_size: int | None = None,
               sampling: Sampling | None = None) -> Pending:
        """Fan one step's prompts out over the workers at their current version.

        `group_size` and `sampling` override the config's G and sampling (e.g. for SENT); the
        share seeds come from `seed`.
        """
        shares = self._shares(prompts, seed, group_size, sampling)
        for share in shares:
            self._launch(share)
        return Pending(step, shares)

    def submit_steps(self, steps: list[tuple[int, list[dict], int]]) -> dict[int, Pending]:
        """Several steps' (step, prompts, seed) in one generate call per worker: {step: Pending}.

        Each step is split over the workers as `submit` splits it, and each share keeps its
        own seed, so a share re-run alone after a fault gives the same completions.
        """
        if len(steps) == 1:
            step, prompts, seed = steps[0]
            return {step: self.submit(step, prompts, seed)}
        pending = {step: Pending(step, self._shares(prompts, seed, None, None))
                   for step, prompts, seed in steps}
        for i, worker in enumerate(self.workers):
            mine = [s for p in pending.values() for s in p.shares if s.worker == i]
            if not mine:
                continue
            refs = worker.generate_split.options(num_returns=2 * len(mine)).remote(
                [s.call for s in mine])
            for part, share in enumerate(mine):
                share.summary, share.batch = refs[part], refs[len(mine) + part]
                share.actor = worker
        return pending

    def _shares(self, prompts: list[dict], seed: int, group_size: int | None,
                sampling: Sampling | None) -> list[Share]:
        n = len(self.workers)
        bounds = [round(j * len(prompts) / n) for j in range(n + 1)]
        base = sampling or Sampling()
        return [Share(i, RolloutCall(prompts[bounds[i]: bounds[i + 1]],
                                     group_size or self.cfg.rollout.group_size,
                                     replace(base, seed=seed * 1000 + i)), self.versions[i])
                for i in range(n) if bounds[i + 1] > bounds[i]]

    def _launch(self, share: Share) -> None:
        share.actor = self.workers[share.worker]
        share.summary, share.batch = share.actor.generate_split.options(
            num_returns=2).remote([share.call])

    def collect(self, pending: Pending) -> Rollout:
        """Wait for every share's summary; a dead or hung worker is replaced and its share
        re-run. The batches stay in the object store (`Rollout.batches`)."""
        results: dict[int, RolloutSummary] = {}
        todo = list(pending.shares)
        while todo:
            share = todo.pop(0)
            try:
                result = ray.get(share.summary, timeout=self.cfg.rollout.call_timeout_s)
                if not self._settle_pushes(share.worker) or result.version != share.version:
                    log.warning("worker %d generated step %d with version %d, not %d; re-running"
                                " its share", share.worker, pending.step, result.version,
                                share.version)
                    self._recover(share, replace=False)
                    todo.append(share)
                    continue
                results[share.worker] = result
            except (RayActorError, GetTimeoutError) as e:
                if self.learner is not None:
                    raise  # the learner itself: the run restores its last checkpoint
                log.warning("worker %d failed on step %d (%s); re-running its share",
                            share.worker, pending.step, type(e).__name__)
                self._recover(share)
                todo.append(share)
            except RayTaskError:
                raise  # a bug in the worker, not a fault: surface it
        return Rollout(RolloutSummary.concat([results[s.worker] for s in pending.shares]),
                       [s.batch for s in pending.shares])

    def _settle_pushes(self, i: int) -> bool:
        """Check the pushes to worker i that have finished; False if one failed (now redone).

        A failed push is retried (`_load`), and raises WeightSyncError when it keeps failing.
        Pushes still running are left alone: this never waits.
        """
        ok, still = True, []
        for version, ref in self.push_refs[i]:
            if not ray.wait([ref], timeout=0)[0]:
                still.append((version, ref))
                continue
            try:
                ray.get(ref)
            except RayActorError:
                continue  # a dead worker: its next rollout fails and `_recover` replaces it
            except RayTaskError as e:
                log.warning("worker %d failed to load version %d (%s); retrying", i, version,
                            error_line(e))
                self._load(i, max(version, self.version))
                ok = False
        self.push_refs[i] = still
        return ok

    def settle(self) -> int:
        """Wait for every queued push and check each worker answers; a worker found dead or
        hung is replaced and given the newest version. Returns how many were replaced.

        A worker that dies after its last rollout call is otherwise noticed by nothing: the
        pushes queued on it are dropped (`_settle_pushes`), and whoever uses the pool next
        (an evaluation, the next stage) would meet a dead actor. The driver calls this at the
        end of a run, after the final push.
        """
        replaced = 0
        for i, worker in enumerate(self.workers):
            ping = worker.ping.remote()
            refs = [ref for _, ref in self.push_refs[i]] + [ping]
            ray.wait(refs, num_returns=len(refs), timeout=self.cfg.rollout.call_timeout_s)
            self._settle_pushes(i)  # a refused push is retried; those on a dead actor dropped
            try:
                ray.get(ping, timeout=0)  # not done within the wait above: hung
                continue
            except (RayActorError, GetTimeoutError) as e:
                if self.learner is not None:
                    raise  # the learner itself: the run restores its last checkpoint
                log.warning("worker %d is gone at the end of the run (%s); replacing it", i,
                            type(e).__name__)
            self._replace_and_load(i, self.version)
            self.versions[i] = self.version
            replaced += 1
        return replaced

    def _load(self, i: int, version: int, timeout_s: float | None = None) -> None:
        """Load `version` on worker i now, up to PUSH_TRIES times; WeightSyncError after that."""
        error = None
        for _ in range(PUSH_TRIES):
            try:
                ray.get(self.workers[i].set_weights.remote(self.payloads[version], version, True),
                        timeout=timeout_s or self.cfg.rollout.call_timeout_s)
                return
            except (RayTaskError, GetTimeoutError) as e:
                error = e
        raise WeightSyncError(f"worker {i} could not load weights version {version} after "
                              f"{PUSH_TRIES} tries: {error_line(error)}")

    def _recover(self, share: Share, replace: bool = True) -> None:
        """Re-run a failed share on a live worker holding exactly the share's weight version.

        The first failure of an actor replaces it; a later share that was queued on the same
        dead actor reuses the replacement. Pushes queued on the dead actor were lost, so the
        newest version is re-applied after the re-run.
        """
        i = share.worker
        if replace and share.actor is self.workers[i]:
            self._replace_and_load(i, share.version)
        else:
            self._load(i, share.version, START_TIMEOUT_S)
        self._launch(share)
        self.push_refs[i].append((self.version, self.workers[i].set_weights.remote(
            self.payloads[self.version], self.version, True)))
        self.versions[i] = self.version

    def _replace_and_load(self, i: int, version: int) -> None:
        """Replace worker i and load `version` on the new one. A lost node is reported dead
        some seconds after its worker stops answering, so the first replacement can land in
        the bundle still assigned to it and die with it: then Ray re-places the bundle (waited
        for, up to run.wait_for_capacity_s) and the worker is replaced again."""
        for attempt in range(1, PUSH_TRIES + 1):
            if self.layout is not None:
                self.layout.await_bundles(self.cfg.run.wait_for_capacity_s, f"rollout worker {i}")
            self.replace(i)
            self.push_refs[i] = []  # queued on the dead actor; the newest is re-applied later
            try:
                self._load(i, version, START_TIMEOUT_S)  # includes the new worker's model load
                return
            except RayActorError as e:
                if attempt == PUSH_TRIES:
                    raise
                log.warning("replacement of worker %d died too (%s); replacing it again",
                            i, error_line(e))

    # ---- a shared GPU ----------------------------------------------------------------------
    def sleep(self) -> None:
        """Every worker frees the card for the learner's step (vLLM sleep mode; the HF engine
        moves its model to host memory); returns once all have."""
        ray.get([w.sleep.remote() for w in self.workers], timeout=self.cfg.rollout.call_timeout_s)

    def wake(self) -> None:
        """Every worker takes the card back (before the next push and rollout)."""
        ray.get([w.wake_up.remote() for w in self.workers],
                timeout=self.cfg.rollout.call_timeout_s)

    def replace(self, i: int) -> None:
        """Kill worker i (SIGKILL if it is hung) and start a new one in its bundle."""
        if self.learner is not None:
            raise RuntimeError("one-copy mode: the rollout worker is the learner; a lost "
                               "learner is restored from its checkpoint, not replaced here")
        ray.kill(self.workers[i], no_restart=True)
        self.restarts += 1
        self.workers[i] = self._spawn(i)

    def worker_pids(self) -> list[int]:
        return [p["pid"] for p in ray.get([w.ping.remote() for w in self.workers])]

    def worker_versions(self) -> list[int]:
        return [p["version"] for p in ray.get([w.ping.remote() for w in self.workers])]

    def shutdown(self) -> None:
        if self.learner is None:  # one-copy mode: the driver closes its learner itself
            kill_and_wait(self.workers)


def error_line(e: BaseException | None) -> str:
    """The message a user needs from a Ray error: its last non-empty line (the raised error),
    its class named without its module (`CacheWriteError: ...`)."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return re.sub(r"^(?:\w+\.)+(\w+: )", r"\1", lines[-1].strip()) if lines else type(e).__name__


def kill_and_wait(actors: list, timeout_s: float = 30.0) -> None:
    """Kill actors and wait until Ray reports them dead, so their names are free again."""
    for a in actors:
        ray.kill(a, no_restart=True)
    for a in actors:
        try:
            ray.get(a.ping.remote(), timeout=timeout_s)
        except (RayActorError, GetTimeoutError):
            pass


def close_and_kill(actors: list, timeout_s: float = 30.0) -> None:
    """Let actors clean up first (`close`: the learner removes its node's core-sharing flag
    file, which the driver on another node cannot), then `kill_and_wait` them; a dead or hung
    one is killed all the same."""
    with contextlib.suppress(RayActorError, GetTimeoutError):
        ray.get([a.close.remote() for a in actors], timeout=timeout_s)
    kill_and_wait(actors, timeout_s)
