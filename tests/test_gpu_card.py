"""What `gpu-8gb` needs from a real card, checked on a CPU machine. The CUDA boundary is mocked
where a test needs a card (torch.cuda's answers, the compute capability, the driver's torch
probe, the free space of /dev/shm), and each such test says "mocked" in its name; everything
else runs as it would on the card: vLLM's own config classes judge the engine's settings."""

import dataclasses
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import launch.plan.__main__ as plan_cli
from common import device
from common.config import ConfigError, ModelConfig
from common.device import DeviceError, compute_dtype, cuda_dtype
from common.engine_budget import asleep_bytes, engine_batch, learner_cap_gb
from common.presets import get_preset
from common.shapes import KNOWN
from launch.plan import card as plan
from launch.plan.ram import budget, per_process, report

GiB = 2**30
S = KNOWN["deepseek-ai/deepseek-r1-distill-qwen-1.5b"]


def sliced(engine: str = "vllm"):
    """gpu-8gb in the time-sliced layout: a learner and an engine process take turns."""
    cfg = get_preset("gpu-8gb")
    cfg.rollout.engine = engine
    return cfg
ROOT = Path(__file__).resolve().parents[1]


# ---- vLLM on a shared card: the plan's KV budget and batch limits -----------------------------
def _cuda_kwargs(cfg, card_gb: float):
    from actors.vllm_engine import engine_kwargs
    from actors.vllm_setup import cuda_limits

    limits = cuda_limits(cfg, S, 1024, card_gb)
    return engine_kwargs("m", dtype="bfloat16", seed=0, eager=False, max_model_len=1024,
                         lora_rank=16, cuda=limits)


def test_cuda_engine_gets_the_plans_kv_budget_batch_limits_and_sleep_mode():
    pytest.importorskip("vllm")
    from vllm.config import CacheConfig, SchedulerConfig
    from vllm.engine.arg_utils import EngineArgs

    cfg = sliced()  # G=8 x 2 prompts, 512 + 512 tokens
    cfg.rollout.engine_memory_gb = round(plan.engine_bytes(cfg, S) / GiB, 2)  # as the driver
    kw = _cuda_kwargs(cfg, card_gb=8.0)
    kv_row = next(v for _, name, v in plan.budget(cfg, S) if name.startswith("KV cache"))
    assert kw["kv_cache_memory_bytes"] == kv_row == 16 * 1024 * 2 * 28 * 2 * 128 * 2
    assert kw["enable_sleep_mode"] and kw["max_num_seqs"] == 16  # one call's completions
    assert kw["max_num_batched_tokens"] >= kw["max_model_len"] == 1024
    assert "block_size" not in kw and "enable_chunked_prefill" not in kw  # no CPU layout
    # vLLM asks that share x the card be free at its start: the engine beyond its context
    assert kw["gpu_memory_utilization"] == pytest.approx(
        plan.engine_utilization(cfg, 8.0, S), abs=0.01)
    assert _cuda_kwargs(cfg, card_gb=80.0)["gpu_memory_utilization"] == pytest.approx(
        kw["gpu_memory_utilization"] / 10, abs=0.002)  # the same GiB on a bigger card
    # vLLM's own checks accept them
    assert set(kw) <= {f.name for f in dataclasses.fields(EngineArgs)}
    SchedulerConfig(max_model_len=1024, is_encoder_decoder=False,
                    max_num_batched_tokens=kw["max_num_batched_tokens"],
                    max_num_seqs=kw["max_num_seqs"])
    CacheConfig(gpu_memory_utilization=kw["gpu_memory_utilization"],
                kv_cache_memory_bytes=kw["kv_cache_memory_bytes"])


