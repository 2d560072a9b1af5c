"""The candidate: the process of a python-tests run that runs the reply's code
(`rewards.sandbox.harness` forks it). Standard library only: it runs inside the jail.

It holds neither the tests nor the nonce nor the report descriptor: the judge forked it before
reading them. It gets the code (``["code", source, processes]``), caps its processes, runs the
code as module ``solution``, says ``["ready", pid, names]`` and then answers the judge's requests
on the module's objects (`OPS`: call, attributes, items, operators, ...) until ``["exit"]``.
Whatever the code does here (forge messages, exit, close descriptors, kill its parent) can at
most make the judge's requests fail.
"""

import builtins
import linecache
import operator
import os
import resource
import sys
import traceback

from rewards.sandbox import wire


class JudgeProxy:
    """One of the judge's objects that did not pickle (a function of the tests): it can only be
    called, and the judge calls only what the tests defined."""

    __slots__ = ("_number", "_peer")

    def __init__(self, peer, number):
        self._peer, self._number = peer, number

    def __call__(self, *args, **kwargs):
        return self._peer.request("call", self, *args, **kwargs)

    def __repr__(self):
        return f"<a callable of the tests #{self._number}>"


def _call(function, *args, **kwargs):
    return function(*args, **kwargs)


def _text(convert):
    return lambda value: str.__str__(convert(value))


OPS = {name: getattr(operator, name) for name in (
    "getitem", "setitem", "delitem", "contains", "lt", "le", "gt", "ge", "eq", "ne", "add",
    "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_", "xor",
    "lshift", "rshift", "neg", "pos", "invert", "index")}
OPS.update(call=_call, getattr=getattr, setattr=setattr, delattr=delattr, len=len, iter=iter,
           next=next, bool=bool, str=_text(str), repr=_text(repr), int=int, float=float,
           abs=abs, reversed=reversed, format=format, divmod=divmod, round=round, hash=hash,
           isinstance=isinstance, issubclass=issubclass)


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - the code may have closed or replaced them
            pass


def _limit_processes(processes):
    """RLIMIT_NPROC here, not before the fork: unisolated, the user's other processes count."""
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    if hard != resource.RLIM_INFINITY:
        processes = min(processes, hard)
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def main(rfd, wfd):
    """Run the code and serve the judge; never returns."""
    status = 1
    try:
        namespace = {"__name__": "solution", "__builtins__": builtins}
        peer = wire.Peer(rfd, wfd, None, dict(OPS, **{"global": namespace.__getitem__}))
        peer.codec = wire.Codec(False, JudgeProxy, lambda n: JudgeProxy(peer, n))
        kind, code, processes = peer.recv()
        if kind != "code" or type(code) is not str or type(processes) is not int:
            raise wire.ProtocolError("expected the code")
        _limit_processes(processes)
        linecache.cache["solution.py"] = (len(code), None, code.splitlines(True), "solution.py")
        exec(compile(code, "solution.py", "exec", dont_inherit=True), namespace)
        _flush()  # what it printed is in the output even if the judge ends the run
        peer.send(["ready", os.getpid(), [k for k in namespace if type(k) is str]])
        peer.loop(after=_flush)
        status = 0
    except BaseException:  # noqa: BLE001 - the code's failure: say it, and end
        traceback.print_exc()
    _flush()
    os._exit(status)
