"""The messages between the two processes of a python-tests run (`rewards.sandbox.harness`): the
judge, which runs the tests and alone can report a pass, and the candidate, which runs the
reply's code. Standard library only: it runs inside the jail.

A message is a 4-byte big-endian length and that many bytes of JSON, a list whose first item
names it: ``["op", name, args, kwargs]`` asks the other side to do something (`Peer.request`),
``["ok", value, after]`` or ``["raise", class names, text]`` answers it. The candidate's side is
written by code that may be hostile, so every read is bounded (`MAX_BYTES`) and checked: a
malformed message is a `ProtocolError`, which ends the run as a fail.

Values. Plain data crosses as a copy: None, bool, int, float, complex, str, bytes, bytearray,
and lists, tuples, dicts, sets and frozensets of values (a dict's keys and a set's members plain
data). Anything else crosses as a handle: a number that the receiver's proxy acts through,
each use a request to the side that owns the object (``["h", n]``; ``["r", n]`` hands a
receiver's own object back). From the candidate, an instance of a subclass of a data type (a
Counter, a namedtuple, an IntEnum) is a handle that also carries its plain value
(``["w", n, value]``); from the judge, an object that pickles (a date, a Fraction, `len`) also
carries its pickle (``["k", n, base64]``), which only the candidate ever loads.
"""

import base64
import builtins
import json
import os
import pickle

MAX_BYTES = 64 * 2**20
"""the longest message either side reads"""
MAX_DEPTH = 100
"""containers nested deeper cross as handles"""
MAX_NODES = 4_000_000
"""the most values one message may hold"""
DATA = (type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set,
        frozenset)
MUTABLE = (list, dict, set, bytearray)
_TAGS = {list: "l", tuple: "t", set: "s", frozenset: "f"}
_KINDS = {"l": list, "t": tuple, "s": set, "f": frozenset}
_PLAIN_COPY = {int: int.__index__, float: float.__float__, str: str.__str__,
               bytes: lambda v: bytes.__getitem__(v, slice(None)),
               complex: lambda v: complex(complex.__complex__(v)), list: list, tuple: tuple,
               dict: dict, set: set, frozenset: frozenset, bytearray: bytearray}


class ProtocolError(Exception):
    """A message that does not follow the protocol (the candidate's code wrote it)."""


class _NotPlain(Exception):
    """A value that must be plain data (a dict key, a set member) is not."""


