"""The package layers import one way, so the house stays livable:

    common  <-  rewards  <-  actors, learner  <-  launch  <-  tools, examples

A module may import its own package and any lower layer; never a higher one, and `actors` and
`learner` never import each other. `rewards` stays free of torch, Ray and transformers.
Imports inside functions count too. Modules stay under the size the style guide asks for.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"common": 0, "rewards": 1, "actors": 2, "learner": 2, "launch": 3, "tools": 4,
         "examples": 4}
MAX_LINES = 400


def modules():
    for package in LAYER:
        yield from sorted((ROOT / package).rglob("*.py"))


def imported(path: Path) -> set[str]:
    """Top-level names of everything `path` imports (absolute imports only: the project
    uses no relative ones)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", list(modules()), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_one_way(path):
    own = path.relative_to(ROOT).parts[0]
    bad = sorted(n for n in imported(path) & set(LAYER) if n != own
                 and LAYER[n] >= LAYER[own])
    assert not bad, f"{path.relative_to(ROOT)} ({own}) imports {bad}"
    if own == "rewards":
        assert not imported(path) & {"torch", "ray", "transformers", "vllm"}


@pytest.mark.parametrize("path", list(modules()), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_short(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT)} has {n} lines (limit {MAX_LINES})"


def test_the_checker_sees_a_violation(tmp_path):
    """The walk above would catch an upward import hidden in a function body."""
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from launch.train import Trainer\n    return Trainer\n")
    assert "launch" in imported(bad)


OPTIONAL_UI = {"gradio", "playwright"}
"""the web app's extras (pip install -e '.[app]'): only launch/app.py may import them"""


@pytest.mark.parametrize("path", list(modules()), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_app_imports_gradio(path):
    if path.relative_to(ROOT).as_posix() != "launch/app.py":
        assert not imported(path) & OPTIONAL_UI, f"{path.relative_to(ROOT)} imports the UI extra"
