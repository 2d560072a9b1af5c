"""The learner: one GRPO update per step, EWC consolidation, weight export, checkpoints.

A plain class (tests build it without Ray); `launch/train.py` runs it as a Ray actor with
`ray.remote(num_cpus=k)(Learner)`. Run a step by hand:

    python -c "from learner.learner import Learner; from common.presets import get_preset; \
               Learner(get_preset('tiny'))"

A step whose loss or gradient norm is not finite (NaN or huge advantages) is skipped: its
gradients are dropped, the optimizer does not step, and the weights version stays where it was
(a version names one set of weights: the driver pushes weights only when the version grows, so
nothing is exported or reloaded for a skipped step); `learner/skipped_nonfinite` counts them,
and a warning says so. `save` refuses a state that is not finite, so no checkpoint holds a NaN.
"""

from __future__ import annotations

import collections
import logging
import os
import time

import numpy as np
import torch

from common import metrics as M
from common.core_lease import LEARNER, Lease, NoLease, flag_path, lease_key, set_torch_threads
from common.device import actor_device, cap_process_memory, ray_placement
from common.engine_budget import CUDA_CONTEXT, GiB, learner_cap_gb
from common.memory import footprint, pin_mmap_threshold, release_free_memory
from common.quant import nf4_state
from common.state_io import (
    CheckpointError,
    load_state,
    optimizer_state,
    optimizer_state_dict,
    rng_state,
    save_state,
    set_rng_state,
    train_batch_from_state,
    train_batch_to_state,
)
from common.types import LearnerStep, RolloutBatch, TrainBatch, TrainPlan, WeightUpdate
from learner import ewc, losses
from learner.export import export_weights, save_final
from learner.model import (
    build_policy,
    pick_dtype,
    reference_logprobs_context,
    set_threads,
    shared_prefix_logprobs,
)

CKPT = "learner"
"""file stem of the learner's part of a checkpoint (learner.safetensors + learner.json)"""

log = logging.getLogger("homerl.learner")


