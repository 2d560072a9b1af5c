"""The suite's own order: tests/durations.json names tests that exist, the longest go first,
and tools.ops.test_durations reads pytest's --durations lines. Pure: no Ray, no model."""

import contextlib
import json
import re
from pathlib import Path
from types import SimpleNamespace

from conftest import DURATIONS, LONG_S, _order

from tools.ops.test_durations import durations, main

ROOT = Path(__file__).resolve().parents[1]


def test_every_timed_test_exists():
    for nodeid in DURATIONS:
        path, _, name = nodeid.partition("::")
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {re.escape(name.split('[')[0])}\(", source, re.M), nodeid


def test_own_cluster_tests_first_then_the_rest_long_ones_first_in_each():
    def item(nodeid, *fixtures):
        return SimpleNamespace(nodeid=nodeid, fixturenames=["tmp_path", *fixtures])

    long_ids = sorted(DURATIONS, key=DURATIONS.get)[-4:]  # the four longest, shortest first
    short_shared, short_own = item("tests/x.py::test_a", "ray_cluster"), item(
        "tests/x.py::test_b", "own_ray")
    long_own = [item(i, "own_ray") for i in long_ids[:2]]
    long_shared = [item(i) for i in long_ids[2:]]
    items = [short_shared, *long_own, *long_shared, short_own]
    items.sort(key=lambda i: _order(i, together=0.0))
    assert items == [*long_own[::-1], short_own, *long_shared[::-1], short_shared]
    assert all(DURATIONS[i] >= LONG_S for i in long_ids)
    # tests on one module-wide cluster sort as one own-cluster test of their summed time
    cluster = item("tests/x.py::test_c", "three_nodes")
    assert _order(cluster, together=LONG_S + 1) == (0, -(LONG_S + 1))
    assert _order(cluster, together=LONG_S - 1) == (0, 0.0)


def test_durations_add_setup_call_and_teardown(tmp_path):
    lines = ["============ slowest durations ============",
             "12.50s call     tests/test_x.py::test_a[1]",
             "2.00s setup    tests/test_x.py::test_a[1]",
             "0.50s teardown tests/test_x.py::test_a[1]",
             "3.25s call     tests/test_y.py::test_b",
             "(15 durations < 0.005s hidden.)"]
    assert durations(lines) == {"tests/test_x.py::test_a[1]": 15.0,
                                "tests/test_y.py::test_b": 3.25}
    log = tmp_path / "test.log"
    log.write_text("\n".join(lines))
    out = tmp_path / "out.json"
    with open(out, "w") as f, contextlib.redirect_stdout(f):
        assert main([str(log), "--min-s", "5"]) == 0
    assert json.loads(out.read_text()) == {"tests/test_x.py::test_a[1]": 15.0}