class Codec:
    """Values to and from JSON for one side: `judge` True on the judge's side. `make_proxy(n)`
    makes this side's proxy of the other side's object n; `proxy_type` is its class."""

    def __init__(self, judge, proxy_type, make_proxy, make_view=None):
        self.judge, self.proxy_type = judge, proxy_type
        self.make_proxy, self.make_view = make_proxy, make_view
        self.mine, self._numbers, self._theirs = {}, {}, {}
        self._budget = 0

    def encode(self, value):
        self._budget = MAX_NODES
        return self._enc(value, 0, False, set())

    def decode(self, tree):
        self._budget = MAX_NODES
        try:
            return self._dec(tree, 0, False)
        except (TypeError, ValueError, KeyError, IndexError, RecursionError) as e:
            raise ProtocolError(f"bad value: {type(e).__name__}") from None

    def export(self, value):
        """The number the other side knows this side's object `value` by."""
        number = self._numbers.get(id(value))
        if number is None:
            number = self._numbers[id(value)] = len(self.mine)
            self.mine[number] = value  # kept alive: its id stays its own
        return number

    def _enc(self, value, depth, plain, path):
        self._budget -= 1
        if self._budget < 0:
            raise ValueError("a value too large to send")
        kind = type(value)
        if value is None or kind is bool or kind is str or kind is float:
            return value
        if kind is int:
            return value if -2**62 < value < 2**62 else ["i", format(value, "x")]
        if kind is complex:
            return ["c", value.real, value.imag]
        if kind is bytes or kind is bytearray:
            return ["b" if kind is bytes else "y", value.hex()]
        if isinstance(value, self.proxy_type):
            return ["r", value._number]
        if kind in (list, tuple, set, frozenset, dict) and depth < MAX_DEPTH \
                and id(value) not in path:
            path.add(id(value))
            try:
                return self._container(value, kind, depth, plain, path)
            except _NotPlain:
                if plain:
                    raise
            finally:
                path.discard(id(value))
        if plain:
            raise _NotPlain
        return self._other(value, depth, path)

    def _container(self, value, kind, depth, plain, path):
        if kind is dict:
            items = ["d"]
            for key, item in value.items():
                items.append(self._enc(key, depth + 1, True, path))
                items.append(self._enc(item, depth + 1, plain, path))
            return items
        member_plain = plain or kind is set or kind is frozenset
        return [_TAGS[kind], *(self._enc(v, depth + 1, member_plain, path) for v in value)]

    def _other(self, value, depth, path):
        """An object that is not plain data: a handle (with its pickle from the judge, its
        plain value from the candidate when it has one)."""
        number = self.export(value)
        if self.judge:
            try:
                return ["k", number, base64.b64encode(pickle.dumps(value, 4)).decode()]
            except Exception:  # noqa: BLE001 - whatever does not pickle crosses as a handle
                return ["h", number]
        base = next((b for b in type(value).__mro__ if b in _PLAIN_COPY), None)
        if base is not None:
            try:
                return ["w", number, self._enc(_PLAIN_COPY[base](value), depth + 1, True, path)]
            except Exception:  # noqa: BLE001 - the candidate's subclass may refuse a copy
                pass
        return ["h", number]

    def _dec(self, tree, depth, plain):
        self._budget -= 1
        kind = type(tree)
        if tree is None or kind is bool or kind is int or kind is float or kind is str:
            return tree
        if kind is not list or not tree or type(tree[0]) is not str or depth > MAX_DEPTH + 1 \
                or self._budget < 0:
            raise ProtocolError("bad value")
        tag, rest = tree[0], tree[1:]
        if tag in _KINDS:
            inner = plain or tag in "sf"
            return _KINDS[tag](self._dec(v, depth + 1, inner) for v in rest)
        if tag == "d":
            keys = [self._dec(k, depth + 1, True) for k in rest[0::2]]
            values = [self._dec(v, depth + 1, plain) for v in rest[1::2]]
            if len(keys) != len(values):
                raise ProtocolError("bad dict")
            return dict(zip(keys, values))
        return self._dec_scalar(tag, rest, depth, plain)

    def _dec_scalar(self, tag, rest, depth, plain):
        if tag == "i" and type(rest[0]) is str:
            return int(rest[0], 16)
        if tag == "c" and all(type(x) in (int, float) for x in rest[:2]):
            return complex(rest[0], rest[1])
        if tag in "by" and type(rest[0]) is str:
            return (bytes if tag == "b" else bytearray).fromhex(rest[0])
        number = rest[0]
        if type(number) is not int:
            raise ProtocolError("bad handle")
        if tag == "r":
            return self.mine[number]
        if plain:
            raise ProtocolError("a handle where plain data must be")
        if tag == "h" or (tag == "w" and rest[1] is None):
            return self._proxy(number)
        if tag == "w" and self.judge and self.make_view is not None:
            return self._theirs.setdefault(
                number, self.make_view(number, self._dec(rest[1], depth + 1, True)))
        if tag == "k" and not self.judge and type(rest[1]) is str:
            try:
                return pickle.loads(base64.b64decode(rest[1]))
            except Exception:  # noqa: BLE001 - not loadable here: call it through the judge
                return self._proxy(number)
        raise ProtocolError(f"bad tag {tag!r}")

    def _proxy(self, number):
        proxy = self._theirs.get(number)
        if proxy is None:
            proxy = self._theirs[number] = self.make_proxy(number)
        return proxy


def rebuild(names, text):
    """The exception to raise for the other side's ["raise", names, text]: the first built-in
    exception class among `names` (its class and bases, in order)."""
    if type(names) is not list or type(text) is not str:
        raise ProtocolError("bad raise")
    for name in names:
        cls = getattr(builtins, name, None) if type(name) is str else None
        if isinstance(cls, type) and issubclass(cls, BaseException):
            try:
                return cls(text) if text else cls()
            except Exception:  # noqa: BLE001 - a class that takes other arguments: its base
                continue
    return Exception(text)


def describe(exc):
    """["raise", class names, text] for an exception raised while serving a request."""
    try:
        text = str(exc)[:2000]
    except Exception:  # noqa: BLE001 - the candidate's exception may refuse str()
        text = ""
    return ["raise", [c.__name__ for c in type(exc).__mro__], text]


