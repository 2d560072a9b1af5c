"""A user's reward functions in TRL's convention (`reward.fn`), so TRL users' functions work
unchanged. Pure parts only: loading, the call's keyword arguments, checking what a function
returned, and combining the functions' rewards; `rewards.sandbox` runs the calls in the verifier
process, `rewards.fnbatch` drives them for a rollout.

    def reward_len(completions, **kwargs):          # plain prompts: completions are strings
        return [-abs(20 - len(c)) / 20 for c in completions]

    def reward_len(completions, **kwargs):          # chat prompts: one assistant message each
        return [-abs(20 - len(c[0]["content"])) / 20 for c in completions]

A function is named `package.module:function` and called once per rollout call (one worker's
share of a step: N completions, G per prompt, prompt-major) with keyword arguments, as TRL's
`GRPOTrainer._calculate_rewards` calls it:

    prompts         (N,) the dataset's prompt of each completion: its text, or for a chat
                    sample its messages [{"role", "content"}, ...] as the dataset holds them
    completions     (N,) the completion text; for a chat sample [{"role": "assistant",
                    "content": text}]
    completion_ids  (N,) the completion's token ids (a list of ints)
    <column>        (N,) every column of the sample's dataset row but the prompt (`answer`
                    when it is a column); a built-in task's samples have `answer` alone
    trainer_state   `TrainerState`: global_step (the policy version that sampled them),
                    max_steps (run.steps)
    log_metric      log_metric(name, value): the step's mean of the values is logged as
                    `reward/logged/<name>`
    log_extra       log_extra(column, values): accepted and ignored

It returns one reward per completion (a list, or any iterable: a generator is consumed in the
call, so what it raises is the function's `fn_error`): a number, or None where it does not apply
(NaN). Anything else (the wrong length, text, a value that is not finite as a float32, the
rewards' dtype: inf, 1e39) is `fn_bad_output`. A weighted sum that is not finite (float32
overflow of weight x reward) is caught after `combine` (`overflowed`).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import os
import sys
import traceback
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from rewards.byvalue import digest, is_by_value, unpack
from rewards.result import FN_BAD_OUTPUT, FN_ERROR

RESERVED = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_extra",
                      "log_metric"})
"""keyword arguments the trainer passes itself: a dataset column of one of these names is not
passed (TRL would fail on it with a duplicate argument)"""


@dataclass(frozen=True)
class TrainerState:
    """What a reward function gets as `trainer_state`: the few fields of transformers'
    TrainerState that this trainer knows when the completions are scored."""

    global_step: int
    """the policy version that sampled the completions (the learner's step count)"""
    max_steps: int
    """the run's steps (run.steps)"""


@dataclass(frozen=True)
class FnCall:
    """The message that asks the verifier process to call function `spec` (`kwargs` None:
    only import it, to check the spec)."""

    spec: str
    kwargs: dict | None
    code: bytes | None = None
    """a `by-value:` function's packed bytes (`rewards.byvalue`); None: import `spec`"""


@dataclass(frozen=True)
class FnOutcome:
    """What one call of a reward function gave."""

    scores: list[float | None]
    """(N,) its rewards, None where not applicable; empty when the call failed"""
    error: str | None = None
    """fn_error, fn_timeout, fn_bad_output or out_of_memory; None: the call went fine"""
    why: str = ""
    """one line saying what went wrong"""
    trace: str = ""
    """the traceback of an exception, when there was one"""
    logged: dict[str, list[float]] = field(default_factory=dict)
    """log_metric's values by name"""


def failed(code: str, why: str, trace: str = "") -> FnOutcome:
    return FnOutcome([], code, why, trace)


class LoadError(Exception):
    """A spec that cannot be loaded; the message is one line."""


_LOADED: dict[str, object] = {}
"""the functions this process has imported, by spec"""


def load_fn(spec: str, code: bytes | None = None):
    """The callable named by `spec` ("package.module:function"), imported once per process with
    the current working directory on sys.path (last: it never shadows an installed package);
    with `code`, the function packed in those bytes (`rewards.byvalue`), unpacked once per
    process. LoadError saying why in one line."""
    if code is not None:
        return _unpacked(spec, code)
    if is_by_value(spec):
        raise LoadError(f"{spec}: its packed bytes did not reach the verifier process")
    if spec in _LOADED:
        return _LOADED[spec]
    module_name, _, attr = spec.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):  # a parent package that is missing
        found = None
    if found is None:
        raise LoadError(f"module {module_name} not found (cwd {cwd}; is it on PYTHONPATH?)")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises, said in one line
        raise LoadError(f"importing {module_name} failed: {one_line(e)}") from e
    fn = getattr(module, attr, None)
    if fn is None:
        raise LoadError(f"module {module_name} ({module.__file__}) has no function {attr}")
    if not callable(fn):
        raise LoadError(f"{module_name}.{attr} is a {type(fn).__name__}, not a function")
    _LOADED[spec] = fn
    return fn


def _unpacked(spec: str, code: bytes):
    """The function packed in `code`, cached by its digest (a resumed run may pack new code
    under the same name)."""
    key = f"{spec}@{digest(code)}"
    if key not in _LOADED:
        try:
            fn = unpack(code)
        except Exception as e:  # noqa: BLE001 - a module it needs may be missing here
            raise LoadError(f"unpacking {spec} failed: {one_line(e)}") from e
        if not callable(fn):
            raise LoadError(f"{spec} is a {type(fn).__name__}, not a function")
        _LOADED[key] = fn
    return _LOADED[key]


