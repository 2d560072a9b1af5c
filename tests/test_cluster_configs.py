"""cluster_configs/: the files parse, carry docs/cluster.md's set-up and entrypoint, and the two
`ray up` configs pass Ray's own validation. Nothing here starts a cluster or contacts a cloud."""

import copy
import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml

from common.presets import get_preset

CONFIGS = Path(__file__).resolve().parents[1] / "cluster_configs"
RAY_UP = ["onprem-cpu.yaml", "aws-gpu.yaml"]


def load(name: str) -> dict:
    return yaml.safe_load((CONFIGS / name).read_text())


def ray_schema() -> dict:
    # The schema `ray up` validates against, read from the installed ray package.
    return json.loads(resources.files("ray.autoscaler").joinpath("ray-schema.json").read_text())


def commands(cfg: dict, key: str) -> str:
    return "\n".join(cfg.get(key, []))


@pytest.mark.parametrize("name", RAY_UP + ["kuberay-rayjob.yaml"])
def test_starts_with_what_to_edit(name):
    head = (CONFIGS / name).read_text().splitlines()[:6]
    assert all(line.startswith("#") for line in head), name
    assert "edit" in " ".join(head).lower(), name


@pytest.mark.parametrize("name", RAY_UP)
def test_ray_up_config_has_project_setup(name):
    cfg = load(name)
    for key in ("cluster_name", "provider", "setup_commands", "head_start_ray_commands",
                "worker_start_ray_commands", "file_mounts"):
        assert key in cfg, (name, key)
    setup = commands(cfg, "setup_commands")
    assert "make setup" in setup and ".venv/bin/activate" in setup
    assert "ray start --head" in commands(cfg, "head_start_ray_commands")
    assert "ray start --address" in commands(cfg, "worker_start_ray_commands")
    # ray must come from the project's venv, or the job's python lacks the dependencies.
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        assert all(".venv/bin/activate" in c for c in cfg[key]), (name, key)


def test_onprem_is_local_provider():
    provider = load("onprem-cpu.yaml")["provider"]
    assert provider["type"] == "local" and provider["head_ip"] and provider["worker_ips"]


def test_aws_has_cpu_head_and_gpu_workers():
    cfg = load("aws-gpu.yaml")
    assert cfg["provider"]["type"] == "aws"
    types = cfg["available_node_types"]
    assert types[cfg["head_node_type"]]["node_config"]["InstanceType"].startswith("m5")
    gpu = [t for n, t in types.items() if n != cfg["head_node_type"]]
    assert gpu and gpu[0]["node_config"]["InstanceType"].startswith("g5")
    assert "pip install" in commands(cfg, "worker_setup_commands")
    assert "'.[gpu]'" in commands(cfg, "worker_setup_commands")


@pytest.mark.parametrize("name", RAY_UP)
def test_ray_up_config_passes_ray_schema(name):
    schema = ray_schema()
    jsonschema.validate(load(name), schema)
    bad = copy.deepcopy(load(name))
    bad["setup_comands"] = []  # a typo'd key must be refused: the check is not vacuous
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


@pytest.mark.parametrize("name", RAY_UP)
def test_ray_up_config_passes_ray_up_checks(name):
    # Private API, isolated here on purpose: `ray up` runs prepare_config (merge the provider's
    # defaults, check head_ip/worker_ips, node-type min/max workers) and then validate_config;
    # Ray has no public function for that, and it needs no cloud credentials.
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(load(name))
    validate_config(prepared)
    assert "make setup" in commands(prepared, "head_setup_commands")
    assert "make setup" in commands(prepared, "worker_setup_commands")


def test_kuberay_rayjob():
    job = load("kuberay-rayjob.yaml")
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert "python -m launch.train --preset cpu-14core" in spec["entrypoint"]
    assert "--run-dir /mnt/" in spec["entrypoint"]
    env_vars = yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]
    assert int(env_vars["RAY_JOB_STOP_WAIT_TIME_S"]) >= 60  # a stop lets the step end
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    workers = cluster["workerGroupSpecs"]
    assert head["image"] and workers and workers[0]["template"]["spec"]["containers"][0]["image"]
    # The preset's layout must fit: the learner's bundle on one worker pod, all bundles in all.
    r = get_preset("cpu-14core").rollout
    cpus = [int(g["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"])
            for g in workers for _ in range(g["replicas"])]
    need = r.learner_threads + r.num_workers * r.threads_per_worker
    assert max(cpus) >= r.learner_threads and sum(cpus) >= need, cpus
