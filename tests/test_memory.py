"""Memory: the chunked LM-head log-probs, process footprints, the memory metrics row."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from common import metrics as M
from common.memory import Footprint, footprint, memory_row
from learner.model import _target_logprobs, head_fp32, head_logprobs

ROOT = Path(__file__).resolve().parents[1]


def _head_and_rows(k=37, hidden=16, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=g))
    h = torch.randn(k, hidden, generator=g, requires_grad=True)
    targets = torch.randint(0, vocab, (k,), generator=g)
    return head, h, targets


def test_chunked_head_logprobs_match_the_unchunked_values_and_gradients():
    head, h, targets = _head_and_rows()
    # 3 rows of a 50-word vocabulary per chunk: 13 chunks, the last one short
    logp_c, ent_c = head_logprobs(head, h, targets, temperature=0.7, chunk_bytes=3 * 4 * 50)
    w = torch.linspace(-1, 1, len(targets))
    (logp_c * w).sum().backward()
    grad_h_c, grad_w_c = h.grad.clone(), head.weight.grad.clone()
    h.grad, head.weight.grad = None, None

    logp, ent = _target_logprobs(head_fp32(head, h) / 0.7, targets)
    (logp * w).sum().backward()
    torch.testing.assert_close(logp_c, logp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent_c, ent, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_h_c, h.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_w_c, head.weight.grad, rtol=1e-5, atol=1e-5)
    assert not ent_c.requires_grad


def test_head_logprobs_are_log_probabilities_of_the_targets():
    head, h, targets = _head_and_rows(k=5, vocab=7)
    logp, ent = head_logprobs(head, h, targets, chunk_bytes=4 * 7)  # one row per chunk
    probs = torch.softmax(h @ head.weight.T, -1)                    # (K, V)
    torch.testing.assert_close(logp, probs[range(5), targets].log(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent, -(probs * probs.log()).sum(-1), rtol=1e-5, atol=1e-6)


def test_footprint_of_this_process_counts_a_new_private_buffer():
    before = footprint(children=False)
    buf = np.ones(256 * 2**20 // 8)  # 0.25 GiB, written so it is resident
    after = footprint(children=False)
    # half the buffer as the bar: the process's shared pages (libraries) move its PSS by
    # ~0.01-0.02 GiB as other processes on the machine map or drop them (a CI run saw
    # 64 MiB counted as 0.049 GiB)
    assert after.rss_gb - before.rss_gb > 0.125
    assert after.pss_gb - before.pss_gb > 0.125   # private pages count in full in PSS
    assert after.peak_gb >= after.rss_gb > 0
    assert 0 < after.pss_gb <= after.rss_gb
    del buf


def test_footprint_splits_pages_shared_with_a_forked_child():
    buf = np.ones(128 * 2**20 // 8)  # 128 MiB written before the fork: shared copy-on-write
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child waits, holding the shared pages, until the parent has measured
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    try:
        parent = footprint(children=False)
        both = footprint(children=True)
        assert both.children_rss_gb > 0.1            # the child maps the buffer too
        # RSS counts the shared buffer in both processes, PSS splits it between them
        assert both.rss_gb - parent.rss_gb > 0.1
        assert both.pss_gb < parent.pss_gb + (both.rss_gb - parent.rss_gb) - 0.05
    finally:
        os.close(read)
        os.write(write, b"x")
        os.close(write)
        os.waitpid(pid, 0)
    del buf


def test_peak_pss_adds_the_high_water_excess_over_todays_rss():
    fp = Footprint(rss_gb=1.0, pss_gb=0.6, peak_gb=1.5)
    assert fp.peak_pss_gb == pytest.approx(1.1)
    assert Footprint(rss_gb=1.0, pss_gb=0.6, peak_gb=1.0).peak_pss_gb == pytest.approx(0.6)


def test_memory_row_sums_the_roles_and_names_each_worker():
    driver = Footprint(0.1, 0.05, 0.1)
    learner = Footprint(1.0, 0.7, 2.0)
    workers = {"rollout-0": Footprint(1.0, 0.6, 1.1, 0.1), "rollout-1": Footprint(2.0, 1.4, 2.0)}
    row = memory_row(driver, learner, workers, {"rollout-0": Footprint(0.1, 0.08, 0.1)})
    assert row[M.RSS_GB] == pytest.approx(4.1)
    assert row[M.PSS_GB] == pytest.approx(2.75)
    assert row[M.PEAK_GB] == pytest.approx(5.2)
    # 0.05 + (0.7 + 1.0) + (0.6 + 0.1) + 1.4
    assert row[M.PEAK_PSS_GB] == pytest.approx(3.85)
    assert row[M.WORKERS_PSS_GB] == pytest.approx(2.0)
    assert row[M.VERIFIER_PSS_GB] == pytest.approx(0.08)
    assert row[f"{M.WORKER_MEMORY_PREFIX}rollout-1_rss_gb"] == 2.0
    assert row[f"{M.WORKER_MEMORY_PREFIX}rollout-0_peak_gb"] == 1.1



def test_ray_daemons_of_the_cluster_this_process_started(ray_cluster):
    from common.memory import ray_daemons, ray_row

    daemons = ray_daemons()
    assert {"raylet", "gcs_server"} <= set(daemons)
    assert all(fp.pss_gb > 0 for fp in daemons.values())
    row = ray_row()
    assert row[f"{M.RAY_MEMORY_PREFIX}total_pss_gb"] == pytest.approx(
        sum(fp.pss_gb for fp in daemons.values()), rel=0.2)
    assert f"{M.RAY_MEMORY_PREFIX}raylet_rss_gb" in row


_FRAGMENT = """
import sys, numpy as np
from common.memory import pin_mmap_threshold
if sys.argv[1] == "pin":
    assert pin_mmap_threshold()
