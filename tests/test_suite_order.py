"""The suite's own order: tests/durations.json names tests that exist, the longest go first,
and tools.ops.test_durations reads pytest's --durations lines; and the suite's reading of a
program's stderr past what Ray forwards into it. Pure: no Ray, no model."""

import contextlib
import json
import re
from pathlib import Path
from types import SimpleNamespace

from conftest import DURATIONS, LONG_S, _order, own_lines, without_ray

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

    def longest_first(group):
        return sorted(group, key=lambda i: -DURATIONS[i.nodeid])

    assert items == [*longest_first(long_own), short_own, *longest_first(long_shared),
                     short_shared]  # (a tie keeps its order: two tests may take as long)
    assert longest_first(long_own + long_shared) != long_own + long_shared
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


def test_a_programs_stderr_is_read_past_the_lines_ray_forwards_into_it():
    raylet = ("\x1b[33m(raylet)\x1b[0m [2026-11-29 19:38:38,049 E 20974 20985] (raylet) "
              "file_system_monitor.cc:116: /tmp/rgw1/ray/session is over 95% full")
    bar = ("\x1b[36m(HFRolloutWorker pid=7835)\x1b[0m Loading weights:   0%|   | 0/21\r"
           "Loading weights: 100%|###| 21/21")
    traceback = ["(Learner pid=42, ip=10.0.0.2) Traceback (most recent call last):",
                 "(Learner pid=42, ip=10.0.0.2)   File \"learner.py\", line 1, in <module>"]
    line = "launch.app: error: --auth: a password on the command line (pid=1 can read it)"
    err = "\n".join([raylet, bar, line, *traceback, ""])
    assert without_ray(err) == line
    assert without_ray(f"{line}\n(note) not from Ray\n") == f"{line}\n(note) not from Ray"
    assert own_lines(err, "launch.app") == [line] and own_lines(err, "launch.train") == []
