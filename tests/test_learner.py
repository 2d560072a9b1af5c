"""The learner on a tiny random Llama: full, LoRA and QLoRA steps, export, EWC, checkpoints."""

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

from actors.weights import WeightApplier
from common.models import load_model, resolve_model
from common.presets import get_preset
from common.state_io import CheckpointError
from common.types import RolloutBatch, TrainBatch, TrainPlan
from learner.export import to_peft_state_dict
from learner.learner import Learner


def tiny_cfg(mode="lora", **grpo):
    cfg = get_preset("tiny")
    cfg.lora.mode = mode
    for k, v in grpo.items():
        setattr(cfg.grpo, k, v)
    return cfg


def make_batch(n=8, seed=0, vocab=90) -> TrainBatch:
    rng = np.random.default_rng(seed)
    comps = [list(rng.integers(3, vocab, rng.integers(2, 9))) for _ in range(n)]
    return TrainBatch(
        prompt_ids=[list(rng.integers(3, vocab, rng.integers(3, 7))) for _ in range(n)],
        completion_ids=comps,
        old_logp=[np.full(len(c), -4.0, np.float32) for c in comps],
        entropy=[rng.random(len(c)).astype(np.float32) for c in comps],
        advantages=rng.normal(size=n).astype(np.float32),
    )


def full_logprobs(model, batch: TrainBatch) -> list[torch.Tensor]:
    """Reference: plain full-vocab forward, one sequence at a time."""
    out = []
    for p, c in zip(batch.prompt_ids, batch.completion_ids):
        ids = torch.tensor([p + c])
        logits = model(input_ids=ids).logits[0, len(p) - 1: -1].float()
        out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0])
    return out


@pytest.mark.parametrize("mode", ["full", "lora", "qlora"])
def test_one_step_changes_trainable_only(mode):
    learner = Learner(tiny_cfg(mode))
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    metrics = learner.train_on(make_batch()).row()
    assert np.isfinite(metrics["loss/policy"]) and metrics["grad/norm"] > 0
    assert metrics["weights/version"] == 1
    changed = {n for n, p in learner.model.named_parameters()
               if not torch.equal(before[n], p.detach())}
    assert changed and changed <= set(learner.trainable)
    if mode != "full":
        assert all("lora_" in n for n in learner.trainable)
        # B starts at zero, so the first step moves every B (A's gradient is B^T @ ... = 0).
        assert {n for n in learner.trainable if "lora_B" in n} <= changed


def test_selected_logprobs_match_full_forward():
    learner = Learner(tiny_cfg("full", entropy_rho=0.5))
    batch = make_batch(6, seed=1)
    T = max(len(c) for c in batch.completion_ids)
    sel = torch.zeros(6, T, dtype=torch.bool)
    for i, c in enumerate(batch.completion_ids):
        sel[i, : len(c): 2] = True  # every other token
    with torch.no_grad():
        logp, _ = learner._forward_selected(learner.model, batch, list(range(6)), sel)
        ref = full_logprobs(learner.model, batch)
    for i, r in enumerate(ref):
        n = len(r)
        torch.testing.assert_close(logp[i, :n][sel[i, :n]], r[sel[i, :n]], atol=1e-5, rtol=1e-5)
        assert torch.all(logp[i][~sel[i]] == 0)


def test_zero_advantage_step_leaves_weights_unchanged():
    learner = Learner(tiny_cfg("full"))
    batch = make_batch()
    batch.advantages[:] = 0
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    metrics = learner.train_on(batch).row()
    assert metrics["tokens/active_seqs"] == 0
    assert all(torch.equal(before[n], p) for n, p in learner.model.named_parameters())