def test_cpu_engine_keeps_its_layout_and_never_mixes_it_with_cuda_limits():
    from actors.vllm_engine import cpu_layout, engine_kwargs
    from actors.vllm_setup import cuda_limits

    kw = engine_kwargs("m", dtype="float32", seed=0, eager=True, max_model_len=1024,
                       kv_cache_bytes=123, cpu=True)
    assert {k: kw[k] for k in cpu_layout(1024)} == cpu_layout(1024)
    assert kw["max_num_batched_tokens"] == 4096 and kw["kv_cache_memory_bytes"] == 123
    assert "max_num_seqs" not in kw and "enable_sleep_mode" not in kw
    with pytest.raises(ValueError, match="CPU layout"):
        engine_kwargs("m", dtype="float32", seed=0, eager=True, max_model_len=1024, cpu=True,
                      cuda=cuda_limits(sliced(), S, 1024, 8.0))


def test_batch_limits_follow_group_prompts_workers_and_steps_per_call():
    r = sliced().rollout
    b = engine_batch(r)
    assert (b.seqs, b.prompts, b.max_model_len) == (16, 2, 1024)
    assert b.batched_tokens == 2 * 512 + 16  # both prompts prefilled in one step + decodes
    r.prompts_per_step, r.num_workers, r.max_staleness, r.steps_per_call = 6, 2, 1, 2
    b = engine_batch(r)
    assert b.seqs == 3 * 8 * 2 and b.prompts == 6
    assert engine_batch(r, max_model_len=600).max_model_len == 600  # the model's own limit
    r.max_prompt_tokens, r.max_new_tokens, r.prompts_per_step = 64, 1000, 1
    assert engine_batch(r).batched_tokens == 1064  # never below max_model_len


# ---- the plan: three phases, the sleeping engine, caps that sum to the budget -----------------
def test_plan_counts_the_sleeping_engines_context_and_graphs_and_caps_sum_to_the_budget():
    cfg = sliced()
    rows = plan.budget(cfg, S)
    pp = plan.by_process(rows)
    assert set(pp) == {"start", "rollout", "learn"}
    assert pp["learn"]["engine"] == asleep_bytes("vllm") == 0.75 * GiB  # context + graphs
    assert pp["start"]["engine"] == 0.5 * GiB  # vLLM measures after its context exists
    cap = plan.caps(rows, 8.0)
    assert cap["learner"] / GiB == pytest.approx(learner_cap_gb(8.0, "vllm"))  # what it applies
    for ph in ("rollout", "learn"):  # each phase: one side at its cap, the other as planned
        assert cap["learner"] + pp["learn"]["engine"] == pytest.approx(8 * GiB)
        assert pp[ph]["learner"] <= cap["learner"] and pp[ph]["engine"] <= cap["engine"]
    assert cap["engine"] + pp["rollout"]["learner"] == pytest.approx(8 * GiB)
    hf = sliced("hf")  # no CUDA graphs to keep
    assert plan.by_process(plan.budget(hf, S))["learn"]["engine"] == asleep_bytes("hf")


def test_plan_cli_shows_three_phases_and_the_dtype_and_refuses_6gb_with_a_fix(capsys,
                                                                               monkeypatch):
    monkeypatch.setattr(plan, "model_shapes", lambda name: S)
    sliced_args = ["--preset", "gpu-8gb", "--engine", "vllm", "--ram-gb", "16"]
    assert plan_cli.main([*sliced_args, "--gpu-memory-gb", "8"]) == 0
    out = capsys.readouterr().out
    for phase in ("start (learner loaded", "rollout (learner idle", "learn (learner steps"):
        assert phase in out
    assert "dtype bf16 (auto:" in out and "caps: learner 7.25 GiB" in out
    assert "max_num_seqs 16" in out and "fits" in out
    assert plan_cli.main([*sliced_args, "--gpu-memory-gb", "6"]) == 1
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "does not fit 6 GiB" in line and "would fit with --rollout.engine learner" in line
    assert plan_cli.main(["--preset", "gpu-8gb", "--capability", "7.5", "--ram-gb", "16"]) == 0
    assert "dtype fp16 (auto: compute capability 7.5 < 8.0" in capsys.readouterr().out


# ---- dtype by compute capability ---------------------------------------------------------------
@pytest.fixture
def mocked_card(monkeypatch):
    """torch.cuda answering as a card of the capability the test sets."""
    card = SimpleNamespace(capability=(7, 5))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: card.capability)
    return card


