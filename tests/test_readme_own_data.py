"""README.md's "Train on your own data" works as written: its JSONL block, its reward module
and its one training command, run with exactly the addition the README offers for a quick try
(`--preset tiny --steps 2`), in a fresh directory, as a user would type them.

The file names come from the command itself (`--curriculum.data_path`, `--reward.fn`), so the
test follows the README when it is edited consistently and fails when its blocks disagree, when
the command breaks, or when the reward function is never called.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SECTION = "## Train on your own data"
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)


def section(text: str, heading: str = SECTION) -> str:
    """The markdown of `heading`'s section, up to the next heading of its level."""
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end >= 0 else len(text)]


def blocks(markdown: str) -> dict[str, str]:
    """The section's fenced code blocks by info string: exactly one jsonl, one python and one
    shell block (info `sh`, `bash`, `shell` or none)."""
    found: dict[str, list[str]] = {}
    for info, body in _FENCE.findall(markdown):
        kind = info.strip().lower() or "sh"
        kind = "sh" if kind in ("bash", "shell", "console") else kind
        found.setdefault(kind, []).append(body)
    assert {k: len(v) for k, v in found.items()} == {"jsonl": 1, "python": 1, "sh": 1}, found
    return {k: v[0] for k, v in found.items()}


def command_argv(shell: str) -> list[str]:
    """The one command of a shell block (continuation lines joined), as argv."""
    joined = re.sub(r"\\\n", " ", shell).strip()
    lines = [ln for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(lines) == 1, f"expected one command, got {lines}"
    return shlex.split(lines[0], comments=True)


def flag(argv: list[str], name: str) -> str:
    """The value of `--name VALUE` in argv (its last occurrence)."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name]
    assert values, f"the README's command has no {name}"
    return values[-1]


def quick_try(markdown: str) -> list[str]:
    """The flags the README says to add for a quick try: "(add `--preset tiny ...` ...)"."""
    m = re.search(r"add `(--preset tiny[^`]*)`", markdown)
    assert m, "the section no longer offers the quick try with --preset tiny"
    return shlex.split(m.group(1))


def test_the_readme_blocks_parse():
    """The pieces the run needs are where the test expects them (fast: no run)."""
    own = section(README.read_text())
    code = blocks(own)
    rows = [json.loads(line) for line in code["jsonl"].splitlines() if line.strip()]
    assert len(rows) == 3 and all("question" in r and "answer" in r for r in rows), rows
    argv = command_argv(code["sh"])
    assert argv[:3] == ["python", "-m", "launch.train"], argv
    module, fn = flag(argv, "--reward.fn").split(":")
    assert f"def {fn}(prompts, completions," in code["python"]
    assert flag(argv, "--curriculum.data_path").endswith(".jsonl")
    assert quick_try(own)[:2] == ["--preset", "tiny"]


@pytest.mark.slow
def test_the_readme_own_data_command_trains(tmp_path):
    own = section(README.read_text())
    code = blocks(own)
    argv = command_argv(code["sh"])
    data = tmp_path / flag(argv, "--curriculum.data_path")
    module, fn = flag(argv, "--reward.fn").split(":")
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(code["jsonl"])
    (tmp_path / f"{module.replace('.', '/')}.py").write_text(code["python"])
    run_dir = tmp_path / flag(argv, "--run-dir")

    extra = quick_try(own)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline",
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": "",
           # the project importable from the user's directory, whatever is installed
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    ray_tmp = Path(tempfile.mkdtemp(prefix="rd", dir="/tmp"))  # short: socket paths are capped
    env["RAY_TMPDIR"] = str(ray_tmp)  # a cluster of its own, never one another test started
    try:
        proc = subprocess.run([sys.executable, *argv[1:], *extra], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])

    steps = int(extra[extra.index("--steps") + 1])
    metrics = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == list(range(steps))
    for m in metrics:  # the user's function scored every completion, without failing
        assert f"reward/fn/{fn}" in m, sorted(m)
        assert not any(k.startswith("reward/error_fn") and m[k] for k in m), m
    samples = [json.loads(line) for line in open(run_dir / "samples.jsonl")]
    assert samples and all(fn in s["fn"] for s in samples), samples[:2]
    # --curriculum.heldout_size 1: one of the three questions is never trained on
    rows = [json.loads(line) for line in code["jsonl"].splitlines() if line.strip()]
    questions = {r["question"] for r in rows}
    trained = {s["question"] for s in samples}
    assert trained <= questions and len(questions - trained) >= 1, trained
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["curriculum"]["heldout_size"] == int(flag(argv, "--curriculum.heldout_size"))
