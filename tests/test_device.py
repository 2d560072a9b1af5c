"""One GPU card on CPU machines: the device resolver, the Ray GPU requests, the time-slicing of
the card, and the planner's refusal. The GPU itself is the boundary: a local Ray cluster that
*declares* one GPU stands in for it (Ray hands out the resource; torch sees no CUDA, so the
models stay on the CPU and sleep/wake move nothing), and tests that rely on it say so."""

import subprocess
import sys
import time

import pytest
import ray

from common.device import DeviceError, cpu_info, plan_devices
from common.presets import get_preset
from common.shapes import KNOWN, build_random_model
from launch.plan import card as plan


def test_resolver_picks_devices_and_gpu_shares():
    assert plan_devices("cpu", 1).device == "cpu"
    cpu = plan_devices("auto", 0)
    assert (cpu.device, cpu.learner_gpus, cpu.worker_gpus, cpu.shared_card) == ("cpu", 0, 0,
                                                                                 False)
    gpu = plan_devices("auto", 1)
    assert (gpu.device, gpu.learner_gpus, gpu.worker_gpus) == ("cuda", 0.5, 0.5)
    assert gpu.shared_card and gpu.learner_gpus + gpu.worker_gpus <= 1  # one card
    with pytest.raises(DeviceError, match="no CUDA GPU"):
        plan_devices("cuda", 0)
    with pytest.raises(DeviceError, match="rollout.num_workers=2"):
        plan_devices("cuda", 1, num_workers=2)
    with pytest.raises(DeviceError, match="model.device"):
        plan_devices("tpu", 1)


def test_gpu_preset_without_a_gpu_is_one_line_in_seconds():
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--preset", "gpu-8gb",
                           "--gpu-memory-gb", "4"], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2 and time.monotonic() - t0 < 60
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and "Traceback" not in proc.stderr


GIB = 2**30
S = KNOWN["deepseek-ai/deepseek-r1-distill-qwen-1.5b"]


def test_time_sliced_planner_parts_against_hand_computed_sizes():
    cfg = get_preset("gpu-8gb")  # G=8 x 2 prompts, 512 + 512 tokens, micro-batch 4, r=16
    cfg.rollout.engine = "vllm"  # the two-process layout: a learner and a vLLM engine
    parts = {name: v for _, name, v in plan.budget(cfg, S)}
    kv = 16 * 1024 * 2 * 28 * 2 * 128 * 2  # seqs x tokens x (k, v) x layers x kv heads x dim x bf16
    assert parts["KV cache (16 seqs x 1024 tokens)"] == kv
    # LoRA on all 7 linears: r x (in + out) per layer, 16 B each (fp32 param, grad, 2 moments)
    per_layer = 16 * ((1536 + 1536) + 2 * (1536 + 256) + (1536 + 1536)
                      + 2 * (1536 + 8960) + (8960 + 1536))
    assert parts["LoRA r=16: 18.5M params + grads + AdamW (fp32)"] == 28 * per_layer * 16
    assert parts["LM head in fp32, one slice (16384 x 1536)"] == 16384 * 1536 * 4
    assert parts["vllm weights (dequantised NF4 base, bf16)"] == S.params * 2
    by = plan.by_process(plan.budget(cfg, S))
    resident = sum(v for p, _, v in plan.budget(cfg, S) if p == "learner")
    engine = sum(v for p, _, v in plan.budget(cfg, S) if p in (plan.KEPT, plan.AWAKE))
    slack = plan.ALLOCATOR_SLACK  # on each process's tensors, not on its CUDA context
    assert by["rollout"]["learner"] == pytest.approx(resident + slack * (resident - 0.5 * GIB))
    assert by["rollout"]["engine"] == pytest.approx(engine + slack * (engine - 0.5 * GIB))


def test_time_sliced_planner_fits_8_and_refuses_4_naming_the_largest_consumer():
    cfg = get_preset("gpu-8gb")
    cfg.rollout.engine = "vllm"
    text, fits, peak = plan.report(cfg, 8.0, S)
    assert fits and peak < 8 and "fits" in text
    text, fits, _ = plan.report(cfg, 4.0, S)
    assert not fits and "does not fit 4 GiB" in text
    line = plan.refusal(cfg, 4.0, S)
    assert "\n" not in line and "largest engine vllm weights" in line
    cfg.model.gradient_checkpointing = False  # a fixable overrun: the fix is named
    _, fits, peak = plan.report(cfg, 8.0, S)
    assert not fits
    line = plan.refusal(cfg, 8.0, S)
    assert "would fit with --model.gradient_checkpointing true" in line, line


