"""common.shared_weights: one fp32 conversion of a bf16 checkpoint per machine, mapped by every
process. The pages are counted once across processes, the cache entry is built once (and again
after a killed build), the values are exactly bf16 -> fp32, the HF workers stay on-policy on it
(LoRA unmerged), and the RAM plan counts the base once."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from test_onpolicy import PROMPTS, learner_logprobs, make_cfg, random_batch

from common.models import load_model
from common.presets import get_preset
from common.shapes import KNOWN
from common.shared_weights import _entry_name, shared_checkpoint
from common.tiny_model import build_tiny_qwen2
from launch.plan.ram import PROMPT_TOKENS, GiB, _adapted_linear_params, _lora_params, budget

ROOT = Path(__file__).resolve().parents[1]

HOLD = """
import sys, torch
from common.models import load_model
model = load_model(sys.argv[1], "float32")
total = sum(float(p.detach().sum()) for p in model.parameters())  # every page read: resident
ptr = model.model.embed_tokens.weight.data_ptr()
where = [(ln.split()[5:] or ["-"])[0] for ln in open("/proc/self/maps")
         if int(ln.split("-")[0], 16) <= ptr < int(ln.split()[0].split("-")[1], 16)]
print("ready", where[0], flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A model cache of the test's own (child processes inherit it)."""
    monkeypatch.setenv("HOMERL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HOMERL_SHARE_WEIGHTS", raising=False)
    return tmp_path / "cache" / "models"


def save_half(path: Path, dtype=torch.bfloat16, init_std: float = 0.02) -> Path:
    model, tokenizer = build_tiny_qwen2(seed=3, init_std=init_std)
    model.to(dtype).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def mapping_memory(pid: int, path: str) -> tuple[int, int]:
    """(Rss, Pss) in kB of `pid`'s mappings of the file `path`."""
    rss = pss = 0
    inside = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            key = line.split(maxsplit=1)[0]
            if "-" in key and not key.endswith(":"):
                inside = line.rstrip().endswith(path)
            elif inside and key in ("Rss:", "Pss:"):
                kb = int(line.split()[1])
                rss, pss = (rss + kb, pss) if key == "Rss:" else (rss, pss + kb)
    return rss, pss


def test_two_processes_map_one_conversion_and_pss_counts_it_once(cache, tmp_path):
    src = save_half(tmp_path / "bf16")
    converted = Path(shared_checkpoint(str(src), torch.float32)) / "model.safetensors"
    procs = [subprocess.Popen([sys.executable, "-c", HOLD, str(src)], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(2)]
    try:
        where = [p.stdout.readline().split() for p in procs]
        assert all(w == ["ready", str(converted)] for w in where), where  # views of the file
        for p in procs:
            rss, pss = mapping_memory(p.pid, str(converted))
            assert rss >= 0.9 * converted.stat().st_size / 1024  # the whole model resident
            assert abs(pss - rss / 2) <= 0.05 * rss, (rss, pss)  # split between the two
    finally:
        for p in procs:
            p.communicate("\n", timeout=60)


def test_private_layout_holds_weights_outside_any_file(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("HOMERL_SHARE_WEIGHTS", "0")
    src = save_half(tmp_path / "bf16")
    assert shared_checkpoint(str(src), torch.float32) == str(src)
    r = subprocess.run([sys.executable, "-c", HOLD, str(src)], cwd=ROOT, input="\n",
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.split()[:2] == ["ready", "-"], r.stdout + r.stderr  # anonymous memory
    assert not cache.exists() or not any(cache.iterdir())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_converted_tensors_are_the_half_ones_cast_to_fp32(cache, tmp_path, dtype):
    src = save_half(tmp_path / "half", dtype)
    entry = Path(shared_checkpoint(str(src), torch.float32))
    assert entry.parent == cache and entry != src
    assert json.loads((entry / "config.json").read_text())["dtype"] == "float32"
    assert (entry / "tokenizer.json").exists() and (entry / "generation_config.json").exists()
    with safe_open(str(src / "model.safetensors"), "pt") as a, \
            safe_open(str(entry / "model.safetensors"), "pt") as b:
        assert set(a.keys()) == set(b.keys())
        for k in a.keys():
            want, got = a.get_tensor(k), b.get_tensor(k)
            assert want.dtype == dtype and got.dtype == torch.float32
            assert torch.equal(got, want.float()), k
    model = load_model(str(src), "float32")
    assert model.name_or_path == str(src)  # adapters saved from it name the real base
    # fp32 already, or not fp32 wanted: nothing to convert
    assert shared_checkpoint(str(entry), torch.float32) == str(entry)
    assert shared_checkpoint(str(src), torch.bfloat16) == str(src)


def test_the_build_is_idempotent(cache, tmp_path):
    src = save_half(tmp_path / "bf16")
    first = Path(shared_checkpoint(str(src), torch.float32))
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    marker = (first / ".homerl-complete").read_text()
    assert shared_checkpoint(str(src), torch.float32) == str(first)
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert (first / ".homerl-complete").read_text() == marker
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == [first.name]


def test_a_deleted_or_resaved_checkpoints_conversion_goes_at_the_next_resolve(
        cache, tmp_path):
    """The cache keeps one conversion per live source: a checkpoint deleted, or re-saved (new
    mtimes: a new conversion), leaves no fp32 copy behind once any model is resolved for fp32
    (an fp32 one too); another live source's conversion, an entry whose marker names no source
    and one another machine built (a cache shared over NFS) stay."""
    keep, gone, edited, remote = (save_half(tmp_path / n)
                                  for n in ("keep", "gone", "edited", "remote"))
    names = {n: Path(shared_checkpoint(str(p), torch.float32)).name
             for n, p in (("keep", keep), ("gone", gone), ("edited", edited), ("remote", remote))}
    legacy = cache / "legacy-entry"  # made before markers named their source
    legacy.mkdir()
    (legacy / ".homerl-complete").write_text(json.dumps({"format": 1, "name": legacy.name}))
    marker = json.loads((cache / names["gone"] / ".homerl-complete").read_text())
    assert marker["source"] == str(gone.resolve()) and marker["dtype"] == "float32"
    assert marker["host"] == socket.gethostname()
    # built by another machine sharing this cache (NFS), from a source on that machine's disk
    remote_marker = cache / names["remote"] / ".homerl-complete"
    remote_marker.write_text(json.dumps({**json.loads(remote_marker.read_text()),
                                         "host": "another-node"}))
    shutil.rmtree(remote)

    def left():
        return sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))

    shutil.rmtree(gone)
    fp32 = cache / names["keep"]  # an fp32 checkpoint: nothing to convert, still a resolve
    assert shared_checkpoint(str(fp32), torch.float32) == str(fp32)
    assert left() == sorted([names["keep"], names["edited"], names["remote"], "legacy-entry"])
    time.sleep(0.01)  # a later mtime for the re-saved shard
    save_half(edited, init_std=0.05)
    new = Path(shared_checkpoint(str(edited), torch.float32)).name
    assert new != names["edited"]
    assert left() == sorted([names["keep"], new, names["remote"], "legacy-entry"])
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name]  # nothing half-deleted


def test_a_disk_that_refuses_a_cache_entry_is_one_line_and_leaves_no_half_entry(cache):
    """A full (or read-only, or foreign) disk under the cache is a CacheWriteError naming the
    folder and the ways out; any other OSError of a build (its source unreadable) stays itself."""
    import errno

    from common.model_cache import CacheWriteError, materialize

    def full(out):
        (out / "part").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CacheWriteError) as e:
        materialize("entry", full, hint=lambda: ", or see the docs")
    assert str(e.value) == (f"the model cache {cache} could not take entry (No space left on "
                            "device); free space there, or set HOMERL_CACHE to a folder on a "
                            "disk with room, or see the docs")
    assert [p.name for p in cache.iterdir()] == [".entry.lock"]  # no half-written entry

    def gone(out):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/gone/model")

    with pytest.raises(FileNotFoundError):
        materialize("other", gone)


