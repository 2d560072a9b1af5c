"""The python-tests verifier where the OS cannot isolate code: check and start-up refuse in
one line, items score 0 with `no_sandbox`, and only the explicit unsafe switch runs code (the
OS boundary is simulated; everything above it is the real code). Isolated runs and hostile
code: tests/test_codecheck.py."""

import logging
import os
import sys
from pathlib import Path

import pytest
from conftest import without_ray

from rewards.verifiers import python_tests as codecheck
from rewards.verifiers.python_tests import check_isolation, python_tests

try:  # tests/ as a package, or as a plain directory on sys.path
    from tests.test_codecheck import SOLUTION, TESTS
except ImportError:
    from test_codecheck import SOLUTION, TESTS


# --- where the OS cannot isolate ---------------------------------------------------------

REAL_JAIL = [os.path.realpath(sys.executable), "-I", "-S",
             str(Path(codecheck.__file__).resolve().parents[1] / "sandbox" / "jail.py")]
FAKE_LAUNCHER = [sys.executable, "-c", (
    "import json, os, sys\ncfg = json.loads(sys.argv[-1])\n"
    "os.write(cfg['report_fd'], b'setup-error unshare(net, mount, pid, ipc, uts namespaces): "
    "Operation not permitted\\n')\nsys.exit(125)\n")]


@pytest.fixture
def no_namespaces():
    """The launcher behaves as on a kernel that refuses namespaces (the OS boundary is
    simulated; everything above it is the real code)."""
    codecheck.configure(unsandboxed=False, launcher=FAKE_LAUNCHER)
    yield
    codecheck.configure()


def test_without_isolation_check_and_start_up_refuse_in_one_line_simulated_os_boundary(
        no_namespaces, caplog):
    reason = check_isolation()
    assert reason is not None and "\n" not in reason
    assert "Operation not permitted" in reason and "unsandboxed_code" in reason
    with pytest.raises(codecheck.IsolationError, match="cannot isolate"):
        codecheck.require_isolation(unsandboxed=False)
    with caplog.at_level(logging.WARNING, logger="rewards.verifiers.python_tests"):
        codecheck.require_isolation(unsandboxed=True)  # allowed: a warning, no error
    assert "WITHOUT isolation" in caplog.text


def test_without_isolation_items_score_0_no_sandbox_simulated_os_boundary(no_namespaces, caplog):
    reply = f"```python\n{SOLUTION}```"
    with caplog.at_level(logging.ERROR, logger="rewards.verifiers.python_tests"):
        results = [python_tests(reply, TESTS) for _ in range(2)]
    assert [(r.score, r.error) for r in results] == [(0.0, "no_sandbox")] * 2
    assert caplog.text.count("refusing to run") == 1  # said once, not once per item


def test_the_unsafe_switch_runs_code_unisolated_with_one_warning_simulated_os_boundary(
        no_namespaces, caplog):
    codecheck.configure(unsandboxed=True, launcher=FAKE_LAUNCHER)
    with caplog.at_level(logging.WARNING, logger="rewards.verifiers.python_tests"):
        right = python_tests(f"```python\n{SOLUTION}```", TESTS)
        wrong = python_tests("```python\ndef add(a, b):\n    return 0\n```", TESTS)
    assert (right.score, right.error, wrong.score) == (1.0, None, 0.0)
    assert caplog.text.count("WITHOUT isolation") == 1


def test_a_python_tests_run_is_refused_before_any_actor_simulated_os_boundary(
        no_namespaces, tmp_path):
    """launch.train builds the curriculum before any actor: a python-tests file task there
    is one ConfigError line where code cannot be isolated, unless the user turns it off."""
    from common.config import ConfigError
    from common.presets import get_preset
    from launch.driver.curriculum import Curriculum

    data = tmp_path / "code.jsonl"
    data.write_text("".join(f'{{"question": "write add #{i}", "answer": "assert add(1, 2) == 3"}}\n'
                            for i in range(8)))
    cfg = get_preset("tiny")
    cfg.curriculum.task, cfg.curriculum.data_path = "file", str(data)
    cfg.curriculum.verifier, cfg.curriculum.heldout_size = "python-tests", 2
    with pytest.raises(ConfigError) as err:
        Curriculum(cfg)
    assert str(err.value).startswith("curriculum.verifier: python-tests: cannot isolate")
    assert "\n" not in str(err.value) and "unsandboxed_code" in str(err.value)
    cfg.reward.unsandboxed_code = True
    assert Curriculum(cfg).tasks[0].train_sample(0)["verifier"] == "python-tests"