def test_a_step_with_no_gradient_takes_adamws_momentum_step():
    """After a real update, an all-zero-advantage batch (no reward spread) moves the weights as
    AdamW moves them on a zero gradient (as TRL's loop does), rather than not at all."""
    learner = Learner(tiny_cfg("lora"))
    learner.train_on(make_batch())
    ref = {n: p.detach().clone() for n, p in learner.params.items()}
    opt = torch.optim.AdamW(ref.values(), lr=learner.cfg.grpo.lr, weight_decay=0.0)
    opt.load_state_dict(copy.deepcopy(learner.opt.state_dict()))  # else it shares the moments
    for t in ref.values():
        t.grad = torch.zeros_like(t)
    opt.step()
    batch = make_batch(seed=3)
    batch.advantages[:] = 0
    before = {n: p.detach().clone() for n, p in learner.params.items()}
    assert learner.train_on(batch).row()["tokens/active_seqs"] == 0
    assert any(not torch.equal(before[n], p) for n, p in learner.params.items())
    for n, p in learner.params.items():
        torch.testing.assert_close(p.detach(), ref[n], rtol=0, atol=1e-7)


def test_exported_lora_reproduces_learner_logprobs():
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    cfg = tiny_cfg("lora")
    learner = Learner(cfg)
    for s in range(3):
        learner.train_on(make_batch(seed=s)).row()
    payload = learner.export()
    assert payload.kind == "lora" and payload.version == 3
    batch = make_batch(4, seed=9)
    with torch.no_grad():
        want = full_logprobs(learner.model, batch)
    # A fresh peft copy loaded from the payload: bit-for-bit the learner's log-probs.
    fresh = get_peft_model(load_model(resolve_model(cfg.model.name)),
                           LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha,
                                      target_modules=cfg.lora.modules()))
    set_peft_model_state_dict(fresh, to_peft_state_dict(payload.tensors))
    fresh.eval()
    with torch.no_grad():
        got = full_logprobs(fresh, batch)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    # The rollout workers' merged path (W0 + s B A in a plain model): equal up to fp32 rounding.
    plain = load_model(resolve_model(cfg.model.name))
    WeightApplier(plain).apply(payload)
    with torch.no_grad():
        merged = full_logprobs(plain, batch)
    for a, b in zip(want, merged):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_full_export_loads_into_worker_model():
    learner = Learner(tiny_cfg("full"))
    learner.train_on(make_batch()).row()
    plain = load_model(resolve_model("tiny-random-llama"))
    WeightApplier(plain).apply(learner.export())
    batch = make_batch(3, seed=4)
    with torch.no_grad():
        for a, b in zip(full_logprobs(learner.model, batch), full_logprobs(plain, batch)):
            assert torch.equal(a, b)


def test_fisher_is_the_mean_of_per_sequence_squared_gradients():
    """F(batch) = mean over its sequences of F(that sequence alone): no cross terms, which the
    square of the batch-mean gradient would have (and be ~N times smaller)."""
    learner = Learner(tiny_cfg("lora"))
    learner.train_on(make_batch(seed=0)).row()  # move off the init, where LoRA B = 0
    batch = make_batch(3, seed=1)

    def fisher(b):
        learner.fisher = {}
        learner.consolidate([b])
        return learner.fisher

    whole = fisher(batch)
    singles = [fisher(TrainBatch(batch.prompt_ids[i:i + 1], batch.completion_ids[i:i + 1],
                                 batch.old_logp[i:i + 1], batch.entropy[i:i + 1],
                                 batch.advantages[i:i + 1])) for i in range(3)]
    for name, f in whole.items():
        mean = sum(s[name] for s in singles) / 3
        torch.testing.assert_close(f, mean, rtol=1e-4, atol=1e-12)
    assert sum(float(f.sum()) for f in whole.values()) > 0