KILLED_BUILD = """
import sys, time, torch
from pathlib import Path
from common.model_cache import materialize
from common.shared_weights import _entry_name

def build(out):
    (out / "model.safetensors").write_bytes(b"half a file")
    print("building", flush=True)
    time.sleep(600)

materialize(_entry_name(Path(sys.argv[1]), torch.float32), build)
"""


def test_a_killed_build_is_redone(cache, tmp_path):
    src = save_half(tmp_path / "bf16")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(src)], cwd=ROOT,
                            text=True, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "building"
    os.kill(proc.pid, signal.SIGKILL)  # dies holding the lock, its temp folder left behind
    proc.wait(timeout=30)
    name = _entry_name(src, torch.float32)
    assert list(cache.glob(f".{name}.tmp-*")) and not (cache / name).exists()
    t0 = time.time()
    entry = Path(shared_checkpoint(str(src), torch.float32))
    assert time.time() - t0 < 30  # the dead process's lock went with it
    assert not list(cache.glob(f".{name}.tmp-*"))
    with safe_open(str(entry / "model.safetensors"), "pt") as f:  # a complete file
        assert len(list(f.keys())) > 10
    # an entry whose marker is gone (an older format, a half-deleted one) is rebuilt too
    (entry / ".homerl-complete").unlink()
    (entry / "model.safetensors").write_bytes(b"")
    again = Path(shared_checkpoint(str(src), torch.float32))
    assert again == entry and (entry / "model.safetensors").stat().st_size > 1000


