"""launch/roles.py: the driver's actor classes forward every public method of the real ones,
and importing the driver loads neither torch nor transformers."""

import inspect
import subprocess
import sys

import pytest

from launch import roles


def _public(cls) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}


@pytest.mark.parametrize("name, module", [("Learner", "learner.learner"),
                                          ("HFRolloutWorker", "actors.hf_worker"),
                                          ("VLLMRolloutWorker", "actors.vllm_worker")])
def test_each_role_forwards_exactly_the_real_classes_public_methods(name, module):
    if name == "VLLMRolloutWorker":
        pytest.importorskip("vllm")
    real = getattr(__import__(module, fromlist=[name]), name)
    assert _public(getattr(roles, name)) == _public(real)


def test_a_role_builds_the_real_object_and_forwards_calls():
    from launch.presets import get_preset

    learner = roles.Learner(get_preset("tiny"))
    assert type(learner._impl).__module__ == "learner.learner"
    assert learner.ping() == 0
    assert learner.export().version == 0


def test_the_driver_imports_no_torch_transformers_or_vllm():
    code = ("import sys, launch.train; "
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'vllm') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip().splitlines()[-1]
    assert out == "[]"