def test_fisher_only_on_trainable_and_penalty_zero_at_anchor():
    cfg = tiny_cfg("lora")
    cfg.ewc.lam = 10.0
    learner = Learner(cfg)
    learner.train_on(make_batch(seed=0)).row()
    stats = learner.consolidate([make_batch(seed=1), make_batch(seed=2)])
    assert set(learner.fisher) == set(learner.trainable)
    assert stats["ewc/fisher_sum"] > 0
    assert all(torch.all(f >= 0) for f in learner.fisher.values())
    assert learner._ewc_backward() == 0.0  # at the anchor
    learner.opt.zero_grad(set_to_none=True)
    metrics = learner.train_on(make_batch(seed=3)).row()
    assert metrics["loss/ewc"] == 0.0  # penalty is measured before this step's update
    assert learner.train_on(make_batch(seed=4)).row()["loss/ewc"] > 0


def test_save_load_resumes_bit_for_bit(tmp_path):
    cfg = tiny_cfg("lora")
    a = Learner(cfg)
    a.train_on(make_batch(seed=0)).row()
    a.save(str(tmp_path))
    want = [a.train_on(make_batch(seed=s)).row() for s in (1, 2)]
    b = Learner(cfg)
    assert b.load(str(tmp_path)) == 1
    got = [b.train_on(make_batch(seed=s)).row() for s in (1, 2)]
    for w, g in zip(want, got):
        assert w["loss/policy"] == g["loss/policy"] and w["grad/norm"] == g["grad/norm"]