def one_line(e: BaseException) -> str:
    """`Type: first line of the message` of an exception."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def float32(value: float) -> float:
    """`value` as the rewards' float32 holds it (inf beyond +-3.4e38), without numpy's
    overflow warning."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def run_call(call: FnCall) -> FnOutcome:
    """Load and call `call.spec` with `call.kwargs` plus the logging callables (in the verifier
    process). Every fault of the function is an outcome, never an exception, but MemoryError,
    which the verifier process handles (it is replaced)."""
    try:
        fn = load_fn(call.spec, call.code)
    except LoadError as e:
        return failed(FN_ERROR, str(e), traceback.format_exc())
    if call.kwargs is None:
        return FnOutcome([])
    logged: dict[str, list[float]] = defaultdict(list)

    def log_metric(name: str, value: float) -> None:
        value = float(value)
        if math.isfinite(value):
            logged[str(name)].append(value)

    def log_extra(column: str, values: list) -> None:  # TRL's completions table: none here
        return None

    try:  # all of the user's code: the call, its coroutine, its generator, its numbers
        out = fn(**call.kwargs, log_metric=log_metric, log_extra=log_extra)
        if inspect.iscoroutine(out):  # an async reward function, as TRL allows
            out = asyncio.run(out)
        scores, why = as_scores(out, len(call.kwargs["completions"]))
    except MemoryError:
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's code: reward 0, counted
        return failed(FN_ERROR, one_line(e), traceback.format_exc())
    if scores is None:
        return failed(FN_BAD_OUTPUT, why)
    return FnOutcome(scores, logged=dict(logged))


def as_scores(out: object, n: int) -> tuple[list[float | None] | None, str]:
    """(n,) rewards of a function's output: numbers (bools, numpy and 0-d tensors too) as
    floats, None and NaN as None; (None, why) for anything else, a number that is not finite
    as a float32 included. What the output's own code raises (a generator's) propagates: the
    caller makes it the function's fn_error."""
    try:
        it = None if isinstance(out, (str, bytes, dict)) else iter(out)  # type: ignore
    except TypeError:  # not iterable (a number, a 0-d array)
        it = None
    if it is None:
        return None, f"returned a {type(out).__name__}, not a list of rewards"
    items = list(it)  # outside the try: a generator's TypeError is its own, not "not iterable"
    if len(items) != n:
        return None, f"returned {len(items)} rewards for {n} completions"
    scores: list[float | None] = []
    for i, x in enumerate(items):
        try:
            value = None if x is None or isinstance(x, (str, bytes)) else float(x)
        except (TypeError, ValueError):
            value = None
        if value is None and x is not None:
            return None, f"reward {i} is a {type(x).__name__}, not a number or None"
        if value is not None and math.isinf(value):
            return None, f"reward {i} is {value}"
        if value is not None and math.isinf(float32(value)):  # finite as a float64 only
            return None, f"reward {i} is {value:g}, not finite as a float32 (the rewards' dtype)"
        scores.append(None if value is None or math.isnan(value) else value)
    return scores, ""


def batch_kwargs(samples: list[dict], texts: list[str], completion_ids: list,
                 state: TrainerState) -> dict:
    """The keyword arguments of one call (the module docstring): completion i answers sample
    `samples[i]` (each prompt's sample repeated G times, as its completions are)."""
    if not len(samples) == len(texts) == len(completion_ids):
        raise ValueError(f"{len(samples)} samples, {len(texts)} texts and "
                         f"{len(completion_ids)} completion_ids")
    prompts = [s["messages"] if "messages" in s else s["question"] for s in samples]
    completions = [[{"role": "assistant", "content": t}] if "messages" in s else t
                   for s, t in zip(samples, texts)]
    return {**sample_columns(samples), "prompts": prompts, "completions": completions,
            "completion_ids": [[int(t) for t in ids] for ids in completion_ids],
            "trainer_state": state}


def sample_columns(samples: list[dict]) -> dict[str, list]:
    """{column: (N,) values}: every column any sample's row has (None where a row lacks it),
    in first-seen order; a sample without "columns" (a built-in task's) has `answer` alone."""
    rows = [s["columns"] if "columns" in s else {"answer": s.get("answer")} for s in samples]
    names = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in RESERVED]
    return {k: [r.get(k) for r in rows] for k in names}


def fn_names(specs: list[str]) -> list[str]:
    """A metric name per spec: the function's name (a built-in verifier's own), made unique
    with a suffix: `a:score,b:score` -> score, score_2."""
    names: list[str] = []
    for spec in specs:
        base = spec.rpartition(":")[2]
        name, k = base, 2
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.append(name)
    return names


def combine(scores: np.ndarray, weights: list[float]) -> np.ndarray:
    """(N, F) rewards of F functions (NaN: not applicable) and their (F,) weights -> (N,)
    weighted sums over the applicable ones (TRL's nansum); NaN where no function applied (an
    unscorable completion: `learner.advantages` leaves it out of its group's baseline). A sum
    that overflows float32 is inf or NaN here: `overflowed` tells it from an unscorable one."""
    s = np.asarray(scores, dtype=np.float32).reshape(len(scores), len(weights))   # (N, F)
    w = np.asarray(weights, dtype=np.float32)                                        # (F,)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow: `overflowed` finds it
        total = np.nansum(s * w[None, :], axis=1)                                    # (N,)
    return np.where(np.isnan(s).all(axis=1), np.float32(np.nan), total).astype(np.float32)


def overflowed(scores: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """(N,) bool: the `combine` sums of (N, F) `scores` that are not finite although some
    function applied (float32 overflow of weight x reward, or inf - inf): not the NaN of an
    unscorable completion, a bad output (the caller gives it 0, counted as fn_bad_output)."""
    applied = ~np.isnan(np.asarray(scores, dtype=np.float32)).all(axis=1)            # (N,)
    return applied & ~np.isfinite(np.asarray(totals, dtype=np.float32))             # (N,)