def test_real_shaped_random_model_has_the_exact_shapes():
    import torch

    with torch.device("meta"):
        model = build_random_model(KNOWN["qwen/qwen2.5-1.5b-instruct"], device="meta")
    assert sum(p.numel() for p in model.parameters()) == 1_543_714_304
    assert model.config.tie_word_embeddings and model.config.num_hidden_layers == 28


@pytest.fixture
def ray_with_a_declared_gpu(own_ray):
    ray.init(address="local", num_cpus=3, num_gpus=1, include_dashboard=False)
    yield


def test_shared_card_requests_and_time_slicing_gpu_mocked_by_a_declared_ray_gpu(
        ray_with_a_declared_gpu, tmp_path):
    """With a GPU in the cluster the learner and the rollout worker each ask Ray for half of
    it, the worker starts only once the learner holds its model (vLLM measures the card's free
    memory as it starts), and the engine sleeps through every learner step and wakes before
    the next push."""
    from launch.driver.trainer import Trainer

    cfg = get_preset("tiny")
    cfg.model.device, cfg.model.gpu_memory_gb = "cuda", 8.0
    cfg.rollout.max_staleness, cfg.run.steps = 0, 3
    trainer = Trainer(cfg, str(tmp_path))
    try:
        assert trainer.devices.shared_card and cfg.rollout.engine_memory_gb > 0
        trainer.run()
        log = list(trainer.card_log)
        learner = ray.get(trainer.learner.placement.remote())
        ready = ray.get(trainer.learner.ready.remote())
        (worker,) = ray.get([w.ping.remote() for w in trainer.pool.workers])
    finally:
        trainer.shutdown()
    assert ready["allocated_bytes"] == 0 and ready["device"] == "cpu"  # no CUDA in torch here
    assert 0 < ready["built_at"] < worker["started_at"]  # learner holds its model, then engine
    assert learner["resources"].get("GPU") == worker["resources"].get("GPU") == 0.5
    assert learner["device"] == "cpu"  # torch sees no CUDA here: the models stayed on the CPU
    assert log == [("sleep", 0), ("wake", 1), ("sleep", 1), ("wake", 2), ("sleep", 2),
                   ("wake", 3)]


def test_shared_card_refuses_staleness_gpu_mocked_by_a_declared_ray_gpu(
        ray_with_a_declared_gpu, tmp_path):
    from common.config import ConfigError
    from launch.driver.trainer import Trainer

    cfg = get_preset("tiny")
    cfg.model.device, cfg.model.gpu_memory_gb = "cuda", 8.0
    with pytest.raises(ConfigError, match="rollout.max_staleness: must be 0"):
        Trainer(cfg, str(tmp_path))


def test_ping_of_a_worker_built_in_the_driver_beside_a_running_cluster(ray_cluster):
    """Ray refuses `get_assigned_resources` outside an actor; a worker built in this process
    while the shared cluster is up (the vLLM worker tests do this) must still answer ping."""
    import ray

    from actors.base import RolloutWorker

    got = RolloutWorker().ping()
    assert got["resources"] == {}
    assert got["node_id"] == ray.get_runtime_context().get_node_id()


def test_auto_is_fp32_on_any_cpu_and_the_14_core_split_plans_under_8_gib_amx_simulated(
        monkeypatch):
    """An AMX host (simulated: `cpu_info` reports amx_bf16) runs `auto` in fp32 as every CPU
    does: bf16 rollouts and learner disagree past the on-policy limit there. So the 14-core
    split plans as on a CPU without AMX (one shared fp32 conversion), under 8 GiB; bf16 asked
    for by name is kept, and plans more."""
    import common.device as D
    from launch.plan.ram import GiB, budget, run_dtype
    from launch.plan.sizing import split

    monkeypatch.setattr(D, "cpu_info", lambda: ("Intel Xeon (simulated AMX)", True))
    assert D.compute_dtype("auto", "cpu") == "fp32" and D.compute_dtype("bf16", "cpu") == "bf16"
    assert D.cpu_line().endswith("AMX yes")
    cfg, _ = split(get_preset("cpu-14core"), 14, 16.0)
    assert run_dtype(cfg) == "fp32"
    shape = KNOWN["qwen/qwen2-0.5b-instruct"]
    auto = sum(v for _, _, v in budget(cfg, shape)) / GiB
    cfg.model.dtype = "bf16"
    bf16 = sum(v for _, _, v in budget(cfg, shape)) / GiB
    assert auto < 8.0 < bf16


def test_cpu_line_names_the_cpu_and_amx():
    name, amx = cpu_info()
    with open("/proc/cpuinfo") as f:
        assert ("amx_bf16" in f.read()) == amx
    assert name != "unknown CPU"
