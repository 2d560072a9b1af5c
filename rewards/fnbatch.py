"""Rewarding a rollout with `reward.fn`: each function (a user's, in TRL's convention, or a
built-in verifier by name) scores the call's N completions in the verifier process, and the
reward is their weighted sum (`rewards.userfns.combine`).

- A user's function is called once per rollout call (`VerifierPool.call_fn`), with the deadline
  `reward.fn_timeout_s`. A call that raises (its generator too), overruns, runs out of memory
  or returns something else than one number (or None) per completion, finite as a float32,
  gives that function reward 0 on the call's completions, counted under its error code once
  per completion (`reward/error_<code>`); the first failure of each function is logged in the
  worker's log with its traceback.
- A completion whose weighted sum is not finite (float32 overflow of weight x reward) gets
  reward 0, counted as fn_bad_output once; the first is logged. No reward leaves here as inf,
  and NaN only for an unscorable completion.
- A built-in verifier named in `reward.fn` scores 0/1 against each sample's reference, with the
  answer style it asks for; None (not applicable) for a sample without a reference. Where the
  sample's own verifier is that one, its result is reused.
- The sample's own verifier still checks every completion that has a reference
  (`verify_samples`), for `reward/correct`, `reward/format` and the error counts; it adds
  nothing to the reward unless it is named in `reward.fn`, and no format bonus applies.

The driver checks the specs before any actor starts (`check_reward_fns`), importing them in a
throwaway verifier process, never in its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from common.validate import ConfigError
from rewards.result import FN_BAD_OUTPUT, RewardResult
from rewards.sandbox.pool import VerifierPool
from rewards.userfns import (
    FnOutcome,
    TrainerState,
    batch_kwargs,
    combine,
    fn_names,
    overflowed,
)
from rewards.verifiers.registry import VERIFIERS

log = logging.getLogger("homerl.rewards")

NO_REFERENCE = RewardResult(0.0, 0.0, None, None)
"""the result of a sample with no reference: nothing to check, no error"""
SUM = "<weighted sum>"
"""`RewardFns.reported`'s entry for a weighted sum that was not finite (not a function name)"""


@dataclass(frozen=True)
class FnScores:
    """What `reward.fn` made of one rollout call's N completions."""

    rewards: np.ndarray
    """(N,) the weighted sum of the functions' rewards; NaN where none applied (unscorable)"""
    per_fn: dict[str, list[float | None]]
    """{function name: (N,) its rewards}, None where it did not apply, 0.0 where it failed"""
    errors: dict[str, int]
    """{error code: completions that got it}, summed over the functions"""
    logged: dict[str, list[float]]
    """the functions' log_metric values by name"""


def has_reference(sample: dict) -> bool:
    return bool(str(sample.get("answer", "")).strip())


def verify_samples(pool, samples: list[dict], texts: list[str],
                   timeout_s: float) -> list[RewardResult]:
    """(N,) each completion checked by its sample's verifier, `NO_REFERENCE` for a sample
    without a reference (a dataset scored by reward functions alone)."""
    todo = [i for i, s in enumerate(samples) if has_reference(s)]
    got = pool.score([texts[i] for i in todo], [samples[i]["answer"] for i in todo],
                     timeout_s=timeout_s, styles=[samples[i].get("style") for i in todo],
                     verifiers=[samples[i].get("verifier") for i in todo]) if todo else []
    out = [NO_REFERENCE] * len(samples)
    for i, result in zip(todo, got):
        out[i] = result
    return out


def builtin_scores(pool, name: str, samples: list[dict], texts: list[str],
                   verified: list[RewardResult], timeout_s: float) -> list[float | None]:
    """(N,) verifier `name`'s 0/1 scores as a reward function: None for a sample without a
    reference; `verified[i]` (the sample's own verifier's result) where that is `name`."""
    own = [(s.get("verifier") or "numeric") == name for s in samples]
    todo = [i for i, s in enumerate(samples) if has_reference(s) and not own[i]]
    got = pool.score([texts[i] for i in todo], [samples[i]["answer"] for i in todo],
                     timeout_s=timeout_s, styles=[samples[i].get("style") for i in todo],
                     verifiers=[name] * len(todo)) if todo else []
    out: list[float | None] = [v.score if o and has_reference(s) else None
                               for s, v, o in zip(samples, verified, own)]
    for i, result in zip(todo, got):
        out[i] = result.score
    return out


