"""The judge: the process of a python-tests run that runs the tests against the candidate's
code and alone can report a pass (`rewards.sandbox.harness`). Standard library only: it runs
inside the jail.

The tests run here, in a namespace where each name the tests use but do not define and the
reply's module does is the candidate's object: plain data as a copy, anything else a `Remote`
whose every use (a call, an attribute, an operator) is a request to the candidate, with plain
data and further handles back (`rewards.sandbox.wire`). The candidate's code never runs in this
process, so it cannot reach the nonce, the report descriptor or the tests' own objects; an
object of the candidate's never equals a value of a built-in data type (`Remote.__eq__`), and
the tests' ``==`` is checked (`rewards.sandbox.asserts`).

What differs from running the tests in the reply's module: values of built-in data types
cross as copies (a list the code changes in place while it runs is copied back; one it keeps
and changes later is not), and the candidate can only call, never inspect, a function or an
instance that the tests defined.
"""

import builtins
import linecache
import os
import types

from rewards.sandbox import asserts, wire


def _ask(op):
    return lambda self, *args: self._peer.request(op, self, *args)


def _ask_reflected(op):
    return lambda self, other: self._peer.request(op, other, self)


class Remote:
    """One of the candidate's objects."""

    __slots__ = ("_number", "_peer", "__weakref__")

    def __init__(self, peer, number):
        object.__setattr__(self, "_peer", peer)
        object.__setattr__(self, "_number", number)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") or name in Remote.__slots__:
            raise AttributeError(name)  # Python's own probes (copy, pickle) stay here
        return self._peer.request("getattr", self, name)

    def __setattr__(self, name, value):
        self._peer.request("setattr", self, name, value)

    def __delattr__(self, name):
        self._peer.request("delattr", self, name)

    def __call__(self, *args, **kwargs):
        return self._peer.request("call", self, *args, **kwargs)

    def __eq__(self, other):
        return self._compare("eq", other)

    def __ne__(self, other):
        return self._compare("ne", other)

    def _compare(self, op, other):
        if type(other) in asserts.DATA_TYPES:
            return NotImplemented  # never equal to plain data: the candidate is not asked
        return self._peer.request(op, self, other)

    def __hash__(self):
        return self._peer.request("hash", self)

    def __instancecheck__(self, value):
        return self._peer.request("isinstance", value, self)

    def __subclasscheck__(self, cls):
        return self._peer.request("issubclass", cls, self)

    def __reduce_ex__(self, protocol):
        raise TypeError("an object of the candidate's does not pickle")


for _name in ("len", "iter", "next", "bool", "str", "repr", "int", "float", "index", "neg",
              "pos", "abs", "invert", "reversed", "getitem", "setitem", "delitem", "contains",
              "lt", "le", "gt", "ge", "format", "round", "divmod"):
    setattr(Remote, f"__{_name}__", _ask(_name))
for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
              "or", "xor", "lshift", "rshift"):
    _op = _name + "_" if _name in ("and", "or") else _name
    setattr(Remote, f"__{_name}__", _ask(_op))
    setattr(Remote, f"__r{_name}__", _ask_reflected(_op))


class RemoteValue(Remote):
    """A candidate's instance of a subclass of a data type (a Counter, a namedtuple): a Remote
    that equals what its plain value equals."""

    __slots__ = ("_plain",)

    def __init__(self, peer, number, plain):
        super().__init__(peer, number)
        object.__setattr__(self, "_plain", plain)

    def _compare(self, op, other):
        if isinstance(other, Remote):
            return self._peer.request(op, self, other)
        return self._plain == other if op == "eq" else self._plain != other

    def __hash__(self):
        try:
            return hash(self._plain)
        except TypeError:
            return self._peer.request("hash", self)


def plain(value):
    """The plain value a RemoteValue stands for; any other value itself."""
    return value._plain if type(value) is RemoteValue else value


def _served(function):
    """Whether the candidate may call this object of the judge's: a function, method or class
    that the tests defined, never anything else (a builtin would reach this process's files)."""
    if isinstance(function, types.MethodType):
        function = function.__func__
    if isinstance(function, types.FunctionType):
        return function.__code__.co_filename == asserts.TESTS_FILE
    return isinstance(function, type) and function.__module__ == "solution" \
        and not issubclass(function, BaseException)


def _call(function, *args, **kwargs):
    if not _served(function):
        raise PermissionError("the candidate may call only what the tests defined")
    return function(*args, **kwargs)


class Names(dict):
    """The tests' module namespace: a name it lacks that the reply's module defined is fetched
    from the candidate (a handle once, plain data at each use: it may change), unless it is a
    builtin's (the tests' `len` or `all` stays Python's, whatever the code calls its own)."""

    def __init__(self, peer, candidate_names):
        super().__init__(__name__="solution", __builtins__=builtins,
                         **{asserts.EQ_NAME: asserts.make_eq(plain)})
        self._peer = peer
        self._candidate = frozenset(candidate_names) - frozenset(dir(builtins))

    def __missing__(self, name):
        if name not in self._candidate:
            raise KeyError(name)
        value = self._peer.request("global", name)
        if type(value) is Remote:
            self[name] = value
        return value


def connect(rfd, wfd):
    """The judge's end of the pipes to the candidate."""
    peer = wire.Peer(rfd, wfd, None, {"call": _call})
    peer.codec = wire.Codec(True, Remote, lambda n: Remote(peer, n),
                            lambda n, value: RemoteValue(peer, n, value))
    return peer


def judge(peer, code, tests, processes, child):
    """Send the code, run the tests against it; True only when every one passed and the
    candidate's process (pid `child`) lived to the end and then exited cleanly. The tests'
    exceptions propagate."""
    compiled, test_names = asserts.rewrite(tests)
    linecache.cache[asserts.TESTS_FILE] = (len(tests), None, tests.splitlines(True),
                                           asserts.TESTS_FILE)  # its lines in tracebacks
    peer.send(["code", code, processes])
    ready = peer.recv()
    if len(ready) != 3 or ready[0] != "ready" or ready[1] != child \
            or type(ready[2]) is not list or not all(type(n) is str for n in ready[2]):
        raise wire.ProtocolError("the candidate's process did not say it is ready")
    names = Names(peer, ready[2])
    exec(compiled, names)
    for name in test_names:
        names[name]()
    done, _ = os.waitpid(child, os.WNOHANG)
    if done:
        print("python-tests: the candidate's process ended before the tests did", flush=True)
        return False
    peer.send(["exit"])
    _, status = os.waitpid(child, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