def update_in_place(orig, new):
    """Make `orig` (a list, dict, set or bytearray) hold `new`'s contents, keeping nested
    containers of the same kind (a list of rows) as the same objects."""
    if type(orig) is list:
        if len(orig) != len(new):
            orig[:] = new
            return
        for i, (old, value) in enumerate(zip(orig, new)):
            if type(old) is type(value) and type(old) in MUTABLE:
                update_in_place(old, value)
            else:
                orig[i] = value
    elif type(orig) is dict:
        for key in [k for k in orig if k not in new]:
            del orig[key]
        for key, value in new.items():
            old = orig.get(key)
            if type(old) is type(value) and type(old) in MUTABLE and old is not orig:
                update_in_place(old, value)
            else:
                orig[key] = value
    elif type(orig) is set:
        orig.clear()
        orig.update(new)
    else:
        orig[:] = new


def frame(message):
    """A message's bytes on the pipe."""
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_BYTES:
        raise ValueError("a message too large to send")
    return len(data).to_bytes(4, "big") + data


def _read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the other process of the run is gone")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class Peer:
    """One side's end of the two pipes: send and receive messages, make requests (serving the
    other side's nested requests meanwhile) and serve them with `ops` (name -> function)."""

    def __init__(self, rfd, wfd, codec, ops):
        self.rfd, self.wfd, self.codec, self.ops = rfd, wfd, codec, ops

    def send(self, message):
        view = memoryview(frame(message))
        while view:
            view = view[os.write(self.wfd, view):]

    def recv(self):
        size = int.from_bytes(_read_exact(self.rfd, 4), "big")
        if size > MAX_BYTES:
            raise ProtocolError("message too long")
        try:
            message = json.loads(_read_exact(self.rfd, size))
        except (ValueError, RecursionError) as e:
            raise ProtocolError(f"bad message: {type(e).__name__}") from None
        if type(message) is not list or not message or type(message[0]) is not str:
            raise ProtocolError("bad message")
        return message

    def request(self, name, *args, **kwargs):
        """Ask the other side to do `name` with these arguments; its answer, or its exception
        raised here as the nearest built-in one."""
        self.send(["op", name, self.codec.encode(list(args)), self.codec.encode(kwargs)])
        while True:
            message = self.recv()
            if message[0] == "op":
                self.serve(message)
            elif message[0] == "ok" and len(message) == 3:
                result = self.codec.decode(message[1])
                self._sync(args, message[2])
                return result
            elif message[0] == "raise" and len(message) == 3:
                raise rebuild(message[1], message[2])
            else:
                raise ProtocolError(f"unexpected message {message[0]!r}")

    def serve(self, message):
        """Do what request `message` asks and send the answer."""
        try:
            if len(message) != 4 or type(message[1]) is not str or message[1] not in self.ops:
                raise PermissionError(f"no such request: {str(message[1:2])[:80]}")
            args, kwargs = self.codec.decode(message[2]), self.codec.decode(message[3])
            if type(args) is not list or type(kwargs) is not dict \
                    or not all(type(k) is str for k in kwargs):
                raise ProtocolError("bad arguments")
            result = self.ops[message[1]](*args, **kwargs)
            reply = ["ok", self.codec.encode(result), self._changed(args, message[2][1:])]
        except ProtocolError:
            raise
        except BaseException as e:  # noqa: BLE001 - the answer is the exception, whatever it is
            reply = describe(e)
        self.send(reply)

    def _changed(self, args, sent):
        """For each argument: its value now where it is a list, dict, set or bytearray that the
        request changed (sorted in place, say), else None."""
        after = []
        for arg, was in zip(args, sent):
            now = self.codec.encode(arg) if type(arg) in MUTABLE else None
            after.append(None if now == was else now)
        return after

    def loop(self, after=lambda: None):
        """Serve requests until the other side says ["exit"], calling `after()` after each."""
        while True:
            message = self.recv()
            if message[0] == "exit":
                return
            if message[0] != "op":
                raise ProtocolError(f"unexpected message {message[0]!r}")
            self.serve(message)
            after()

    def _sync(self, args, after):
        """The other side changed arguments of ours in place (a list it sorted): so here."""
        if type(after) is not list:
            raise ProtocolError("bad reply")
        for orig, new in zip(args, after):
            if new is not None and type(orig) in MUTABLE:
                value = self.codec.decode(new)
                if type(value) is type(orig):
                    update_in_place(orig, value)
