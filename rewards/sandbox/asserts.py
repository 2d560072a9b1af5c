"""The tests' equality comparisons, rewritten so that a value that is not what it claims cannot
pass them (as pytest rewrites asserts). Standard library only: it runs inside the jail, in the
judge (`rewards.sandbox.judge`).

Every ``a == b`` of the tests (in an assert or anywhere else; a chain such as ``a == b == c``
is left as it is) becomes ``__homerl_eq__(a, b)``, and ``a != b`` its negation: false when one
side is a value of a built-in data type (None, bool, int, float, complex, str, bytes,
bytearray, list, tuple, dict, set, frozenset) and the other is not of that same type (an int
and a float excepted: ``3 == 3.0`` holds), else Python's ``a == b``. So an object whose
``__eq__`` always says yes, or a bool where the test wants 1, fails ``assert f(x) == 1``.
"""

import ast

EQ_NAME = "__homerl_eq__"
TESTS_FILE = "tests.py"
DATA_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray, list,
                        tuple, dict, set, frozenset})
NUMBERS = frozenset({int, float})


class _Rewrite(ast.NodeTransformer):
    def visit_Compare(self, node):
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            return node
        new = ast.Call(ast.Name(EQ_NAME, ast.Load()), [node.left, node.comparators[0]], [])
        if isinstance(node.ops[0], ast.NotEq):
            new = ast.UnaryOp(ast.Not(), new)
        return ast.copy_location(new, node)


def rewrite(source):
    """(the tests compiled with checked equality, the names of their top-level ``test...``
    functions in order)."""
    tree = ast.parse(source, TESTS_FILE)
    names = [node.name for node in tree.body
             if isinstance(node, ast.FunctionDef) and node.name.startswith("test")]
    tree = ast.fix_missing_locations(_Rewrite().visit(tree))
    return compile(tree, TESTS_FILE, "exec", dont_inherit=True), names


def make_eq(plain=lambda value: value):
    """The checked equality; `plain(value)` is the plain value a proxy stands for (the judge's
    view of a candidate's Counter or IntEnum), else the value itself."""

    def checked_eq(a, b):
        a, b = plain(a), plain(b)
        ta, tb = type(a), type(b)
        if ta is not tb and (ta in DATA_TYPES or tb in DATA_TYPES) \
                and not (ta in NUMBERS and tb in NUMBERS):
            return False
        return a == b

    return checked_eq