def test_save_final_loads_with_transformers(tmp_path):
    from actors.eval_worker import load_for_eval

    learner = Learner(tiny_cfg("lora"))
    learner.train_on(make_batch()).row()
    path = learner.save_final(str(tmp_path / "final"))
    model, tok = load_for_eval(path, torch.float32)
    batch = make_batch(2, seed=5)
    with torch.no_grad():
        for a, b in zip(full_logprobs(learner.model, batch), full_logprobs(model, batch)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert tok.decode(tok("Answer: 7")["input_ids"], skip_special_tokens=True) == "Answer: 7"


def test_forward_selected_trims_after_the_last_selected_token_without_changing_log_probs():
    learner = Learner(tiny_cfg("lora"))
    learner.train_on(make_batch(seed=0)).row()
    batch = make_batch(6, seed=9)
    T = max(len(c) for c in batch.completion_ids)
    # select only early tokens in some rows, so their tails are cut
    sel = torch.tensor([[j < min(len(c), 1 + i % 3) for j in range(T)]
                        for i, c in enumerate(batch.completion_ids)])         # (6, T)
    idx = list(range(6))
    with torch.no_grad():
        logp, _ = learner._forward_selected(learner.model, batch, idx, sel)   # (6, T)
        full = full_logprobs(learner.model, batch)
    for i, ref in enumerate(full):
        n = int(sel[i].sum())
        torch.testing.assert_close(logp[i, :n], ref[:n], atol=1e-5, rtol=1e-5)
        assert torch.all(logp[i, n:] == 0)


def _sgd_delta(learner, batch):
    """Run train_step with SGD lr=1 and no clipping: the parameter change is -grad."""
    learner.cfg.grpo.max_grad_norm = 0.0
    learner.opt = torch.optim.SGD(learner.params.values(), lr=1.0)
    before = {n: p.detach().clone() for n, p in learner.params.items()}
    metrics = learner.train_on(batch).row()
    return metrics, {n: before[n] - p.detach() for n, p in learner.params.items()}


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(mode):
    """Checkpointed layers under the packed shared-prefix forward: same loss and gradients."""
    batch = make_batch(8, seed=11)
    batch = replace(batch, prompt_ids=[batch.prompt_ids[i // 4] for i in range(8)])  # shared
    results = []
    for gc in (False, True):
        cfg = tiny_cfg(mode, entropy_rho=0.6)
        cfg.model.gradient_checkpointing = gc
        learner = Learner(cfg)
        if gc:
            layers = [m for m in learner.model.modules()
                      if getattr(m, "gradient_checkpointing", None) is not None]
            assert layers and all(m.gradient_checkpointing for m in layers)
        learner.train_on(make_batch(seed=0)).row()  # off the init (LoRA B = 0 there)
        results.append(_sgd_delta(learner, batch))
    (m0, d0), (m1, d1) = results
    assert m0["tokens/active_seqs"] > 0 and m0["loss/policy"] != 0
    assert m1["loss/policy"] == pytest.approx(m0["loss/policy"], rel=1e-5, abs=1e-7)
    assert sum(float(d.abs().sum()) for d in d0.values()) > 0
    for name in d0:
        torch.testing.assert_close(d1[name], d0[name], atol=1e-6, rtol=1e-4)


def test_gpu_8gb_learner_settings_run_one_step_on_cpu(tmp_path):
    """The gpu-8gb preset's learner (NF4 QLoRA, bf16 compute, checkpointing, micro-batch 4)
    with a tiny Qwen2 in place of the 1.5B model: one step, finite, adapters move."""
    from common.tiny_model import save_tiny_qwen2

    cfg = get_preset("gpu-8gb")
    cfg.model.name = str(save_tiny_qwen2(tmp_path / "qwen2"))
    assert cfg.lora.mode == "qlora" and cfg.model.gradient_checkpointing
    learner = Learner(cfg)
    before = {n: p.detach().clone() for n, p in learner.params.items()}
    batch = make_batch(8, seed=3)
    batch = replace(batch, prompt_ids=[batch.prompt_ids[i // 4] for i in range(8)])
    metrics = learner.train_on(batch).row()
    assert np.isfinite(metrics["loss/policy"]) and metrics["grad/norm"] > 0
    assert metrics["tokens/active_seqs"] > 0
    assert any(not torch.equal(before[n], p) for n, p in learner.params.items())


def test_fisher_does_not_depend_on_batch_size():
    """F is a mean over sequences: 32 sequences in one batch or in four of 8 give the same F,
    and 8 vs 32 sequences from one distribution agree within sampling noise (F of the batch's
    mean loss would shrink ~4x from 8 to 32)."""
    learner = Learner(tiny_cfg("lora"))
    learner.train_on(make_batch(seed=0)).row()
    big = make_batch(32, seed=5)
    parts = [TrainBatch(big.prompt_ids[i:i + 8], big.completion_ids[i:i + 8],
                        big.old_logp[i:i + 8], big.entropy[i:i + 8], big.advantages[i:i + 8])
             for i in range(0, 32, 8)]

    def fisher_sum(batches):
        learner.fisher = {}
        learner.cfg.ewc.fisher_batches = len(batches)
        learner.consolidate(batches)
        return {n: f.clone() for n, f in learner.fisher.items()}

    one, four = fisher_sum([big]), fisher_sum(parts)
    for n in one:
        torch.testing.assert_close(four[n], one[n], rtol=1e-4, atol=1e-10)
    total_32 = sum(float(f.sum()) for f in one.values())
    total_8 = sum(float(f.sum()) for f in fisher_sum([make_batch(8, seed=6)]).values())
    assert 0.5 < total_8 / total_32 < 2.0, (total_8, total_32)


def test_masked_sequences_get_no_gradient_and_do_not_count():
    """TrainBatch.keep (reward.overlong=mask): a dropped sequence is out of the loss and of
    the normaliser; the step equals the step on the kept sequences alone."""
    batch = make_batch(6, seed=8)
    keep = np.array([True, False, True, True, False, True])
    masked = TrainBatch(batch.prompt_ids, batch.completion_ids, batch.old_logp,
                        batch.entropy, batch.advantages, keep=keep)
    alone = TrainBatch(*[[x for x, k in zip(col, keep) if k] for col in
                         (batch.prompt_ids, batch.completion_ids, batch.old_logp,
                          batch.entropy)], batch.advantages[keep])
    results = []
    for b in (masked, alone):
        learner = Learner(tiny_cfg("full", entropy_rho=1.0))
        results.append(_sgd_delta(learner, b))
    (m0, d0), (m1, d1) = results
    assert m0["tokens/completion"] == m1["tokens/completion"]
    assert m0["loss/policy"] == pytest.approx(m1["loss/policy"], rel=1e-5)
    for name in d0:
        torch.testing.assert_close(d0[name], d1[name], atol=1e-7, rtol=1e-4)


def test_logp_diff_is_measured_when_no_sequence_trains():
    """All advantages 0: nothing trains, yet the learner still reports logp_diff (a probe)."""
    learner = Learner(tiny_cfg("lora"))
    batch = make_batch(4, seed=2)
    batch.advantages[:] = 0
    want = full_logprobs(learner.model, batch)
    batch = replace(batch, old_logp=[w.detach().numpy() + 0.5 for w in want])  # off by 0.5
    metrics = learner.train_on(batch).row()
    assert metrics["tokens/active_seqs"] == 0
    assert metrics["policy/logp_diff"] == pytest.approx(0.5, abs=1e-4)


@pytest.mark.parametrize("share", [True, False])
def test_the_learner_marks_its_updates_and_borrows_an_idle_workers_core(share, ray_cluster):
    """common/core_lease.py, in a Ray job: the learner's slot reads busy while an update runs
    and idle otherwise (a worker on its node borrows its core then); its updates run on the
    worker's core too while the worker says idle, not while it works. share off: no file."""
    import os
    import threading
    import time

    from common.core_lease import (
        BUSY,
        LEARNER,
        MIN_IDLE_S,
        Lease,
        flag_path,
        lease_key,
        remove_flag,
    )

    cfg = tiny_cfg()
    cfg.rollout.share_cores = share
    threads = torch.get_num_threads()
    # Any earlier Learner in this process (same Ray job) that was never closed left its file.
    remove_flag(lease_key())
    learner = Learner(cfg)
    path = flag_path(lease_key())
    assert os.path.exists(path) == share
    if not share:
        return
    worker = Lease(path, 1, 1, {LEARNER: 1}, set_threads=lambda n: None)  # worker 0's side
    try:
        assert worker.state(LEARNER)[0] != BUSY
        with worker.busy():
            learner.train_on(make_batch())
            assert torch.get_num_threads() == 1  # the worker works: its core is not free
        seen, done = [], threading.Event()

        def watch():  # what worker 0 reads while the update runs (in this, the actor's thread)
            while not done.is_set():
                seen.append(worker.state(LEARNER)[0])
                time.sleep(0.0005)

        time.sleep(MIN_IDLE_S * 1.5)  # the worker has waited long enough to lend its core
        watcher = threading.Thread(target=watch)
        watcher.start()
        learner.train_on(make_batch())
        done.set()
        watcher.join()
        assert BUSY in seen and worker.state(LEARNER)[0] != BUSY
        assert torch.get_num_threads() == 2  # the worker waited: its core trained too
        assert learner.version == 2
    finally:
        worker.close()
        learner.close()  # the end of a run (Trainer.shutdown): the learner removes the file
        torch.set_num_threads(threads)
    assert not os.path.exists(path)
    learner.close()  # twice: nothing left to do


# -- a non-finite update is skipped, and never reaches a checkpoint ---------------------------

@pytest.mark.parametrize("mode, bad", [("full", float("nan")), ("lora", float("inf")),
                                       ("lora", 1e30)])  # 1e30: a finite loss, an inf norm
def test_a_nonfinite_update_is_skipped_and_training_goes_on(mode, bad, caplog):
    """NaN or inf advantages give a non-finite loss, huge ones a non-finite gradient norm:
    the step changes nothing (weights, optimizer, version) and says so; the next one trains."""
    learner = Learner(tiny_cfg(mode))
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    batch = make_batch()
    batch.advantages[::2] = bad
    with caplog.at_level("WARNING", "homerl.learner"):
        row = learner.train_on(batch).row()
    assert row["learner/skipped_nonfinite"] == 1 and row["weights/version"] == 0
    assert learner.version == 0 and not learner.opt.state  # the optimizer never stepped
    assert all(p.grad is None for p in learner.params.values())
    assert all(torch.equal(before[n], p) for n, p in learner.model.named_parameters())
    said = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(said) == 1 and "not finite" in said[0]
    row = learner.train_on(make_batch(seed=1)).row()
    assert row["learner/skipped_nonfinite"] == 1 and row["weights/version"] == 1  # cumulative
    assert all(torch.isfinite(p).all() for p in learner.params.values())
    assert any(not torch.equal(before[n], p) for n, p in learner.model.named_parameters())


def rollout_of(batch: TrainBatch) -> RolloutBatch:
    """A worker's RolloutBatch holding `batch`'s sequences (what `train_step` receives)."""
    n = len(batch.completion_ids)
    return RolloutBatch(
        prompt_ids=batch.prompt_ids, completion_ids=batch.completion_ids,
        logprobs=batch.old_logp, entropy=batch.entropy, finish_reasons=["stop"] * n,
        texts=[""] * n, prompt_index=list(range(n)), correct=np.zeros(n, np.float32),
        format_score=np.zeros(n, np.float32), rewards=np.zeros(n, np.float32),
        reward_errors=[None] * n, version=0, num_prompts=n)


def test_a_skipped_batch_is_not_kept_for_the_fisher_or_the_checkpoint(tmp_path):
    """EWC's Fisher uses the batches the learner trained on: a skipped one is not among them,
    so its NaN advantages never reach a checkpoint (which keeps those batches)."""
    learner = Learner(tiny_cfg("lora"))
    good, bad = make_batch(seed=0), make_batch(seed=1)
    bad.advantages[0] = float("nan")
    for b in (good, bad):
        learner.train_step(TrainPlan(b.advantages, version=0), rollout_of(b))
    assert len(learner.recent) == 1 and np.isfinite(learner.recent[0].advantages).all()
    learner.save(str(tmp_path))
    restored = Learner(tiny_cfg("lora"))
    assert restored.load(str(tmp_path)) == 1 and len(restored.recent) == 1


def test_save_refuses_a_state_that_is_not_finite(tmp_path):
    """A NaN in the trainable tensors (or optimizer, Fisher, anchor) is never written: save is
    a one-line CheckpointError naming the tensor, and nothing is left in the directory."""
    learner = Learner(tiny_cfg("lora"))
    learner.train_on(make_batch()).row()
    name = sorted(learner.params)[0]
    with torch.no_grad():
        learner.params[name][0, 0] = float("nan")
    with pytest.raises(CheckpointError) as e:
        learner.save(str(tmp_path))
    assert f"param.{name}" in str(e.value) and "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("mode, want", [("lora", "hidden"), ("qlora", "imported")])
def test_only_a_qlora_learner_actor_imports_bitsandbytes(mode, want, ray_cluster):
    """learner.model.hide_bitsandbytes_in_this_actor: peft would import bitsandbytes (and it
    torch's inductor) at every learner start; a LoRA learner actor never does, and still
    trains; a QLoRA one does. A driver process hides nothing: it may build QLoRA later."""
    import ray

    from learner.model import hide_bitsandbytes_in_this_actor

    class ImportProbe(Learner):  # defined here: Ray ships it by value (tests/ is not a package)
        def bitsandbytes(self) -> str:
            import sys

            bnb = sys.modules.get("bitsandbytes", "absent")
            return "hidden" if bnb is None else ("absent" if bnb == "absent" else "imported")

    actor = ray.remote(ImportProbe).options(num_cpus=0).remote(tiny_cfg(mode))
    try:
        assert ray.get(actor.bitsandbytes.remote(), timeout=120) == want
        row = ray.get(actor.train_on.remote(make_batch()), timeout=120).row()
        assert np.isfinite(row["loss/policy"])
    finally:
        ray.kill(actor)
    assert hide_bitsandbytes_in_this_actor("lora") is False
