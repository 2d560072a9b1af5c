"""Reward functions by value: a callable defined in a script's `__main__`, a notebook cell, a
closure or a lambda, which no other process can import by name.

`homerl.GRPOTrainer` packs each such function (`pack`: cloudpickle, as Ray ships a task's
function) into the run directory as `reward_fns/<name>.pkl` and names it in `reward.fn` as
`by-value:<name>`. The driver reads the bytes (`launch/rundir/reward_code.py`) and hands them to
every rollout worker, whose verifier process unpacks the function (`unpack`) and calls it with
exactly the limits of a `module:function` (own process, `reward.fn_timeout_s`, memory cap,
errors counted). Unpacking runs the pickle's code: a run directory's `reward_fns/` is trusted
as its `module:function` specs are, and the web app refuses such runs.

The function's own module is packed by value too when a fresh process could not import it by
name (`__main__`, a notebook, a file outside the installed packages), so a script's helper
module travels with it; installed packages (numpy, math_verify, ...) are imported by name.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import sysconfig

import cloudpickle

PREFIX = "by-value:"
"""how `reward.fn` names a function packed by value: `by-value:<name>`"""
NAME = re.compile(r"^[A-Za-z_]\w*$")
"""a packed function's name (a file name in the run's reward_fns/ folder)"""


def spec_of(name: str) -> str:
    """The `reward.fn` spec of the function packed as `name`."""
    if not NAME.match(name):
        raise ValueError(f"{name!r} is not a reward function name (letters, digits, _)")
    return PREFIX + name


def is_by_value(spec: str) -> bool:
    return spec.startswith(PREFIX)


def name_of(spec: str) -> str:
    """`reward_len` of `by-value:reward_len`."""
    return spec.removeprefix(PREFIX)


def _installed(module) -> bool:
    """Whether a fresh process imports `module` by name: the standard library or an installed
    package (under one of the interpreter's install paths), never `__main__` or a script's own
    file."""
    path = getattr(module, "__file__", None)
    if module is None or module.__name__ == "__main__" or not path:
        return module is not None and module.__name__ in sys.builtin_module_names
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    real = os.path.realpath(path)
    return any(real.startswith(os.path.realpath(r) + os.sep) for r in roots)


def pack(fn) -> bytes:
    """`fn` as bytes another process of this Python can `unpack`. TypeError (one line) for
    something that is not callable or cannot be pickled (a function holding a lock, a file or
    a model: build those inside the function)."""
    if not callable(fn):
        raise TypeError(f"a reward function must be callable; got a {type(fn).__name__}")
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    by_value = module is not None and module.__name__ != "__main__" and not _installed(module)
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - whatever the closure holds, said in one line
        first = (str(e).strip().splitlines() or [""])[0]
        raise TypeError(f"reward function {getattr(fn, '__name__', fn)!r} cannot be sent to "
                        f"the verifier processes: {type(e).__name__}: {first}") from None
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


def digest(blob: bytes) -> str:
    """A short name for packed bytes (what a verifier process caches an unpacked function by)."""
    return hashlib.sha256(blob).hexdigest()[:16]


def unpack(blob: bytes):
    """The function `pack` made `blob` of. Runs the pickle's code: trusted input only."""
    return cloudpickle.loads(blob)