def test_hf_worker_on_the_conversion_is_on_policy_with_lora_unmerged(cache, tmp_path):
    """Staleness 0 on a bf16 checkpoint run in fp32: the learner and the worker map one
    conversion; the worker keeps LoRA unmerged and records the learner's log-probs."""
    from actors.hf_worker import HFRolloutWorker
    from common.types import RolloutCall, Sampling
    from learner.learner import Learner

    src = save_half(tmp_path / "bf16", init_std=0.5)
    cfg = make_cfg(str(src))
    learner = Learner(cfg)
    for s in range(2):  # LoRA B != 0: the adapter matters
        learner.train_on(random_batch(seed=s)).row()
    worker = HFRolloutWorker(cfg, name="rollout-0")
    assert worker.weights.merge is False
    base = worker.model.model.layers[0].mlp.up_proj.weight
    assert Path(shared_checkpoint(str(src), torch.float32)).name in mapped_file(base)
    worker.set_weights(learner.export(), learner.version)
    before = base.detach().clone()
    batch = worker.generate(RolloutCall(PROMPTS, 8, Sampling(seed=1)))
    assert torch.equal(base, before)  # nothing written into the shared pages
    want = learner_logprobs(learner, batch)
    diff = max(float(np.abs(np.asarray(b) - w).max()) for b, w in zip(batch.logprobs, want))
    assert diff < 1e-3, diff


def mapped_file(t: torch.Tensor) -> str:
    ptr = t.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= ptr < hi:
                return (line.split()[5:] or [""])[0]
    return ""


def test_the_plan_counts_the_shared_base_once(monkeypatch):
    cfg = get_preset("cpu-14core")
    cfg.model.dtype = "fp32"  # what a CPU without AMX runs
    s = KNOWN["qwen/qwen2-0.5b-instruct"]
    n, w = cfg.rollout.num_workers, s.params * 4.0

    def plan(share: str):
        monkeypatch.setenv("HOMERL_SHARE_WEIGHTS", share)
        return {(p, c.split(" (")[0]): v for p, c, v in budget(cfg, s)}

    private, shared = plan("0"), plan("1")
    assert private[("rollout-0", "base weights")] == private[("learner", "base weights")] == w
    assert shared[("learner", "base weights")] == pytest.approx(w / (n + 1))
    assert shared[("rollout-5", "base weights")] == pytest.approx(w / (n + 1))
    adapters = _lora_params(cfg, s) * 4.0
    assert shared[("rollout-0", "LoRA adapters, unmerged, fp32")] == adapters
    assert ("rollout-0", "bf16 W0 of the adapted linears") not in shared
    bf16_w0 = _adapted_linear_params(cfg, s) * 2.0
    # the unmerged adapters' hook adds a delta and a sum of the intermediate's width at prefill
    r = cfg.rollout
    seqs = -(-r.prompts_per_step * r.group_size // n) * r.steps_per_call
    prefill = ("rollout-0", "prefill, one layer")
    hook = shared[prefill] - private[prefill]
    assert hook == seqs * PROMPT_TOKENS["arith"] * 2 * s.intermediate * 4
    saved = n * w + n * (bf16_w0 - adapters - hook)  # six fp32 copies and six bf16 W0s
    assert sum(private.values()) - sum(shared.values()) == pytest.approx(saved)
    assert sum(shared.values()) / GiB < 8 < 20 < sum(private.values()) / GiB
