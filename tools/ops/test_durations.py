"""Seconds per test from a `make test` log, for the suite's order (tests/conftest.py).

    PYTEST_ADDOPTS=--durations=0 .ci/run > test.log    # a clean clone's CI run
    python -m tools.ops.test_durations test.log > tests/durations.json

Reads pytest's "slowest durations" lines (`12.34s call     tests/x.py::test_y`), adds each test's
setup, call and teardown, and prints {test id: seconds} for the tests that took at least
`--min-s` (1 s), slowest first. `make test` hands the slowest tests out first, longest first, so
that neither of its two processes is left with a long test when the other has finished.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+)$")


def durations(lines) -> dict[str, float]:
    """{test id: setup + call + teardown seconds} from pytest's --durations lines."""
    total: dict[str, float] = defaultdict(float)
    for line in lines:
        m = LINE.match(line.strip())
        if m:
            total[m.group(3)] += float(m.group(1))
    return dict(total)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools.ops.test_durations",
                                description=__doc__.splitlines()[0])
    p.add_argument("log", help="a pytest log with --durations=0")
    p.add_argument("--min-s", type=float, default=1.0, help="leave out faster tests")
    args = p.parse_args(argv)
    with open(args.log, errors="replace") as f:
        found = durations(f)
    if not found:
        p.error(f"{args.log}: no --durations lines (run pytest with --durations=0)")
    keep = {k: round(v, 1) for k, v in sorted(found.items(), key=lambda kv: -kv[1])
            if v >= args.min_s}
    json.dump(keep, sys.stdout, indent=0)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