def test_a_run_whose_reward_fn_names_python_tests_is_refused_simulated_os_boundary(
        no_namespaces):
    """reward.fn may name python-tests on any task (arith here, its verifier numeric): the
    run still runs code, so it is checked the same way."""
    from common.config import ConfigError
    from common.presets import get_preset
    from launch.driver.curriculum import Curriculum

    cfg = get_preset("tiny")
    cfg.reward.fn = "python-tests"
    with pytest.raises(ConfigError) as err:
        Curriculum(cfg)
    assert str(err.value).startswith("reward.fn: python-tests: cannot isolate")
    cfg.reward.unsandboxed_code = True
    assert Curriculum(cfg).stages[0].task == "arith"


def code_set(tmp_path) -> str:
    data = tmp_path / "code.jsonl"
    data.write_text("".join(f'{{"question": "write add #{i}", "answer": "assert add(1, 2) == 3"}}'
                            "\n" for i in range(8)))
    return str(data)


def test_launch_evaluate_of_a_python_tests_set_is_refused_in_one_line_simulated_os_boundary(
        no_namespaces, tmp_path, capsys):
    """Before any model loads (the model named here does not exist) or Ray starts."""
    from launch.evaluate.__main__ import main

    rc = main(["--model", str(tmp_path / "no-such-model"), "--task", "file", "--data",
               code_set(tmp_path), "--verifier", "python-tests", "--heldout-size", "4"])
    err = without_ray(capsys.readouterr().err)
    assert rc == 2 and "\n" not in err, err
    assert err.startswith("launch.evaluate: error: python-tests: cannot isolate"), err


def test_the_apps_evaluation_of_a_python_tests_set_is_refused_simulated_os_boundary(
        no_namespaces, tmp_path):
    """The app evaluates through evaluate_many: it refuses before loading the model."""
    import torch

    from launch.evaluate.saved_models import evaluate_many

    sets = {"code": [{"question": "write add", "answer": "assert add(1, 2) == 3",
                      "verifier": "python-tests"}]}
    with pytest.raises(codecheck.IsolationError, match="cannot isolate"):
        evaluate_many([str(tmp_path / "no-such-model")], sets, torch.float32, 8, 1)


def test_a_failed_isolation_probe_is_tried_again_later_simulated_os_boundary(
        tmp_path, monkeypatch):
    """A probe that failed once (here: the launcher fails its first start, as under load)
    refuses items for PROBE_RETRY_S, not for the verifier process's life."""
    if check_isolation(REAL_JAIL) is not None:
        pytest.skip("no isolation here: nothing to recover to")
    marker = tmp_path / "failed-once"
    flaky = [sys.executable, "-c", (
        f"import json, os, sys\nmarker = {str(marker)!r}\n"
        "if not os.path.exists(marker):\n"
        "    open(marker, 'w').close()\n"
        "    os.write(json.loads(sys.argv[-1])['report_fd'], b'setup-error the probe timed "
        "out\\n')\n    sys.exit(125)\n"
        f"os.execv({REAL_JAIL[0]!r}, [*{REAL_JAIL!r}, sys.argv[-1]])\n")]
    codecheck.configure(launcher=flaky)
    try:
        reply = f"```python\n{SOLUTION}```"
        assert python_tests(reply, TESTS).error == "no_sandbox"  # the probe failed
        assert python_tests(reply, TESTS).error == "no_sandbox"  # not probed again at once
        monkeypatch.setattr(codecheck, "PROBE_RETRY_S", 0.0, raising=False)
        assert python_tests(reply, TESTS).score == 1.0  # probed again: it passes now
    finally:
        codecheck.configure()
