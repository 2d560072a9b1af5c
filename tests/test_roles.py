"""launch/driver/roles.py: the driver's actor classes forward every public method of the real ones,
and importing the driver loads neither torch nor transformers."""

import inspect
import subprocess
import sys

import pytest
from conftest import own_lines

from launch.driver import roles


def _public(cls) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}


@pytest.mark.parametrize("name, module", [("Learner", "learner.learner"),
                                          ("HFRolloutWorker", "actors.hf_worker"),
                                          ("VLLMRolloutWorker", "actors.vllm_worker"),
                                          ("OneCopy", "launch.driver.one_copy")])
def test_each_role_forwards_exactly_the_real_classes_public_methods(name, module):
    if name == "VLLMRolloutWorker":
        pytest.importorskip("vllm")
    real = getattr(__import__(module, fromlist=[name]), name)
    assert _public(getattr(roles, name)) == _public(real)


def test_a_role_builds_the_real_object_and_forwards_calls():
    from common.presets import get_preset

    learner = roles.Learner(get_preset("tiny"))
    assert type(learner._impl).__module__ == "learner.learner"
    assert learner.ping() == 0
    assert learner.export().version == 0


def test_the_driver_imports_no_torch_transformers_or_vllm():
    # importing the driver, and what it does before Ray starts: refuse a missing GPU, plan RAM
    code = ("import sys, launch.train; from common.presets import get_preset; "
            "from launch.driver.placement import check_ram, local_cpu_run, refuse_missing_gpu; "
            "cfg = get_preset('cpu-demo'); refuse_missing_gpu(cfg); "
            "assert local_cpu_run(cfg); check_ram(cfg); "
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'vllm') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip().splitlines()[-1]
    assert out == "[]"


def test_machine_gpus_counts_device_nodes_when_the_torch_probe_fails_mocked(monkeypatch):
    from common import device

    monkeypatch.setattr(device.glob, "glob", lambda pattern: ["/dev/nvidia0", "/dev/nvidia1"])
    monkeypatch.setattr(device, "probe_cuda", lambda: None)  # no torch answer: count the nodes
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert device.machine_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert device.machine_gpus() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert device.machine_gpus() == 0


def test_a_learner_that_cannot_start_is_one_line_and_leaves_no_actor(ray_cluster, tmp_path,
                                                                    capsys):
    """The learner fails in its `__init__` (LoRA targets the model lacks) while its rollout
    worker starts fine: start_roles must notice the learner too (the pool pings only its
    workers) and kill both; launch.train, called in-process on the caller's own cluster (as
    `ray.init()` then homerl would be), says one line, frees the cores it reserved and keeps
    that cluster running."""
    import ray
    from ray.util import placement_group_table

    from launch.train import main

    def reserved() -> set[str]:  # placement groups holding cores (earlier tests' are removed)
        return {k for k, pg in placement_group_table().items() if pg["state"] != "REMOVED"}

    before = reserved()
    capsys.readouterr()
    assert main(["--preset", "tiny", "--lora.target_modules", "no_such_proj",
                 "--run-dir", str(tmp_path / "nolearner")]) == 2
    err = capsys.readouterr().err
    ours = own_lines(err, "launch.train")
    assert len(ours) == 1 and ours[-1].startswith("launch.train: error: an actor could not "
                                                  "start: ") and "no_such_proj" in ours[0], err
    assert ray.is_initialized()  # the caller's cluster is not main()'s to shut down
    for name in ("learner:nolearner", "rollout-0:nolearner"):  # killed: their names are free
        with pytest.raises(ValueError):
            ray.get_actor(name)
    assert reserved() <= before  # the run's own group is gone
    assert not (tmp_path / "nolearner").exists()  # refused before training: no run directory
