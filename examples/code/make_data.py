"""Write the function-writing dataset: train.jsonl and heldout.jsonl.

    python examples/code/make_data.py [OUT_DIR]      # default: examples/code/data

Every row is {"question": ..., "answer": <assert statements>, "entry_point": <function name>,
"family": ..., "kind": "math" | "str" | "list", "reference": <a solution>}. The tasks are the
families of `families.py`; nothing is downloaded, and the output is the same on every run. The
expected values of the tests come from running the reference solutions written there (this
script's own code, never a model's). Two families in five of each kind are held out: a held-out
function is never asked for in training, under any name, constant or phrasing. Training has
every name x phrasing x constant of its families; the held-out file has three prompts per
held-out family (each a different name and phrasing).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

try:
    from examples.code.families import FAMILIES, Family
except ImportError:  # run as a script: this folder is on sys.path
    from families import FAMILIES, Family

PHRASINGS = (
    "Write a Python function {sig} that {does}.",
    "Implement {sig} in Python: a function that {does}.",
    "Define a function {sig} in Python. It {does}.",
)
HELD_OUT = (0, 2)
"""a family whose rank in its kind, mod 5, is one of these is held out"""


def reference(family: Family, name: str, k) -> str:
    """The reference solution of `family` under `name` with constant `k`."""
    body = family.body.replace("{k}", str(k)) if k is not None else family.body
    indented = "\n".join("    " + line for line in body.splitlines())
    return f"def {name}({family.params}):\n{indented}\n"


def tests(family: Family, name: str, k) -> str:
    """Assert statements: the reference's result on each of the family's inputs."""
    space: dict = {}
    exec(reference(family, name, k), space)  # our own reference code, see the docstring
    lines = []
    for args in family.inputs:
        call = f"{name}({', '.join(map(repr, args))})"
        want = space[name](*args)
        lines.append(f"assert abs({call} - {want!r}) < 1e-9" if isinstance(want, float)
                     else f"assert {call} == {want!r}")
    return "\n".join(lines) + "\n"


def row(family: Family, name: str, k, phrasing: str) -> dict:
    does = family.does.replace("{k}", str(k)) if k is not None else family.does
    return {"question": phrasing.format(sig=f"{name}({family.params})", does=does),
            "answer": tests(family, name, k), "entry_point": name,
            "family": family.names[0], "kind": family.kind,
            "reference": reference(family, name, k)}


def _rank(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def split_families() -> tuple[list[Family], list[Family]]:
    """(training families, held-out families), per kind in a stable hash order."""
    train, held = [], []
    for kind in sorted({f.kind for f in FAMILIES}):
        ranked = sorted((f for f in FAMILIES if f.kind == kind), key=lambda f: _rank(f.names[0]))
        for i, f in enumerate(ranked):
            (held if i % 5 in HELD_OUT else train).append(f)
    return train, held


def build() -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows)."""
    train_families, held_families = split_families()
    train = [row(f, name, k, p) for f in train_families for name in f.names for k in f.ks
             for p in PHRASINGS]
    held = [row(f, f.names[i], f.ks[i % len(f.ks)], PHRASINGS[(i + j) % len(PHRASINGS)])
            for j, f in enumerate(held_families) for i in range(3)]
    return train, sorted(held, key=lambda r: _rank(r["question"]))


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent / "data"
    out.mkdir(parents=True, exist_ok=True)
    train, held = build()
    for rows, name in ((train, "train.jsonl"), (held, "heldout.jsonl")):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    n_held = len({r["family"] for r in held})
    print(f"{out}: {len(train)} training rows ({len(FAMILIES) - n_held} functions), "
          f"{len(held)} held-out rows ({n_held} functions never in training)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
