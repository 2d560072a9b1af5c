"""The web app's server policy (launch/app/policy.py), through the callbacks the page calls:
closed by default (loopback, the app's own folders, listed reward functions, capped inputs),
each refusal one line naming what is not allowed and the flag that allows it."""

from __future__ import annotations

import json
import os

import pytest
from conftest import without_ray

from launch.app.model_tabs import run_eval, try_model
from launch.app.policy import Policy, PolicyError, is_loopback, read_auth
from launch.app.runs import FormError, allowed, form_config, resume_run, start_run
from launch.app.uploads import dataset_choices, keep_upload


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def _dataset(path, rows: int = 12) -> str:
    path.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": i + 1})
                            + "\n" for i in range(rows)))
    return str(path)


def test_host_beyond_loopback_needs_auth(capsys, tmp_path, monkeypatch):
    app = pytest.importorskip("launch.app.ui", reason="gradio not installed")
    assert [is_loopback(h) for h in ("127.0.0.1", "127.3.4.5", "::1", "localhost",
                                     "0.0.0.0", "10.0.0.2", "example.org")] == [
        True, True, True, True, False, False, False]
    monkeypatch.delenv("HOMERL_APP_AUTH", raising=False)
    assert app.main(["--host", "0.0.0.0", "--port", "1"]) == 2
    err = without_ray(capsys.readouterr().err)
    assert err.startswith("launch.app: error: --host 0.0.0.0:") and "--auth-file" in err
    (tmp_path / "short").write_text("ann:short\n")
    assert app.main(["--host", "0.0.0.0", "--auth-file", str(tmp_path / "short")]) == 2
    assert "--auth-file: must be user:password with a password of 8 or more" in (
        capsys.readouterr().err)
    (tmp_path / "auth").write_text("ann:correct-horse\n")
    assert read_auth(str(tmp_path / "auth")) == ("ann", "correct-horse")
    assert read_auth("", "bob:battery-staple") == ("bob", "battery-staple")
    assert read_auth("", "") is None


def test_run_directories_outside_the_runs_folder_are_refused(tmp_path):
    root = tmp_path / "runs"
    (root / "a").mkdir(parents=True)
    policy = Policy(runs_root=str(root))
    elsewhere = tmp_path / "model-dir"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}")  # looks like a run: Resume would write into it
    with pytest.raises(FormError) as err:
        resume_run(str(elsewhere), policy)
    assert "outside the app's runs folder" in _one_line(err) and "--allow-any-path" in str(
        err.value)
    sneaky = root / "link"
    sneaky.symlink_to(elsewhere)  # a symlink inside the folder does not get out of it
    with pytest.raises(FormError, match="outside"):
        resume_run(str(sneaky), policy)
    with pytest.raises(FormError, match="not a run directory"):  # inside: checked on
        resume_run(str(root / "a"), policy)
    assert Policy(runs_root=str(root), any_path=True).check_run_dir(str(elsewhere))


def test_models_datasets_and_reward_functions_must_be_the_servers(tmp_path, tiny_llama):
    root = tmp_path / "runs"
    policy = Policy(runs_root=str(root), reward_fns=("mine.rewards:score",))
    data = _dataset(tmp_path / "outside.jsonl")
    cases = [
        ({"preset": "tiny", "model": tiny_llama}, "model: "),  # a path the app does not list
        ({"preset": "tiny", "task": "file", "data_path": data},
         "dataset: "),
        ({"preset": "tiny", "reward_fn": "os:system"}, "reward functions: 'os:system'"),
    ]
    for form, start in cases:
        with pytest.raises(FormError) as err:
            start_run(form, str(root), policy)
        assert _one_line(err).startswith(start), err.value
    assert not root.exists() or not os.listdir(root)  # nothing started
    # built-in verifiers and the listed function pass the policy (the listed module is
    # checked later, in launch.train, like on the command line)
    assert policy.check_reward_fns(["exact", "mine.rewards:score"])
    cfg = form_config({"preset": "tiny", "task": "file", "data_path": data})
    with pytest.raises(FormError, match="dataset"):
        allowed(cfg, str(root), policy)
    kept = keep_upload(data, policy)  # uploaded through the page: allowed
    assert allowed(form_config(
        {"preset": "tiny", "task": "file", "data_path": kept}), str(root), policy)


def test_uploads_are_capped_renamed_and_listed(tmp_path):
    policy = Policy(runs_root=str(tmp_path / "runs"), max_upload_mb=0.001,
                    data_dir=str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    listed = _dataset(tmp_path / "data" / "listed.jsonl", 2)
    (tmp_path / "data" / "notes.txt").write_text("not a dataset")
    small = _dataset(tmp_path / "my data; rm -rf.jsonl", 3)
    big = _dataset(tmp_path / "big.jsonl", 200)
    with pytest.raises(PolicyError) as err:
        keep_upload(big, policy)
    assert "at most 0.001 MB" in _one_line(err)
    first, second = keep_upload(small, policy), keep_upload(small, policy)
    assert os.path.basename(first) == "my_data__rm_-rf.jsonl"
    assert second != first and os.path.dirname(second) == policy.uploads_dir
    assert dataset_choices(policy) == [listed, first, second]


def test_try_and_evaluate_inputs_are_capped(tmp_path):
    policy = Policy(runs_root=str(tmp_path / "runs"), max_prompt_chars=50, max_samples=4,
                    max_eval_n=20)
    with pytest.raises(FormError, match="prompt: 51 characters; at most 50"):
        try_model("tiny-random-llama", "x" * 51, policy=policy)
    with pytest.raises(FormError, match="samples for pass@k: 8; at most 4"):
        run_eval(["tiny-random-llama"], ["arith-1"], 5, samples=8, policy=policy)
    with pytest.raises(FormError, match="problems per set: 21; at most 20"):
        run_eval(["tiny-random-llama"], ["arith-1"], 21, policy=policy)
    with pytest.raises(FormError, match="model: 'gpt2' is not one the app lists"):
        try_model("gpt2", "What is 1 + 1?", policy=policy)
