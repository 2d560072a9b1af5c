"""The package layers import one way, so the house stays livable:

    common  <-  rewards  <-  tasks  <-  actors, learner  <-  launch  <-  homerl  <-  tools, examples

A module may import its own package and any lower layer; never a higher one, and `actors` and
`learner` never import each other. `rewards` and `tasks` stay free of torch, Ray and
transformers. Imports inside functions count too, and they are kept for real import costs
only, each with a comment saying why. No project module imports itself back in a circle.
Modules stay under the size the style guide allows (a module over ~400 lines is a prompt to
check it is still one role; 600 is the limit), and every package says what it owns.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"common": 0, "rewards": 1, "tasks": 1.5, "actors": 2, "learner": 2, "launch": 3,
         "homerl": 3.5, "tools": 4, "examples": 4}
MAX_LINES = 600
LAUNCH_TOP_LEVEL = 8
"""modules launch/ may hold beside its sub-packages (the entry points and what they share)"""


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
    if own in ("rewards", "tasks"):
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


# ---- no circles --------------------------------------------------------------------------
def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(path: Path, known: set[str]) -> set[str]:
    """Project modules `path` imports, anywhere in it: `from pkg import mod` counts as `pkg.mod`
    when that is a module, and `from mod import name` as `mod`."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            out |= subs or ({node.module} & known)
    return out


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (as the modules along it), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_itself_back_in_a_circle():
    paths = {module_name(p): p for p in modules()}
    known = set(paths)
    graph = {name: project_imports(p, known) - {name} for name, p in paths.items()}
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_the_circle_finder_sees_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


# ---- imports inside functions --------------------------------------------------------------
def local_project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of each project import inside a function of `path`."""
    out = []
    for fn in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            out += [(node.lineno, m) for m in mods if m.split(".")[0] in LAYER]
    return out


@pytest.mark.parametrize("path", list(modules()), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_project_import_inside_a_function_says_why(path):
    """Allowed where importing at the top would cost something real (torch in the driver,
    model code in a process that must hold no CUDA context): a comment on the import line or
    just above it says so."""
    lines = path.read_text().splitlines()
    for lineno, module in local_project_imports(path):
        above = lineno - 1  # the comment may head a block of such imports
        while above > 0 and re.match(r"\s*(from|import) ", lines[above - 1]):
            above -= 1
        near = " ".join(lines[max(0, above - 2): lineno])
        assert "#" in near or "import cost" in near, (
            f"{path.relative_to(ROOT)}:{lineno}: `{module}` imported inside a function with no "
            "comment saying why (import it at the top)")


# ---- the house ---------------------------------------------------------------------------
def test_launch_is_organised_by_job():
    top = sorted(p.name for p in (ROOT / "launch").glob("*.py"))
    assert len(top) <= LAUNCH_TOP_LEVEL, top
    subs = [p for p in (ROOT / "launch").iterdir() if (p / "__init__.py").exists()]
    assert {p.name for p in subs} >= {"driver", "rundir", "plan", "evaluate", "app"}


def test_every_package_says_what_it_owns():
    for init in ROOT.glob("*/**/__init__.py"):
        if init.relative_to(ROOT).parts[0] not in LAYER:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 40, f"{init.relative_to(ROOT)}: no docstring saying what it owns"


def test_no_module_name_is_used_twice_in_launch():
    names = [p.stem for p in (ROOT / "launch").rglob("*.py")
             if not re.fullmatch(r"__\w+__", p.stem)]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, twice


OPTIONAL_UI = {"gradio", "playwright"}
"""the web app's extras (pip install -e '.[app]'): only launch/app/ui.py may import them"""


@pytest.mark.parametrize("path", list(modules()), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_app_imports_gradio(path):
    if path.relative_to(ROOT).as_posix() != "launch/app/ui.py":
        assert not imported(path) & OPTIONAL_UI, f"{path.relative_to(ROOT)} imports the UI extra"