def test_auto_dtype_is_fp16_below_capability_8_and_bf16_from_it_mocked_capability(mocked_card):
    from actors.hf_worker import worker_dtype
    from actors.vllm_setup import vllm_dtype
    from learner.model import pick_dtype

    assert compute_dtype("auto", "cuda") == "fp16"
    assert (vllm_dtype("auto"), pick_dtype("auto"), worker_dtype("auto", "cuda")) == (
        "float16", torch.float16, torch.float16)
    with pytest.raises(DeviceError, match="has no bf16; use --model.dtype fp16"):
        compute_dtype("bf16", "cuda")
    mocked_card.capability = (8, 6)
    assert compute_dtype("auto", "cuda") == "bf16" and vllm_dtype("auto") == "bfloat16"
    assert compute_dtype("fp16", "cuda") == "fp16"  # asked for: kept
    assert cuda_dtype("auto", (7, 5)) == ("fp16", "auto: compute capability 7.5 < 8.0 has no "
                                                  "bf16")
    assert ModelConfig(dtype="fp16").dtype == "fp16"
    with pytest.raises(ConfigError, match="fp16"):
        ModelConfig(dtype="float8")


def test_an_fp16_base_keeps_fp32_lora_weights(tiny_llama):
    from common.config import LoraConfig
    from learner.model import build_policy

    model, names = build_policy(ModelConfig(name=tiny_llama, dtype="fp16"),
                                LoraConfig(mode="lora", r=4, alpha=8))
    params = dict(model.named_parameters())
    assert names and all(params[n].dtype == torch.float32 for n in names)
    frozen = [p.dtype for n, p in params.items() if n not in names]
    assert torch.float16 in frozen


def test_the_plan_refuses_bf16_on_a_card_without_it_in_one_line():
    cfg = get_preset("gpu-8gb")
    cfg.model.dtype = "bf16"
    with pytest.raises(ConfigError, match="compute capability 7.5.*fp16"):
        plan.check(cfg, 8.0, capability=(7, 5))