def _pad(rows: list, fill: float, width: int, dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(np.array(r), dtype=dtype)  # copy: Ray arrays are RO
    return out


def _not_finite(tensors: dict) -> str | None:
    """The name of the first floating-point tensor (torch or numpy) holding a NaN or inf."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor):
            bad = t.is_floating_point() and not bool(torch.isfinite(t).all())
        else:  # numpy (the kept batches' arrays)
            t = np.asarray(t)
            bad = np.issubdtype(t.dtype, np.floating) and not np.isfinite(t).all()
        if bad:
            return name
    return None


class Learner:
    """Owns the trainable policy, its optimizer and the EWC state."""

    def __init__(self, cfg):
        self.cfg = cfg
        pin_mmap_threshold()  # first: a step's freed activations then leave, not fragment
        set_threads(cfg.rollout.learner_threads)
        torch.manual_seed(cfg.run.seed)
        self.device = actor_device()  # the GPU share Ray gave this actor, else the CPU
        self.lease = self._lease()
        if self.device == "cuda" and cfg.model.gpu_memory_gb:
            # the whole budget in one-copy mode; on a time-sliced card, less what the sleeping
            # engine keeps (its CUDA context, vLLM's CUDA graphs: common/engine_budget.py). The
            # fraction caps torch's allocator, so this process's own context comes off too
            cap_process_memory(learner_cap_gb(cfg.model.gpu_memory_gb, cfg.rollout.engine)
                               - CUDA_CONTEXT / GiB)
        self.model, self.trainable = build_policy(cfg.model, cfg.lora, self.device)
        # Autocast only where weights are fp32 masters (full FT); a bf16 LoRA base runs as is.
        self.autocast = pick_dtype(cfg.model.dtype) if cfg.lora.mode == "full" else torch.float32
        self.params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        self.opt = torch.optim.AdamW(self.params.values(), lr=cfg.grpo.lr,
                                     weight_decay=cfg.grpo.weight_decay)
        self.version = 0
        self.skipped_nonfinite = 0
        """updates skipped so far because their loss or gradient norm was not finite"""
        self.fisher: dict[str, torch.Tensor] = {}
        self.anchor: dict[str, torch.Tensor] = {}
        self.recent: collections.deque[TrainBatch] = collections.deque(
            maxlen=cfg.ewc.fisher_batches)  # this stage's last batches, for the EWC Fisher
        self.ref_model = None
        if cfg.grpo.beta > 0 and cfg.lora.mode == "full":
            self.ref_model, _ = build_policy(cfg.model, cfg.lora, self.device)  # full FT only
            self.ref_model.requires_grad_(False)
        self.built_at = time.time()

    def ping(self) -> int:
        return self.version

    def ready(self) -> dict:
        """Answers once the model is built (Ray runs it after __init__): `allocated_bytes` of
        the card this process holds (0 on a CPU), and `built_at` (time.time()). On a shared
        card the driver waits for it before it starts the rollout engine, which measures the
        card's free memory as it starts (common/engine_budget.py)."""
        held = torch.cuda.memory_allocated() if self.device == "cuda" else 0
        return {"allocated_bytes": int(held), "device": self.device, "built_at": self.built_at}

    def nf4_state(self) -> dict:
        """QLoRA: the NF4 bytes of the base this learner trains on (common/quant.py), on the
        CPU. The rollout workers dequantise these, not a quantisation of their own."""
        return nf4_state(self.model)

    def close(self) -> None:
        """The run is over: remove this node's core-sharing flag file (the actor is killed
        next, and the driver may be on another node, where it cannot remove it)."""
        self.lease.close(remove=True)
        self.lease = NoLease()

    def placement(self) -> dict:
        """Where this learner runs: its device, what Ray assigned it (e.g. a GPU share), its
        node and pid."""
        where = ray_placement()
        return {"device": self.device, "resources": where["resources"],
                "node_id": where["node_id"], "pid": os.getpid()}

    # ---- the GRPO step -------------------------------------------------------------------
    def _micro_batches(self, batch: TrainBatch, active: list[int]):
        """Yield index lists of active sequences, a prompt's completions together (its prefix
        then runs once) and similar lengths together (less padding)."""
        mb = self.cfg.grpo.micro_batch
        order = sorted(active, key=lambda i: (len(batch.prompt_ids[i]),
                                              tuple(batch.prompt_ids[i]),
                                              len(batch.completion_ids[i])))
        for s in range(0, len(order), mb):
            yield order[s: s + mb]

    def _forward_selected(self, model, batch: TrainBatch, idx: list[int], sel: torch.Tensor):
        """Log-probs of the selected completion tokens of sequences `idx`, as (m, T) dense.

        sel: (N, T) bool selected-token mask of the whole step. Unselected entries are 0.
        Each distinct prompt among `idx` is run once (`shared_prefix_logprobs`).
        """
        rows, cols = sel[idx].nonzero(as_tuple=True)                           # (K,), (K,)
        # Causal: tokens after a sequence's last selected one cannot change the selected
        # log-probs, so they are not run (with rho = 0.2 that trims the tail of most rows).
        ends = torch.zeros(len(idx), dtype=torch.long).scatter_reduce(0, rows, cols + 1, "amax")
        comps = [batch.completion_ids[i][: int(e)] for i, e in zip(idx, ends)]
        logp_k, ent_k = shared_prefix_logprobs(
            model, [batch.prompt_ids[i] for i in idx], comps,
            rows, cols, self.cfg.rollout.temperature, self.autocast)
        logp = torch.zeros(len(idx), sel.shape[1])                             # (m, T)
        logp = logp.index_put((rows, cols), logp_k)
        return logp, ent_k

    def train_step(self, plan: TrainPlan, *batches: RolloutBatch) -> LearnerStep:
        """One GRPO update on a step's rollouts (the workers' shares, in order; Ray resolves
        their ObjectRefs, so they come straight from the object store) and the driver's plan."""
        batch = TrainBatch.from_rollouts(plan, list(batches))
        skipped = self.skipped_nonfinite
        step = self.train_on(batch)
        if self.skipped_nonfinite == skipped:  # trained on: a batch for the next EWC Fisher
            self.recent.append(batch)
        return step

    def _lease(self) -> Lease | NoLease:
        """Core sharing with the CPU rollout workers of this node (common/core_lease.py): this
        learner creates the node's flag file and borrows the cores of idle workers."""
        r = self.cfg.rollout
        # in one-copy mode no rollout worker exists to lend or borrow cores
        key = lease_key() if r.share_cores and self.device == "cpu" and not r.one_copy else None
        if key is None:
            return NoLease()
        return Lease(flag_path(key), LEARNER, r.learner_threads,
                     {1 + i: r.threads_per_worker for i in range(r.num_workers)},
                     set_threads=set_torch_threads, slots=1 + r.num_workers)

    def train_on(self, batch: TrainBatch) -> LearnerStep:
        """One GRPO update on a TrainBatch (what `train_step` runs)."""
        with self.lease.busy():  # this node's workers keep to their own cores
            return self._train_on(batch)

    def _train_on(self, batch: TrainBatch) -> LearnerStep:
        g, t0 = self.cfg.grpo, time.perf_counter()
        T = max(len(c) for c in batch.completion_ids)
        mask = _pad([[True] * len(c) for c in batch.completion_ids], False, T, torch.bool)
        if batch.keep is not None:
            mask &= torch.as_tensor(np.asarray(batch.keep, dtype=bool))[:, None]   # (N, T)
        entropy = _pad(batch.entropy, 0.0, T, torch.float32)                   # (N, T)
        old_logp = _pad(batch.old_logp, 0.0, T, torch.float32)                # (N, T)
        adv = torch.tensor(batch.advantages, dtype=torch.float32)               # (N,)
        sel = losses.entropy_topk_mask(entropy, mask, g.entropy_rho)            # (N, T)
        # With no KL term a zero-advantage sequence has zero gradient: skip its forward pass.
        kl_on = g.beta > 0 or (self.cfg.ewc.anchor_kl > 0 and bool(self.anchor))
        active = [i for i in range(len(adv)) if sel[i].any() and (adv[i] != 0 or kl_on)]
        stats, kl_anchor, terms = self._backward(batch, active, sel, mask, old_logp, adv)
        if not active:  # nothing trains: still measure learner vs behaviour log-probs
            stats = self._probe_logp(batch, sel, old_logp)
        ewc_loss = self._ewc_backward()
        staleness = self.version - batch.version if batch.version >= 0 else 0
        grad_norm = self._clip_and_step([*terms, ewc_loss])
        if self.device == "cuda":
            torch.cuda.empty_cache()  # the activations' blocks go back to the shared card
        release_free_memory()  # and on the CPU, the freed activations go back to the OS
        m, mem = stats.means(), footprint()
        return LearnerStep(
            loss_policy=m.policy, loss_kl=m.kl, loss_ewc=ewc_loss, loss_anchor_kl=kl_anchor,
            clip_frac=m.clip_frac, clip_frac_low=m.clip_frac_low,
            clip_frac_high=m.clip_frac_high, dual_clip_frac=m.dual_clip_frac,
            ratio_mean=m.ratio_mean, approx_kl=m.approx_kl, logp_diff=m.logp_diff,
            logp_diff_max=m.logp_diff_max,
            entropy=float((entropy * mask).sum() / mask.sum().clamp(min=1)),
            staleness=staleness, grad_norm=grad_norm, skipped_nonfinite=self.skipped_nonfinite,
            tokens_selected=int(sel.sum()), tokens_completion=int(mask.sum()),
            active_seqs=len(active), compute_s=time.perf_counter() - t0, version=self.version,
            rss_gb=mem.rss_gb, pss_gb=mem.pss_gb, peak_gb=mem.peak_gb)

    def _backward(self, batch: TrainBatch, active: list[int], sel: torch.Tensor,
                  mask: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor
                  ) -> tuple[losses.LossStats, float, list[float]]:
        """The step's loss backpropagated over the `active` sequences, a micro-batch at a time:
        (LossStats, the summed anchor-KL, each micro-batch's loss as a float)."""
        g = self.cfg.grpo
        # Normalised over the whole step, so micro-batching leaves the loss unchanged.
        weights = losses.loss_weights(sel, mask, g.loss_agg, self.cfg.rollout.max_new_tokens)
        anchored = self.cfg.ewc.anchor_kl > 0 and bool(self.anchor)
        stats, kl_anchor, terms = losses.LossStats(), 0.0, []
        for idx in self._micro_batches(batch, active):
            self.lease.pick()  # the cores of this node's waiting rollout workers too
            # before the forward that backward() needs: the anchor's swap writes the params
            anchor = self._anchor_logp(batch, idx, sel) if anchored else None
            logp, _ = self._forward_selected(self.model, batch, idx, sel)
            ref = self._ref_logp(batch, idx, sel) if g.beta > 0 else None
            loss, part = losses.grpo_loss(logp, old_logp[idx], adv[idx], weights[idx],
                                          eps_low=g.eps_low, eps_high=g.eps_high,
                                          dual_clip_c=self.cfg.dual_clip_c(), ref_logp=ref,
                                          beta=g.beta)
            if anchor is not None:
                kl = losses.anchor_kl(logp, anchor, weights[idx])
                loss = loss + self.cfg.ewc.anchor_kl * kl
                kl_anchor += float(kl.detach())
            self.lease.pick()  # the backward is ~2/3 of a micro-batch: check again
            loss.backward()
            terms.append(float(loss.detach()))
            stats = stats + part
        return stats, kl_anchor, terms

    @torch.no_grad()
    def _probe_logp(self, batch: TrainBatch, sel: torch.Tensor, old_logp: torch.Tensor):
        """logp_diff on one micro-batch of selected tokens, for a step that trains nothing."""
        idx = next(self._micro_batches(batch, [i for i in range(len(sel)) if sel[i].any()]),
                   None)
        if not idx:
            return losses.LossStats()
        logp, _ = self._forward_selected(self.model, batch, idx, sel)
        return losses.logp_stats(logp, old_logp[idx], sel[idx])

    def _ref_logp(self, batch, idx, sel):
        with torch.no_grad():
            if self.ref_model is not None:
                logp, _ = self._forward_selected(self.ref_model, batch, idx, sel)
            else:
                with reference_logprobs_context(self.model):  # LoRA: the base is the reference
                    logp, _ = self._forward_selected(self.model, batch, idx, sel)
        return logp

    @torch.no_grad()
    def _anchor_logp(self, batch, idx, sel):
        """Log-probs under the anchor (the policy at the end of the previous stage): the
        trainable tensors hold their anchor values for one forward, then their own again."""
        saved = {n: p.detach().clone() for n, p in self.params.items()}
        try:
            for n, p in self.params.items():
                p.copy_(self.anchor[n])
            logp, _ = self._forward_selected(self.model, batch, idx, sel)
        finally:
            for n, p in self.params.items():
                p.copy_(saved[n])
        return logp

    def _ewc_backward(self) -> float:
        if not self.fisher or self.cfg.ewc.lam == 0:
            return 0.0
        penalty = ewc.ewc_penalty(self.params, self.anchor, self.fisher, self.cfg.ewc.lam)
        penalty.backward()
        return float(penalty.detach())

    def _clip_and_step(self, terms: list[float]) -> float:
        """Clip the gradients and step, unless a loss term (`terms`) or the gradient norm is
        not finite: then the gradients are dropped, nothing steps, the version stays and the
        skip is counted and logged. Returns the gradient norm (before clipping)."""
        params = list(self.params.values())
        for p in params:  # no sequence trained (no reward spread): a zero gradient, on which
            if p.grad is None:  # AdamW still takes its momentum step, as TRL's loop does
                p.grad = torch.zeros_like(p)
        max_norm = self.cfg.grpo.max_grad_norm or float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if losses.update_is_finite(terms, norm):
            self.opt.step()
            self.version += 1
        else:
            self.skipped_nonfinite += 1
            log.warning("learner: update skipped, its loss or gradient norm is not finite "
                        "(loss terms %s, grad norm %g): weights, optimizer and version %d "
                        "unchanged (learner/skipped_nonfinite=%d)",
                        [f"{t:g}" for t in terms], norm, self.version, self.skipped_nonfinite)
        self.opt.zero_grad(set_to_none=True)
        return norm

    # ---- EWC -----------------------------------------------------------------------------
    def consolidate(self, batches: list[TrainBatch] | None = None) -> dict:
        """EWC at a stage boundary: Fisher and anchor (`_consolidate`)."""
        with self.lease.busy():  # this node's workers keep to their own cores
            return self._consolidate(batches)

    def _consolidate(self, batches: list[TrainBatch] | None = None) -> dict:
        """Diagonal empirical Fisher of the completions' log-likelihood, then anchor.

            F_i = 1/S sum_{s=1..S} ( d/d theta_i  log pi(y_s | x_s) )^2,
            log pi(y_s | x_s) = sum_t log pi(y_s,t | x_s, y_s,<t)

        over the S sampled sequences of `batches` (default: the last `ewc.fisher_batches`
        batches this learner trained on, which the stage boundary then forgets): one
        backward per sequence. It is a mean over sequences, so it does not depend on how many
        there are or how they were batched, and `ewc.lam` keeps its meaning when the batch
        size changes. (Squaring the gradient of a whole batch's mean loss instead shrinks F
        about S-fold, as per-sequence gradients mostly cancel.) Online EWC:
        F <- gamma * F_prev + F_new.
        """
        t0 = time.perf_counter()
        new = {n: torch.zeros_like(p) for n, p in self.params.items()}
        used = list(self.recent) if batches is None else batches[: self.cfg.ewc.fisher_batches]
        if batches is None:
            self.recent.clear()
        if self.cfg.ewc.lam == 0 and self.cfg.ewc.anchor_kl > 0:
            used = []  # anchor-KL alone needs the anchor, not the Fisher
        count = sum(len(b.completion_ids) for b in used)
        for batch in used:
            T = max(len(c) for c in batch.completion_ids)
            sel = _pad([[True] * len(c) for c in batch.completion_ids], False, T, torch.bool)
            for i in range(len(batch.completion_ids)):
                logp, _ = self._forward_selected(self.model, batch, [i], sel)       # (1, T)
                logp.sum().backward()  # the sequence's log-likelihood
                for n, p in self.params.items():
                    if p.grad is not None:
                        new[n] += p.grad.detach() ** 2 / count
                self.opt.zero_grad(set_to_none=True)
        if used:
            self.fisher = ewc.online_fisher(self.fisher or None, new, self.cfg.ewc.gamma)
        self.anchor = {n: p.detach().clone() for n, p in self.params.items()}
        total = sum(float(f.sum()) for f in self.fisher.values())
        return {M.EWC_FISHER_SUM: total, M.CONSOLIDATE_S: time.perf_counter() - t0}

    # ---- weights and checkpoints -------------------------------------------------------------
    def export(self) -> WeightUpdate:
        """What rollout workers need for the current version (LoRA: adapters only)."""
        return export_weights(self.model, self.cfg.lora, self.version)

    def save(self, path: str) -> None:
        """Everything needed to resume bit-for-bit, as plain state (written into `path`):
        trainable tensors, optimizer state, EWC Fisher and anchor, the batches kept for the
        next Fisher, and RNG states. A state holding a NaN or inf is refused, nothing written:
        a one-line CheckpointError naming the tensor (the driver then keeps the previous
        checkpoint, the last finite state, and follows run.checkpoint_fail_policy)."""
        tensors, meta = rng_state()
        opt_tensors, opt_meta = optimizer_state(self.opt.state_dict())
        tensors.update(opt_tensors)
        tensors.update({f"param.{n}": p for n, p in self.params.items()})
        tensors.update({f"fisher.{n}": f for n, f in self.fisher.items()})
        tensors.update({f"anchor.{n}": a for n, a in self.anchor.items()})
        recent = []
        for i, b in enumerate(self.recent):
            t, m = train_batch_to_state(f"recent.{i}", b)
            tensors.update(t)
            recent.append(m)
        bad = _not_finite(tensors)
        if bad is not None:
            raise CheckpointError(f"{path}: {bad} is not finite (NaN or inf); the learner's "
                                  "state is not written")
        meta.update(version=self.version, opt=opt_meta, recent=recent,
                    fisher=sorted(self.fisher), anchor=sorted(self.anchor),
                    params=sorted(self.params), skipped_nonfinite=self.skipped_nonfinite)
        save_state(path, CKPT, tensors, meta)

    def load(self, path: str) -> int:
        """Restore `save`; a checkpoint of another model is a one-line CheckpointError."""
        tensors, meta = load_state(path, CKPT)
        if sorted(meta.get("params", [])) != sorted(self.params):
            raise CheckpointError(f"{path}: its trainable tensors are not this learner's "
                                  "(another model or lora.mode)")
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(tensors[f"param.{n}"])
        self.opt.load_state_dict(optimizer_state_dict(tensors, meta["opt"]))
        self.version = meta["version"]
        self.skipped_nonfinite = meta.get("skipped_nonfinite", 0)  # older checkpoints: none
        self.fisher = {n: tensors[f"fisher.{n}"] for n in meta["fisher"]}
        self.anchor = {n: tensors[f"anchor.{n}"] for n in meta.get("anchor", meta["fisher"])}
        self.recent.clear()
        self.recent.extend(train_batch_from_state(f"recent.{i}", tensors, m)
                           for i, m in enumerate(meta["recent"]))
        set_rng_state(tensors, meta)
        return self.version

    def save_final(self, path: str, merged: bool = False) -> str:
        """A checkpoint transformers/peft can load; `merged` folds LoRA into full weights."""
        return save_final(self.model, self.cfg, path, merged)