class RewardFns:
    """`reward.fn` of one rollout worker: its functions, weights and the failures it logged."""

    def __init__(self, specs: list[str], weights: list[float], timeout_s: float,
                 code: dict[str, bytes] | None = None):
        """`code`: {spec: packed bytes} of the `by-value:` specs (rewards/byvalue.py)."""
        if len(specs) != len(weights) or not specs:
            raise ValueError(f"{len(specs)} reward functions and {len(weights)} weights")
        self.specs, self.weights, self.timeout_s = list(specs), list(weights), timeout_s
        self.code = dict(code or {})
        self.names = fn_names(self.specs)
        self.reported: set[str] = set()
        """functions whose first failure is logged (each one's is logged once)"""

    @classmethod
    def of(cls, reward_cfg, code: dict[str, bytes] | None = None) -> RewardFns | None:
        """The functions of a `RewardConfig` (`code`: the packed bytes of its `by-value:`
        specs); None without `reward.fn` (verifier rewards)."""
        specs = reward_cfg.fns()
        return (cls(specs, reward_cfg.fn_weights(), reward_cfg.fn_timeout_s, code)
                if specs else None)

    def score(self, pool, samples: list[dict], texts: list[str], completion_ids: list,
              verified: list[RewardResult], state: TrainerState,
              verify_timeout_s: float) -> FnScores:
        """Score N completions (`samples[i]`: completion i's prompt sample; `verified`: each
        one's `verify_samples` result) with every function, in the verifier `pool`."""
        kwargs = batch_kwargs(samples, texts, completion_ids, state)
        per_fn: dict[str, list[float | None]] = {}
        errors: dict[str, int] = {}
        logged: dict[str, list[float]] = {}
        for name, spec in zip(self.names, self.specs):
            if spec in VERIFIERS:
                per_fn[name] = builtin_scores(pool, spec, samples, texts, verified,
                                              verify_timeout_s)
                continue
            outcome = pool.call_fn(spec, kwargs, self.timeout_s, self.code.get(spec))
            if outcome.error:
                self._report(name, spec, outcome, len(texts))
                errors[outcome.error] = errors.get(outcome.error, 0) + len(texts)
            per_fn[name] = outcome.scores if not outcome.error else [0.0] * len(texts)
            for key, values in outcome.logged.items():
                logged.setdefault(key, []).extend(values)
        table = np.array([[np.nan if v is None else v for v in col] for col in per_fn.values()],
                         dtype=np.float32).reshape(len(per_fn), len(texts)).T         # (N, F)
        rewards = combine(table, self.weights)                                          # (N,)
        bad = overflowed(table, rewards)                                                # (N,)
        if bad.any():  # each function's rewards are finite (as_scores), their sum is not
            rewards = np.where(bad, np.float32(0.0), rewards)
            errors[FN_BAD_OUTPUT] = errors.get(FN_BAD_OUTPUT, 0) + int(bad.sum())
            self._report_overflow(int(bad.sum()), len(texts))
        return FnScores(rewards, per_fn, errors, logged)

    def _report_overflow(self, k: int, n: int) -> None:
        """Log the first weighted sum that is not finite; later ones are only counted."""
        if SUM in self.reported:
            return
        self.reported.add(SUM)
        log.warning("the weighted sum of reward.fn's rewards is not finite as a float32 for %d "
                    "of %d completions (reward.weights %s too large for these rewards?): they "
                    "get 0, counted as reward/error_%s (later ones are only counted)", k, n,
                    ",".join(f"{w:g}" for w in self.weights), FN_BAD_OUTPUT)

    def _report(self, name: str, spec: str, outcome: FnOutcome, n: int) -> None:
        """Log a function's first failure, with its traceback; later ones are only counted."""
        if name in self.reported:
            return
        self.reported.add(name)
        log.warning("reward function %s (%s) failed on a batch of %d: %s: %s; it gives 0 "
                    "there, counted as reward/error_%s (later failures are only counted)%s",
                    name, spec, n, outcome.error, outcome.why, outcome.error,
                    "\n" + outcome.trace.rstrip() if outcome.trace else "")


def check_reward_fns(reward_cfg, code: dict[str, bytes] | None = None) -> None:
    """ConfigError, one line, naming each `reward.fn` spec that cannot be imported (or, for a
    `by-value:` one, unpacked from `code`) or names no function: checked in a throwaway
    verifier process (this process never imports user code), with the call's time limit for
    the import."""
    specs = [s for s in reward_cfg.fns() if s not in VERIFIERS]
    if not specs:
        return
    bad, code = [], code or {}
    with VerifierPool() as pool:
        for spec in specs:
            outcome = pool.call_fn(spec, None, reward_cfg.fn_timeout_s, code.get(spec))
            if outcome.error:
                bad.append(f"{spec}: {outcome.why}")
    if bad:
        raise ConfigError("reward.fn: " + "; ".join(bad))