# ---- the driver's GPU count: torch in a subprocess, WSL2 included -------------------------------
@pytest.fixture
def probe(monkeypatch):
    """The driver's torch probe answering as the test says; no /dev/nvidiaN nodes."""
    answer = {"out": None, "calls": 0}

    def run(cmd, **kw):
        answer["calls"] += 1
        out = answer["out"]
        return subprocess.CompletedProcess(cmd, 0 if out else 1, json.dumps(out or {}), "")

    real_exists = device.os.path.exists
    monkeypatch.setattr(device.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(device.os.path, "exists",
                        lambda p: answer.get("dxg", False) if p == "/dev/dxg" else real_exists(p))
    monkeypatch.setattr(device.subprocess, "run", run)
    device.probe_cuda.cache_clear()
    yield answer
    device.probe_cuda.cache_clear()


def test_wsl2_gpu_is_counted_by_a_mocked_torch_probe(probe):
    assert device.machine_gpus() == 0 and probe["calls"] == 0  # no driver nodes: no subprocess
    probe["dxg"] = True
    probe["out"] = {"count": 1, "name": "RTX 2070", "capability": [7, 5], "total_gb": 7.8}
    assert device.machine_gpus() == 1
    card = device.driver_card()
    assert card.capability == (7, 5) and card.total_gb == 7.8 and probe["calls"] == 1  # cached
    device.probe_cuda.cache_clear()
    probe["out"] = None  # the probe failed (no torch, an error): no nodes to count either
    assert device.machine_gpus() == 0


def test_the_probe_itself_runs_torch_in_a_subprocess():
    device.probe_cuda.cache_clear()
    try:
        card = device.probe_cuda()
    finally:
        device.probe_cuda.cache_clear()
    assert card is not None and card.count == torch.cuda.device_count()


# ---- adapter files: /dev/shm when it has room ---------------------------------------------------
MB = 2**20


def _update(mb: int):
    """A LoRA update of `mb` MB in fp32, without allocating it (broadcast views)."""
    n = mb * MB // 4 // 2
    return SimpleNamespace(tensors={"m.lora_A": np.broadcast_to(np.float32(0), (n,)),
                                    "m.lora_B": np.broadcast_to(np.float32(0), (n,))})


@pytest.fixture
def files(tmp_path):
    """AdapterFiles over a small 'shm' and a 'disk' directory with mocked free space."""
    from actors.adapter_files import AdapterFiles

    shm, disk = tmp_path / "shm", tmp_path / "disk"
    shm.mkdir()
    disk.mkdir()
    free = {str(shm): 64 * MB, str(disk): 10_000 * MB}
    events = []
    store = AdapterFiles("rollout-0", [str(shm), str(disk)], free=lambda p: free[p])

    def write(u):
        def w(path):
            Path(path).mkdir(parents=True)
            events.append(("write", path))
            return path
        return store.write(u, w, lambda: events.append(("drop", store.current)))

    return SimpleNamespace(store=store, free=free, events=events, write=write, shm=str(shm),
                           disk=str(disk))


def test_adapters_go_to_dev_shm_only_with_room_mocked_free_space(files):
    from actors.adapter_files import AdapterRoomError

    first = files.write(_update(74))  # Docker's 64 MB /dev/shm: on disk instead
    assert first.startswith(files.disk)
    files.free[files.shm] = 400 * MB
    second = files.write(_update(74))  # room for it: /dev/shm, written before the old is dropped
    assert second.startswith(files.shm) and not Path(first).exists()
    assert files.events[-2:] == [("write", second), ("drop", first)]
    files.free[files.shm] = 20 * MB  # room for one only, where the held one is: drop first
    third = files.write(_update(74))
    assert third.startswith(files.shm) and not Path(second).exists()
    assert files.events[-3:-1] == [("drop", second), ("write", third)]
    files.free[files.shm] = files.free[files.disk] = 10 * MB
    with pytest.raises(AdapterRoomError) as err:
        files.write(_update(200))
    msg = str(err.value)
    assert "\n" not in msg and "--shm-size" in msg and "HOMERL_ADAPTER_DIR" in msg
    files.store.close()
    assert not Path(files.shm, third).exists()


# ---- host RAM of the GPU preset -----------------------------------------------------------------
def test_gpu_preset_host_plan_fits_a_16gb_box():
    """One-copy: the driver and the learner's process, nothing kept for an engine. The
    time-sliced layout adds the engine's weights in host memory while it sleeps."""
    cfg = get_preset("gpu-8gb")
    rows = budget(cfg, S, gpu=True)
    assert set(per_process(rows)) == {"driver", "learner"}
    text, fits, total = report(cfg, 12.0, S, gpu=True)
    assert fits and total < 3.0, text
    rows = budget(sliced(), S, gpu=True)
    names = {name for _, name, _ in rows}
    assert "engine weights in host memory while asleep (pinned)" in names
    assert set(per_process(rows)) == {"driver", "learner", "rollout-0"}
    # a quarter of a 16 GB box left to the system; no fp32 copy of the base is kept
    text, fits, total = report(sliced(), 12.0, S, gpu=True)
    assert fits and total < 9.0, text
    assert max(v for _, _, v in rows) < 4 * GiB


def test_nf4_base_in_its_own_dtype_is_the_fp32_one_exactly(tiny_llama):
    pytest.importorskip("bitsandbytes")
    from common.quant import dequantized_nf4_weights

    wide = dequantized_nf4_weights(tiny_llama)
    narrow = dequantized_nf4_weights(tiny_llama, as_float=False)
    assert wide.keys() == narrow.keys()
    for k, w in wide.items():
        assert w.dtype == torch.float32 and torch.equal(narrow[k].float(), w)
    assert sum(t.element_size() for t in narrow.values()) <= sum(
        t.element_size() for t in wide.values())


# ---- the vLLM version ---------------------------------------------------------------------------
def test_other_vllm_versions_are_refused_in_one_line_mocked_version(monkeypatch):
    vllm = pytest.importorskip("vllm")
    from actors.vllm_engine import SUPPORTED, VLLMEngine, VLLMVersionError, check_version
    from launch.driver import roles

    check_version("0.32.0")
    check_version("0.32.3+cu128")
    with pytest.raises(VLLMVersionError, match=r"vLLM 0.33.0 is installed.*0.32.x only"):
        check_version("0.33.0")
    monkeypatch.setattr(vllm, "__version__", "0.31.2")
    with pytest.raises(VLLMVersionError) as err:
        VLLMEngine("m", dtype="float32", seed=0, eager=True, max_model_len=64)
    assert "\n" not in str(err.value)
    cfg = get_preset("cpu-demo")  # engine vllm
    monkeypatch.setattr(roles, "installed_vllm", lambda: "0.33.1")
    with pytest.raises(ConfigError, match="rollout.engine=vllm: vLLM 0.33.1"):
        roles.rollout_worker_class(cfg)
    gpu = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["gpu"]
    assert gpu == [f"vllm=={SUPPORTED}.*"]


def _nf4_cfg(path: str):
    cfg = get_preset("tiny")
    cfg.model.name, cfg.lora.mode = path, "qlora"
    return cfg


def test_a_qlora_worker_serves_the_learners_nf4_bytes_not_its_own_quantisation(tiny_llama):
    """The learner's NF4 bytes are the one source of truth: bytes the worker's own
    quantisation would not produce (one layer's packed weights altered) reach its model."""
    pytest.importorskip("bitsandbytes")
    from actors.hf_worker import HFRolloutWorker
    from common.quant import dequantize_state
    from learner.learner import Learner

    cfg = _nf4_cfg(tiny_llama)
    state = Learner(cfg).nf4_state()
    key = "model.layers.0.self_attn.q_proj.weight"
    assert key in state and state[key]["data"].dtype == torch.uint8
    state[key]["data"] = state[key]["data"] ^ 0x11  # other 4-bit codes in every byte
    want = dequantize_state({key: state[key]})[key]
    worker = HFRolloutWorker(cfg, name="nf4", nf4=state)
    own = HFRolloutWorker(cfg, name="own")
    got = dict(worker.model.named_parameters())[key]
    assert torch.equal(got, want.to(got.dtype))
    assert not torch.equal(dict(own.model.named_parameters())[key], got)


def test_a_runs_qlora_workers_get_the_learners_nf4_bytes_through_ray(ray_cluster, tiny_llama):
    """start_roles hands the learner's NF4 bytes to the pool, which gives them to every
    worker it spawns (replacements included): a worker's base equals the learner's bytes."""
    pytest.importorskip("bitsandbytes")
    import ray

    from common.device import plan_devices
    from common.quant import dequantize_state
    from launch.driver.placement import make_placement
    from launch.driver.roles import start_roles

    cfg = _nf4_cfg(tiny_llama)
    devices = plan_devices("cpu", 0, 1)
    layout = make_placement(cfg, devices)
    learner, pool = start_roles(cfg, devices, layout, "nf4test")
    try:
        assert pool.nf4 is not None
        want = dequantize_state(ray.get(pool.nf4))
        got = ray.get(pool.workers[0].__ray_call__.remote(
            lambda w: {k: p.detach().clone() for k, p in w._impl.model.named_parameters()
                       if k in want}))
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k].to(got[k].dtype)) for k in want)
    finally:
        pool.shutdown()
        ray.kill(learner)
        layout.remove()


def test_nf4_check_compares_bytes_and_dequantisation_on_the_cpu(tmp_path):
    """tools.card_check.nf4's code path with both sides on the CPU (the card's run is in
    docs/gpu.md): every NF4 layer counted, the same bytes, no difference after dequantisation."""
    out = tmp_path / "nf4.json"
    run = subprocess.run([sys.executable, "-m", "tools.card_check.nf4", "--cpu", "--json",
                          str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["layers"] == 14 == res["layers_same_bytes_cpu_vs_device"]  # 2 layers x 7 linears
    assert res["max_abs_diff_cpu_dequant_vs_device_dequant"] == 0
