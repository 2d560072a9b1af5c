"""Code written to forge a python-tests pass scores 0 (rewards.sandbox.harness: the judge runs
the tests and alone reports; the candidate runs the code), isolated and unisolated alike, while
honest code keeps its semantics across the two processes (classes, generators, in-place
changes, exceptions, callbacks, Counters). The isolated cases need Linux namespaces and skip,
saying so, where the machine has none."""

from textwrap import dedent

import pytest

from rewards.verifiers import python_tests as codecheck
from rewards.verifiers.python_tests import check_isolation, python_tests, run_tests

WHY_NOT = check_isolation()
MODES = [pytest.param(True, id="isolated", marks=pytest.mark.skipif(
             WHY_NOT is not None, reason=f"no isolation here: {WHY_NOT}")),
         pytest.param(False, id="unisolated")]
TESTS = "assert add(1, 2) == 3\n\ndef test_more():\n    assert add(-1, -1) == -2\n"
WRONG = "def add(a, b):\n    return 0\n"

FROM_FRAMES = dedent("""\
    import gc, os, re, sys
    found = set()
    frame = sys._getframe()
    while frame is not None:  # the process's frames: the nonce and the report descriptor
        for value in list(frame.f_locals.values()):
            if isinstance(value, str) and re.fullmatch('[0-9a-f]{32}', value):
                found.add(value)
        frame = frame.f_back
    for value in gc.get_objects():  # and anything else in memory that looks like it
        if isinstance(value, dict):
            for v in list(value.values()):
                if isinstance(v, str) and re.fullmatch('[0-9a-f]{32}', v):
                    found.add(v)
    for nonce in found:
        for fd in range(3, 256):
            try:
                os.write(fd, f'passed {nonce}\\n'.encode())
            except OSError:
                pass
    print('nonces found:', len(found))
    sys.stdout.flush()
    os._exit(0)
    """)
ALWAYS_EQUAL = dedent("""\
    class Anything:
        def __eq__(self, other):
            return True
        def __ne__(self, other):
            return False
        __hash__ = object.__hash__
    def add(a, b):
        return Anything()
    """)
EQUAL_INT = dedent("""\
    class Int(int):
        def __eq__(self, other):
            return True
        __hash__ = int.__hash__
    def add(a, b):
        return Int(0)
    """)
EARLY = {
    "sys.exit(0)": "import sys\nsys.exit(0)\n",
    "os._exit(0)": "import os\nos._exit(0)\n",
    "raise SystemExit": "raise SystemExit(0)\n",
    "sys.exit in the function": "import sys\ndef add(a, b):\n    sys.exit(0)\n",
    "close every descriptor": "import os\nos.closerange(3, 4096)\n" + WRONG,
    "close stdout and leave": "import os, sys\nos.close(1)\nos._exit(0)\n",
    "kill the parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + WRONG,
    "interrupt the parent": "import os, signal\nfor s in (signal.SIGINT, signal.SIGTERM):\n"
                            "    os.kill(os.getppid(), s)\n" + WRONG,
}


@pytest.fixture
def mode(request):
    codecheck.configure(unsandboxed=not request.param)
    yield request.param
    codecheck.configure()


def score(reply_code: str, tests: str = TESTS) -> float:
    return python_tests(f"```python\n{reply_code}```", tests).score


@pytest.mark.parametrize("mode", MODES, indirect=True)
def test_honest_code_scores_1_and_wrong_code_0(mode):
    assert score("def add(a, b):\n    return a + b\n") == 1.0
    assert score(WRONG) == 0.0


@pytest.mark.parametrize("mode", MODES, indirect=True)
def test_reading_the_nonce_from_frames_and_writing_a_pass_scores_0(mode):
    assert score(FROM_FRAMES) == 0.0
    run = run_tests(FROM_FRAMES, TESTS, isolated=mode)
    assert not run.passed and "nonces found: 0" in run.output, run.output  # it saw none


@pytest.mark.parametrize("mode", MODES, indirect=True)
@pytest.mark.parametrize("code", [ALWAYS_EQUAL, EQUAL_INT], ids=["always-equal", "int-subclass"])
def test_an_object_that_equals_everything_scores_0(mode, code):
    assert score(code) == 0.0
    assert score(code, "assert add(1, 2) in (3,)\n") == 0.0
    assert score(code, "assert [add(1, 2)] == [3]\n") == 0.0
    assert score(code, "assert not (add(1, 2) != 3)\n") == 0.0


@pytest.mark.parametrize("mode", MODES, indirect=True)
@pytest.mark.parametrize("how", list(EARLY))
def test_leaving_early_or_attacking_the_judge_scores_0(mode, how):
    assert score(EARLY[how]) == 0.0


@pytest.mark.parametrize("mode", MODES, indirect=True)
def test_a_callback_of_the_tests_can_be_called_not_inspected(mode):
    tests = "assert apply(lambda x: x + 1, 2) == 3\n"
    assert score("def apply(f, x):\n    return f(x)\n", tests) == 1.0
    peek = "def apply(f, x):\n    f.__globals__['__builtins__']\n    return 3\n"
    assert score(peek, tests) == 0.0  # the judge's objects are out of reach


