"""Shared fixtures: one local Ray cluster per pytest run, and the tiny models tests build.

* `ray_cluster`: a real local Ray cluster (4 logical CPUs), started on first use and kept for
  the rest of the run (starting one costs ~3-5 s). Tests that need a cluster of another shape
  (several nodes, a metrics port, a job head) take `own_ray` instead, which shuts the shared one
  down first; the next `ray_cluster` user starts it again.
* `tiny_llama`: the cached `tiny-random-llama` checkpoint (Llama, 16-dim heads).
* `tiny_qwen2`: a tiny random Qwen2 checkpoint (tied embeddings, q/k/v biases, 32-dim heads,
  which vLLM's CPU backend accepts).
* `tiny_vllm_llama`: a tiny random Llama with 32-dim heads, for vLLM.

Models are random and built in memory from a config: no test downloads anything.
"""

from __future__ import annotations

import pytest
import ray

SHARED_CPUS = 4


@pytest.fixture
def ray_cluster():
    """The shared local cluster (see the module docstring)."""
    if not ray.is_initialized():
        ray.init(num_cpus=SHARED_CPUS, include_dashboard=False)
    yield


@pytest.fixture
def own_ray():
    """For a test that starts a Ray cluster of its own: none is connected when it begins, and
    whatever it started is shut down after it."""
    if ray.is_initialized():
        ray.shutdown()
    yield
    if ray.is_initialized():
        ray.shutdown()


def pytest_sessionfinish(session, exitstatus):
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    from common.models import TINY_MODEL_NAME, resolve_model

    return resolve_model(TINY_MODEL_NAME)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> str:
    from common.tiny_model import save_tiny_qwen2

    return str(save_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2")))


@pytest.fixture(scope="session")
def tiny_vllm_llama(tmp_path_factory) -> str:
    from common.tiny_model import save_tiny_vllm_model

    return str(save_tiny_vllm_model(tmp_path_factory.mktemp("tiny-vllm-llama")))


@pytest.fixture
def run_job(ray_cluster):
    """Run launch.train's Trainer to the end on the shared cluster:
    `run_job(cfg, run_dir, resume=False) -> (summary, metrics rows, worker versions)`."""
    import json
    import os

    from launch.train import Trainer

    def run(cfg, run_dir, resume: bool = False):
        trainer = Trainer(cfg, str(run_dir), resume=resume)
        try:
            summary = trainer.run()
            versions = trainer.pool.worker_versions()
        finally:
            trainer.shutdown()
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        return summary, rows, versions

    return run
