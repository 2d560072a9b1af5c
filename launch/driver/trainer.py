"""The training run's driver loop: the Trainer owns the actors, the step loop and the run
directory (`python -m launch.train` builds one: launch/train.py).

Data flow of step k (typed objects from common/types.py at each hand-off): RolloutCall per
worker share -> each worker generates G completions per prompt and verifies them, returning a
RolloutSummary to the driver and leaving the RolloutBatch in the object store -> the driver's
TrainPlan (group-normalised advantages) -> Learner.train_step(plan, *batch refs) -> LearnerStep;
before the next rollout launch the newest WeightUpdate is exported once into the object store
and every worker loads that ref. Step k's rollout uses weights version >= k - max_staleness: at
staleness 1 rollout k+1 runs while the learner trains on step k (common/core_lease.py lends it
the learner's idle cores). steps_per_call F: F steps share one generate call (staleness 2F-1).
In one-copy mode (rollout.engine=learner) the learner's actor is also the one rollout worker
(launch/driver/one_copy.py).
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import time

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError
from tqdm import tqdm

from common import metrics as M
from common.config import Config, ConfigError
from common.core_lease import lease_key, remove_flag
from common.memory import Footprint, footprint, memory_row, ray_row, tcmalloc_env
from common.models import resolve_model
from common.types import LearnerStep, RolloutSummary, TrainPlan
from launch.driver.checkpointing import Checkpointer
from launch.driver.curriculum import Curriculum, stage_order
from launch.driver.metrics import DashboardMetrics
from launch.driver.placement import connect, make_placement, refuse_missing_gpu
from launch.driver.pool import Rollout, Slot, close_and_kill
from launch.driver.roles import start_roles
from launch.rundir import writer as run_files
from launch.rundir.checkpoints import (
    DriverState,
    PendingStep,
    checkpoint_step,
    list_checkpoints,
    newest_readable,
)
from launch.rundir.reward_code import read_reward_code
from learner.advantages import plan_step
from rewards.fnbatch import check_reward_fns
from tasks import DatasetError

log = logging.getLogger("homerl.train")


class RunStopped(Exception):
    """RUN_DIR/STOP (or the caller's `on_step`) asked the run to stop; it checkpointed the step
    it stopped at. `why`: what asked ("RUN_DIR/STOP", or the reason `on_step` gave)."""

    def __init__(self, step: int, why: str = "RUN_DIR/STOP"):
        super().__init__(f"stopped at step {step} ({why})")
        self.step, self.why = step, why


class Trainer:
    """Drives one run: owns the actors, the step loop and the run directory."""

    checkpointer_class: type[Checkpointer] = Checkpointer
    """what writes this run's checkpoints (the fault tests and tools.ops.faults inject disk
    faults through a subclass of it)"""

    def __init__(self, cfg: Config, run_dir: str, resume: bool = False,
                 learner_restarts: int = 0, worker_restarts: int = 0):
        self.cfg, self.run_dir = cfg, run_dir
        self.learner_restarts = learner_restarts  # learner deaths survived (run_supervised)
        refuse_missing_gpu(cfg)  # seconds, not the minutes a dataset or model load would take
        self.curriculum = Curriculum(cfg)  # bad stages or data fail here, before any actor
        self.fn_code = read_reward_code(run_dir, cfg.reward)  # by-value functions' bytes
        check_reward_fns(cfg.reward, self.fn_code)  # so does a reward.fn that cannot load
        self.trained_stage, self.tag = 0, os.path.basename(os.path.normpath(run_dir))
        resolve_model(cfg.model.name)  # a missing model fails here in one line, not in an actor
        # an unreadable checkpoint fails here too, unless an older one is readable
        ckpt = newest_readable(list_checkpoints(run_dir)) if resume else None
        if ckpt and (at := checkpoint_step(ckpt)) > cfg.run.steps:
            raise ConfigError(f"run.steps {cfg.run.steps}: {ckpt} is already at step {at}; "
                              f"--steps must be at least {at}")
        self.devices = connect(cfg)  # a GPU request that cannot be met fails here, in one line
        # restored after a learner death (maybe a lost node): wait for room, saying so
        self.layout = make_placement(cfg, self.devices, wait_s=(
            cfg.run.wait_for_capacity_s if learner_restarts else 0.0))
        self.learner = self.pool = self.writer = None
        self.closed = False  # shutdown() has run (it runs once)
        try:
            self._start(ckpt, resume, worker_restarts)
        except BaseException:  # a caller's own cluster (ray.init, then homerl) goes on running:
            self.shutdown()    # leave it no actor and no reserved cores
            raise

    def _start(self, ckpt: str | None, resume: bool, worker_restarts: int) -> None:
        """The actors, the initial weights, the restored state and the metrics writer."""
        cfg, run_dir = self.cfg, self.run_dir
        self.dash = DashboardMetrics(self.tag)  # Ray dashboard / Prometheus: homerl_* per step
        cpu_tcmalloc = cfg.run.learner_tcmalloc and not self.layout.learner_gpus
        # a shared card: the learner holds its model before the engine starts (driver/roles.py)
        self.learner, self.pool = start_roles(cfg, self.devices, self.layout, self.tag,
                                              tcmalloc_env() if cpu_tcmalloc else None,
                                              fn_code=self.fn_code)
        self.pool.push(self.learner.export.remote(), 0, initial=True)  # what workers start with
        self.ckpt = self.checkpointer_class(cfg, run_dir, self.learner)
        self.unlogged: dict | None = None  # a step's row until the checkpoint after it is done
        self.restored_rows: list[dict] = []
        self.start, self.pending = 0, {}
        self.learner_version = 0  # the learner's weights version; workers get it lazily (_fill)
        self.ray_memory_logged = False  # Ray's daemons' memory goes in the run's first row
        self.engine_awake = True  # a shared GPU: the engine sleeps through each learner step
        self.card_log = collections.deque(maxlen=64)  # (event, step) on a shared GPU
        if cfg.curriculum.sent:
            self._sent_orders()
        if ckpt:
            self._restore(ckpt)
        # a restore after a learner death keeps counting the worker restarts since the checkpoint
        self.pool.restarts = max(self.pool.restarts, worker_restarts)
        self.writer = run_files.RunWriter(run_dir, cfg.to_dict(), self.start if resume else None)
        self.log_restored_rows()  # a row the checkpoint holds that metrics.jsonl lacks
        run_files.clear_stop(run_dir)  # starting or resuming is the user's word to run

    def _sent_orders(self) -> None:
        """SENT: score each stage's prompt pool on the workers (cached), train easy -> hard."""
        for i, (stage, task) in enumerate(zip(self.curriculum.stages, self.curriculum.tasks)):
            order, cached = stage_order(self.pool, task, self.cfg, stage)
            self.curriculum.orders[i] = order
            log.info("SENT order for stage %d (%s-%d)%s", i, stage.task, stage.level,
                     " from cache" if cached else "")

    def _fill(self, k: int) -> float:
        """Launch the rollouts step k may start: steps up to k + max_staleness, in calls of
        steps_per_call consecutive steps (a call is launched only when all its steps are within
        the staleness bound). Pushes the learner's newest weights first; returns the sync time.
        """
        r, n = self.cfg.rollout, self.cfg.run.steps
        nxt = max([j for j in self.pending if j >= k], default=k - 1) + 1
        sync_s = 0.0
        while nxt < n:
            chunk = list(range(nxt, min(nxt + r.steps_per_call, n)))
            if chunk[-1] > k + r.max_staleness:
                break
            self._take_card("wake", k)
            sync_s += self.sync_weights()
            drawn = {j: self.curriculum.prompts(j) for j in chunk}  # j -> (stage, prompts)
            seed = self.cfg.run.seed * 100_003
            works = self.pool.submit_steps([(j, p, seed + j) for j, (_, p) in drawn.items()])
            for j, (stage, prompts) in drawn.items():
                self.pending[j] = Slot(stage, prompts, works[j])
            nxt = chunk[-1] + 1
        return sync_s

    def end_on_final_weights(self) -> int:
        """Push the newest weights; every worker ends on them (e.g. to evaluate), a
        replacement for one dead after its last rollout included. Returns workers replaced."""
        self.sync_weights()
        return self.pool.settle()

    def sync_weights(self) -> float:
        """Export the learner's newest weights once and queue them on every worker (if the
        workers lack them); returns the seconds spent.

        The driver calls it only before a launch and at the end, so a version no rollout uses
        is never exported or loaded: with steps_per_call > 1 most versions are skipped.
        """
        if self.pool.version >= self.learner_version:
            return 0.0
        t0 = time.perf_counter()
        payload = self.learner.export.remote()
        ray.wait([payload])  # export into the object store; workers load it in their queue
        self.pool.push(payload, self.learner_version)
        return time.perf_counter() - t0

    def _take_card(self, event: str, k: int) -> None:
        """A shared GPU (common/device.py): the engine sleeps through the learner's step and
        wakes before the next weight push and rollout. Nothing happens on CPU roles."""
        if not self.devices.shared_card or self.engine_awake == (event == "wake"):
            return
        self.pool.sleep() if event == "sleep" else self.pool.wake()
        self.engine_awake = event == "wake"
        self.card_log.append((event, k))

    def drain(self) -> None:
        """Wait for the rollouts in flight, kept for their steps (a caller that pauses its
        clock next, like tools.compare.time_to_accuracy, gets no rollout work done while paused)."""
        for slot in self.pending.values():
            self._collect(slot)

    def _rollout(self, k: int) -> Slot:
        return self._collect(self.pending.pop(k))

    def _collect(self, slot: Slot) -> Slot:
        """The slot with its rollout collected (a no-op once it has been)."""
        if not isinstance(slot.work, Rollout):
            slot.work = self.pool.collect(slot.work)
        return slot

    def _enter_stage(self, stage: int) -> dict:
        """Stage boundary: the learner consolidates (anchor, and Fisher from the last stage's
        batches, which it kept) for EWC and anchor-KL."""
        ewc_on = self.cfg.ewc.lam > 0 or self.cfg.ewc.anchor_kl > 0
        out = ray.get(self.learner.consolidate.remote()) if ewc_on else {}
        self.trained_stage = stage
        return out

    def run(self, progress=None, on_step=None) -> dict:
        """Train steps start..run.steps and finish; returns the summary. `on_step(k, row)`
        after each step: a reason (e.g. "Ctrl-C") stops the run there as RUN_DIR/STOP does (a
        checkpoint, then RunStopped carrying it); None goes on. `progress`: the bar's stream
        (False: no bar)."""
        cfg, t_start = self.cfg, time.perf_counter()
        bar = tqdm(range(self.start, cfg.run.steps), desc="train", unit="step",
                   initial=self.start, total=cfg.run.steps, disable=progress is False,
                   file=progress or sys.stdout)
        for k in bar:
            row = self.step(k)
            bar.set_postfix(reward=f"{row[M.REWARD_MEAN]:.2f}", acc=f"{row[M.REWARD_CORRECT]:.2f}",
                            s_step=f"{row[M.STEP_S]:.1f}")
            why = on_step(k, row) if on_step is not None else None
            if k + 1 < cfg.run.steps and (why or run_files.stop_requested(self.run_dir)):
                bar.close()
                self.stop(k + 1, why or "RUN_DIR/STOP")
        return self.finish(time.perf_counter() - t_start)

    def stop(self, step: int, why: str = "RUN_DIR/STOP") -> None:
        """RUN_DIR/STOP: checkpoint `step` (unless the step loop just did) and raise RunStopped,
        so `--resume` redoes nothing. The file is removed when the run starts again."""
        every = self.cfg.run.checkpoint_every
        if not (every and step % every == 0):
            self._fill(step)  # as a scheduled checkpoint: the next rollouts are launched first
            self.checkpoint(step)
        self.writer.close()
        raise RunStopped(step, why)

    def step(self, k: int) -> dict:
        """Launch what staleness allows (pushing the newest weights first) -> rollout k ->
        GRPO update. The driver holds summaries; the batches go from the object store to the
        learner."""
        cfg, t0 = self.cfg, time.perf_counter()
        t_sync = self._fill(k)
        slot = self._rollout(k)
        rollout: Rollout = slot.work
        summary = rollout.summary
        t_roll = time.perf_counter() - t0 - t_sync
        stage_stats = self._enter_stage(slot.stage) if slot.stage != self.trained_stage else {}
        if not len(summary.lengths):
            reasons = sorted({s["reason"] for s in summary.skipped})
            raise DatasetError(f"step {k}: every prompt was refused ({', '.join(reasons)}); "
                               "check rollout.max_prompt_tokens and the data")
        plan, plan_stats = plan_step(summary, cfg)
        self._take_card("sleep", k)
        t1 = time.perf_counter()
        learned: LearnerStep = self._learner_step(plan, rollout.batches)
        t_learn = time.perf_counter() - t1
        self.learner_version = learned.version
        self.curriculum.observe(float(np.mean(summary.correct)))
        # the driver alone: a local Ray cluster's processes are its children
        memory = memory_row(footprint(children=False),
                            Footprint(learned.rss_gb, learned.pss_gb, learned.peak_gb),
                            summary.memory, summary.verifier_memory)
        row = {M.STEP: k, **summary.metrics(), **plan_stats, **learned.row(), **stage_stats,
               M.CURRICULUM_STAGE: slot.stage, M.ROLLOUT_S: summary.gen_time_s,
               M.ROLLOUT_WAIT_S: t_roll, M.LEARNER_S: t_learn, M.SYNC_S: t_sync,
               M.RESTARTS: self.pool.restarts, M.LEARNER_RESTARTS: self.learner_restarts,
               **memory}
        if not self.ray_memory_logged:  # Ray's daemons: once, outside the run's totals
            row |= ray_row()
            self.ray_memory_logged = True
        every = cfg.run.checkpoint_every
        if every and (k + 1) % every == 0 and k + 1 < cfg.run.steps:
            row[M.SYNC_S] += self._fill(k + 1)
            # this row is logged after the checkpoint, so it goes in it too: a crash between
            # the two loses no row (launch/driver/checkpointing.py)
            self.unlogged = {**row, M.STEP_S: time.perf_counter() - t0}
            row[M.CHECKPOINT_S] = self.checkpoint(k + 1)
            self.unlogged = None
        row[M.CHECKPOINT_FAILURES] = self.ckpt.failures
        row[M.STEP_S] = time.perf_counter() - t0
        self.writer.log(row)
        self.dash.record(row)
        if k % cfg.run.sample_every == 0:
            self.writer.samples(k, run_files.sample_rows(summary, slot.prompts))
        return row

    def finish(self, wall_s: float) -> dict:
        self._take_card("wake", self.cfg.run.steps)
        self.end_on_final_weights()
        steps = self.cfg.run.steps  # the last step's checkpoint, then final/
        final = self.ckpt.save_end(steps, lambda: self._driver_state(steps), self.writer,
                                   trained=self.start < steps)
        rows = self.writer.metrics()
        tail = rows[-max(1, len(rows) // 5):]
        summary = {
            "steps": len(rows), "wall_s": wall_s, "final": final,
            "s_per_step_median": float(np.median([r[M.STEP_S] for r in rows])) if rows else 0,
            "reward_first": rows[0][M.REWARD_MEAN] if rows else None,
            "reward_last_20pct": float(np.mean([r[M.REWARD_MEAN] for r in tail])) if rows else None,
            "correct_last_20pct": (float(np.mean([r[M.REWARD_CORRECT] for r in tail]))
                                   if rows else None),
            "worker_restarts": self.pool.restarts, "learner_restarts": self.learner_restarts,
        }
        run_files.plot_curves(self.run_dir, rows)
        self.writer.summary(summary)
        return summary

    # ---- checkpoints (launch/driver/checkpointing.py writes them) ----------------------------
    def checkpoint(self, step: int) -> float:
        """The learner's and the driver's state at `step`; returns its seconds."""
        return self.ckpt.save(step, lambda: self._driver_state(step), self.writer)

    def _driver_state(self, step: int) -> DriverState:
        """What the driver must keep to resume at `step`: the rollouts already generated for
        later steps, the curriculum, and the row of the step before (logged after it)."""
        pending = {}
        for j in sorted(self.pending):
            slot = self._rollout(j)
            self.pending[j] = slot
            pending[j] = PendingStep(slot.stage, slot.prompts, ray.get(slot.work.batches))
        return DriverState(step, self.pool.restarts, self.curriculum.state_dict(),
                           self.trained_stage, pending, [self.unlogged] if self.unlogged else [])

    def _restore(self, ckpt: str) -> None:
        state, version = self.ckpt.restore(ckpt)
        if version > 0:
            self.pool.push(self.learner.export.remote(), version)
        self.learner_version = version
        self.start = state.step
        self.pool.restarts = state.restarts
        for j, p in state.pending.items():  # rollouts generated before the checkpoint
            summary = RolloutSummary.concat([b.summary() for b in p.batches])
            self.pending[j] = Slot(p.stage, p.prompts,
                                   Rollout(summary, [ray.put(b) for b in p.batches]))
        self.curriculum.load_state_dict(state.curriculum)
        self.trained_stage = state.trained_stage
        self.restored_rows = state.rows

    def log_restored_rows(self) -> None:
        """The metrics row a checkpoint holds (a step's row is logged just after the checkpoint
        that follows it), logged if metrics.jsonl lacks it: a crash between the two loses none."""
        have = {r.get("step") for r in self.writer.metrics()} if self.restored_rows else set()
        for row in self.restored_rows:
            if row.get("step") not in have:
                self.writer.log(row)

    def _learner_step(self, plan: TrainPlan, batches: list) -> LearnerStep:
        """The learner's update; one that outlives run.learner_timeout_s is a hung learner:
        it is killed, which run_supervised then treats like any learner death."""
        ref = self.learner.train_step.remote(plan, *batches)
        try:
            return ray.get(ref, timeout=self.cfg.run.learner_timeout_s)
        except GetTimeoutError:
            log.warning("the learner's step took over run.learner_timeout_s=%gs: killing it",
                        self.cfg.run.learner_timeout_s)
            ray.kill(self.learner, no_restart=True)
            raise

    def learner_alive(self, timeout_s: float = 30.0) -> bool:
        try:
            ray.get(self.learner.ping.remote(), timeout=timeout_s)
            return True
        except (RayActorError, GetTimeoutError):
            return False

    def shutdown(self) -> None:
        """End the run's actors and free its placement group (also after a failed start);
        a second call does nothing."""
        if self.closed:
            return
        self.closed = True
        if self.pool is not None:
            self.pool.shutdown()
        if self.learner is not None:
            close_and_kill([self.learner])  # the learner removes its core-sharing flag file
        remove_flag(lease_key())  # a dead learner's, if it ran on this node
        self.layout.remove()
        if self.writer is not None:
            self.writer.close()