@pytest.mark.parametrize("mode", MODES, indirect=True)
def test_the_candidate_cannot_read_the_tests(mode):
    code = dedent("""\
        import gc, sys
        texts, frame = [], sys._getframe()
        while frame is not None:
            texts += [v for v in list(frame.f_locals.values()) if isinstance(v, str)]
            frame = frame.f_back
        for value in gc.get_objects():
            if isinstance(value, dict):
                texts += [v for v in list(value.values()) if isinstance(v, str)]
        seen = any('secret-' + 'expectation' in text for text in texts)
        def answer():
            return 42 if seen else 0
        """)
    assert score(code, "assert answer() == 0  # secret-expectation\n") == 1.0


HONEST = dedent("""\
    from collections import Counter, defaultdict, namedtuple
    class Stack:
        def __init__(self):
            self.items = []
        def push(self, x):
            self.items.append(x)
        def pop(self):
            return self.items.pop()
        def __len__(self):
            return len(self.items)
    def squares(n):
        for i in range(n):
            yield i * i
    def sort_in_place(xs):
        xs.sort()
    def fill(grid):
        for row in grid:
            row[:] = [5] * len(row)
    def positive(x):
        if x < 0:
            raise ValueError('negative')
        return x
    def count(s):
        return Counter(s)
    def by_parity(xs):
        d = defaultdict(list)
        for x in xs:
            d[x % 2].append(x)
        return d
    Point = namedtuple('Point', 'x y')
    def origin():
        return Point(0, 0)
    def average(a, b):
        return (a + b) / 2
    calls = 0
    def bump():
        global calls
        calls += 1
    class Node:
        def __init__(self, value, rest=None):
            self.value, self.rest = value, rest
    def total(node):
        return 0 if node is None else node.value + total(node.rest)
    """)
HONEST_TESTS = dedent("""\
    s = Stack()
    s.push(1)
    s.push(2)
    assert len(s) == 2 and s.pop() == 2 and s.items == [1] and isinstance(s, Stack)
    assert list(squares(4)) == [0, 1, 4, 9] and sum(squares(3)) == 5
    xs = [3, 1, 2]
    sort_in_place(xs)
    assert xs == [1, 2, 3]
    grid = [[0, 0], [0, 0]]
    row = grid[0]
    fill(grid)
    assert grid == [[5, 5], [5, 5]] and row == [5, 5]
    try:
        positive(-1)
        raise AssertionError('no exception')
    except ValueError as e:
        assert 'negative' in str(e)
    assert count('aab') == {'a': 2, 'b': 1} and count('aab').most_common(1) == [('a', 2)]
    assert by_parity([1, 2, 3]) == {1: [1, 3], 0: [2]}
    assert origin() == (0, 0) and origin().x == 0
    assert average(2, 4) == 3 and average(1, 2) == 1.5
    bump()
    bump()
    assert calls == 2
    assert total(Node(1, Node(2, Node(3)))) == 6
    def test_operators():
        assert positive(3) + 1 == 4 and f'{positive(7)}' == '7'
        assert sorted({positive(2), positive(1)}) == [1, 2] and positive(2) in [1, 2]
    """)


@pytest.mark.parametrize("mode", MODES, indirect=True)
def test_honest_code_keeps_its_semantics_across_the_two_processes(mode):
    run = run_tests(HONEST, HONEST_TESTS, isolated=mode)
    assert run.passed, run.output


@pytest.mark.parametrize("returns,expected", [("True", "1"), ("1", "True"), ("(1,)", "[1]"),
                                               ("b'1'", "'1'"), ("1.0", "True")])
def test_equality_is_checked_by_type(returns, expected):
    """Python says True == 1, (1,) != [1] and b'1' != '1'; the checked == says all differ (an
    int and a float may still meet: 3 == 3.0)."""
    run = run_tests(f"def f():\n    return {returns}\n", f"assert f() == {expected}\n",
                    isolated=WHY_NOT is None)
    assert not run.passed, run.output
    run = run_tests("def f():\n    return 3\n", "assert f() == 3.0\n", isolated=WHY_NOT is None)
    assert run.passed, run.output


@pytest.mark.parametrize("mode", MODES, indirect=True)
def test_the_code_cannot_replace_the_builtins_or_modules_the_tests_use(mode):
    code = WRONG + dedent("""\
        import math
        math.isclose = lambda *args, **kwargs: True
        def all(values):
            return True
        def len(value):
            return 3
        """)
    assert score(code, "assert all(add(x, 1) == x + 1 for x in range(3))\n") == 0.0
    assert score(code, "assert len(str(add(100, 23))) == 3\n") == 0.0
    assert score(code, "import math\nassert math.isclose(add(1, 2), 3)\n") == 0.0
