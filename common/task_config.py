"""The config sections about what is learnt: the task and its data (`CurriculumConfig`) and
how completions are rewarded (`RewardConfig`). Part of `common.config`, which re-exports them."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from common.validate import ConfigError, _choice, _int, _range

VERIFIERS = ("numeric", "exact", "choice", "regex", "python-tests")
"""the built-in verifiers (rewards.verifiers.registry), by name"""
FN_SPEC = re.compile(r"^([A-Za-z_][\w.]*|by-value):[A-Za-z_]\w*$")
"""a reward function named as `package.module:function`, or `by-value:name` for one that
`homerl.GRPOTrainer` packed into the run directory (rewards/byvalue.py)"""
FLOAT32_MAX = 3.4028234663852886e38
"""the largest float32: rewards and their weights are float32 (rewards.userfns.combine)"""


@dataclass
class RewardConfig:
    overlong: str = "keep"
    """completions cut at max_new_tokens: keep, mask (no loss), soft_penalty (DAPO shaping)"""
    overlong_buffer: float = 0.25
    """soft_penalty: share of max_new_tokens over which the penalty ramps from 0 to -1"""
    format_if_correct: bool = False
    """the format bonus (rollout.format_weight) counts only for a right answer"""
    format_gate_steps: int = 0
    """the format bonus counts only for a right answer while the policy version is below this"""
    format_needs_working: bool = False
    """the format bonus counts only after valid working (true arithmetic statements above the
    answer line, ending at its number, not copied from the question): a bare `Answer: N`
    guess, a restated question or a false sum earns nothing (rewards/working.py)"""
    other_tag_bonus: bool = True
    """the format bonus pays 0.25 for a tag of another answer style than the prompt asked
    for (false: only the asked style's tag pays, so a stage pulls away from earlier styles)"""
    fn: str = ""
    """reward functions in TRL's convention, comma-separated `package.module:function` or a
    built-in verifier name (`by-value:name`: a function homerl.GRPOTrainer packed into the run
    directory); the reward is then their weighted sum alone (empty: the task's verifier plus
    the format bonus)"""
    weights: str = ""
    """weights of reward.fn's functions, comma-separated finite numbers (empty: 1 each)"""
    fn_timeout_s: float = 30.0
    """seconds one reward function may take on one call's completions (then reward 0, counted)"""
    unsandboxed_code: bool = False
    """python-tests: run completions' code even where the OS cannot cut its network and
    isolate it (UNSAFE: only for code you trust; off = refuse to start there)"""

    def __post_init__(self):
        _int("reward.format_gate_steps", self.format_gate_steps, 0)
        _range("reward.fn_timeout_s", self.fn_timeout_s, 0.0, 3600.0, lo_open=True)
        fns, weights = self.fns(), self.fn_weights()
        for name in fns:
            if name not in VERIFIERS and not FN_SPEC.match(name):
                raise ConfigError(f"reward.fn: {name!r} must be package.module:function or a "
                                  f"built-in verifier ({', '.join(VERIFIERS)})")
        if self.weights.strip() and len(weights) != len(fns):
            raise ConfigError(f"reward.weights: {len(weights)} weight(s) for {len(fns)} "
                              f"reward function(s) in reward.fn; got {self.weights!r}")
        if not all(math.isfinite(w) and abs(w) <= FLOAT32_MAX for w in weights):
            raise ConfigError("reward.weights: must be finite numbers, within +-3.4e38 (a "
                              f"float32); got {self.weights!r}")
        _choice("reward.overlong", self.overlong, ("keep", "mask", "soft_penalty"))
        _range("reward.overlong_buffer", self.overlong_buffer, 0.0, 1.0, lo_open=True)

    def fns(self) -> list[str]:
        """reward.fn as a list of `module:function` specs and built-in verifier names."""
        return [f.strip() for f in self.fn.split(",") if f.strip()]

    def fn_weights(self) -> list[float]:
        """One weight per reward function (1 each when reward.weights is empty)."""
        if not self.weights.strip():
            return [1.0] * len(self.fns())
        try:
            return [float(w) for w in self.weights.split(",")]
        except ValueError:
            raise ConfigError(f"reward.weights: must be comma-separated numbers; got "
                              f"{self.weights!r}") from None


@dataclass
class CurriculumConfig:
    task: str = "arith"
    """training task: arith (procedural arithmetic), gsm8k, or file (your own dataset)"""
    level: int = 1
    """arithmetic difficulty: 1 single-digit +/-, 2 multi-digit +,-,*, 3 two-step word problems"""
    data_path: str = ""
    """gsm8k: a GSM8K JSONL (empty: the hub, where reachable); file: a JSONL, CSV or Parquet
    file, or a folder written by datasets' save_to_disk"""
    prompt_field: str = "auto"
    """file: the column holding the prompt, text or a chat `messages` list (auto: messages,
    prompt, question or problem, the first present)"""
    answer_field: str = "answer"
    """file: the column holding the reference the verifier checks (empty: none, for reward
    functions that need none)"""
    verifier: str = "numeric"
    """file: how answers are checked: numeric, exact, choice (a letter A-E), regex (the
    answer is a pattern), python-tests (the answer holds unit tests for the reply's code)"""
    system_prompt: str = ""
    """file: a system message put before every prompt (empty: the chat template's default)"""
    instruction: str = ""
    """file: text added after every prompt (empty: the verifier's answer-line instruction)"""
    heldout_path: str = ""
    """file: a second file of held-out prompts (empty: split them off data_path)"""
    heldout_size: int = 100
    """file: prompts split off data_path for evaluation, disjoint by prompt text"""
    heldout_seed: int = 0
    """file: the seed of that split"""
    prompt_as_is: bool = False
    """file: each prompt as the dataset holds it (TRL's convention): text is the model's input
    as it stands, chat messages go through the chat template; no instruction or system
    message added"""
    stages: str = ""
    """stage list task:level[:steps][@promote], comma-separated (empty: one stage of task/level)"""
    sent: bool = False
    """order each stage's training prompts easy -> hard by semantic entropy (SENT)"""
    sent_samples: int = 8
    """SENT: completions M sampled per prompt (temperature 1) to estimate its answer entropy"""
    sent_pool: int = 64
    """SENT: training prompts per stage that are scored and ordered (then cycled)"""
    replay: float = 0.25
    """on-policy replay: expected fraction of each step's prompts drawn from earlier stages'
    training prompts (generated fresh by the current policy); 0 = off; acts from stage 2 on"""

    def __post_init__(self):
        _choice("curriculum.task", self.task, ("arith", "gsm8k", "file"))
        _choice("curriculum.verifier", self.verifier, VERIFIERS)
        _int("curriculum.heldout_size", self.heldout_size, 0)
        _int("curriculum.heldout_seed", self.heldout_seed, 0, 2**31 - 1)
        if self.task == "file" and not self.data_path:
            raise ConfigError("curriculum.data_path: task file needs a dataset (JSONL, CSV, "
                              "Parquet, or a save_to_disk folder); got ''")
        _range("curriculum.replay", self.replay, 0.0, 1.0, hi_open=True)
        _choice("curriculum.level", self.level, (1, 2, 3))
        _int("curriculum.sent_samples", self.sent_samples, 2, 256)
        _int("curriculum.sent_pool", self.sent_pool, 1, 100_000)