elif sys.argv[1] == "hf-worker":                 # the HF rollout worker pins it when built
    from actors.hf_worker import HFRolloutWorker
    from common.presets import get_preset
    cfg = get_preset("tiny"); cfg.model.name = sys.argv[2]
    HFRolloutWorker(cfg)
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:"))
big = np.ones(2 << 20); del big             # a 16 MiB block freed: glibc raises its threshold
base = rss()
blocks = [np.ones(2 << 17) for _ in range(60)]   # 60 x 2 MiB, touched
del blocks[::2]                             # free every other one: holes, not the heap's top
print(rss() - base)                         # KiB resident: 30 live blocks + any freed ones
"""


def test_pinned_mmap_threshold_returns_freed_blocks_to_the_os():
    """The learner's pin_mmap_threshold: 2 MiB tensors freed after a 16 MiB one go back to the
    OS at once; with glibc's dynamic threshold (the default) they stay resident as heap holes.
    30 blocks (60 MiB) stay live in both cases."""
    def kept_kib(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _FRAGMENT, mode], capture_output=True,
                             text=True, check=True, cwd=ROOT).stdout
        return int(out.split()[-1])

    pinned, default = kept_kib("pin"), kept_kib("default")
    assert pinned < 70 * 1024  # the live 60 MiB only
    assert default > pinned + 40 * 1024  # the fault this guards against, seen without it


def test_the_hf_rollout_worker_pins_the_mmap_threshold(tiny_qwen2):
    """A decode step frees (rows x vocab) tensors of several MiB: a built HF worker's process
    returns such freed blocks to the OS (the same pattern as above, with no pin of its own)."""
    out = subprocess.run([sys.executable, "-c", _FRAGMENT, "hf-worker", tiny_qwen2],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert int(out.split()[-1]) < 70 * 1024


def test_memory_table_puts_each_workers_peak_beside_its_plan(tmp_path):
    """tools.measure.memory_table on a hand-written run: per role and per worker, the largest
    PSS + (high-water RSS - RSS) over the rows, next to the plan of the run's config."""
    import json

    from common.presets import get_preset
    from launch.plan.ram import GiB, budget, per_process
    from tools.measure.memory_table import each_worker, table

    cfg = get_preset("cpu-14core")
    cfg.rollout.num_workers = 2
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))

    def role(prefix, rss, pss, peak):
        return {f"{prefix}rss_gb": rss, f"{prefix}pss_gb": pss, f"{prefix}peak_gb": peak}

    rows = []
    for w0_pss, w1_peak in ((0.7, 2.5), (0.75, 2.6)):  # worker 1's peak grows in step 2
        row = {M.PEAK_PSS_GB: 3.0} | role("memory/driver_", 0.15, 0.09, 0.15)
        row |= role("memory/learner_", 2.6, 0.9, 2.6) | role("memory/workers_", 4.8, 1.4, 5.0)
        row |= role(f"{M.WORKER_MEMORY_PREFIX}rollout-0_", 2.4, w0_pss, 2.4)
        row |= role(f"{M.WORKER_MEMORY_PREFIX}rollout-1_", 2.4, 0.7, w1_peak)
        rows.append(row)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    assert each_worker(rows) == pytest.approx({"rollout-0": 0.75, "rollout-1": 0.9})
    plan = per_process(budget(cfg))["rollout-1"] / GiB
    text = table(str(tmp_path))
    assert f"rollout-1 {plan:.2f}/0.90 ({plan / 0.9:.2f})" in text
    assert f"rollout-0 {plan:.2f}/0.75" in text
