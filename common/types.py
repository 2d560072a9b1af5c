"""The objects that cross actor boundaries, defined once: small frozen dataclasses.

    driver --RolloutCall--> rollout worker --RolloutBatch (object store)--> learner
                            rollout worker --RolloutSummary--> driver --TrainPlan--> learner
    learner --WeightUpdate (object store)--> every rollout worker
    learner --LearnerStep--> driver

N = prompts x group_size completions, ordered prompt-major (prompt 0's G completions first).
Arrays are numpy so Ray moves them without copies; ragged rows are lists of arrays or ints.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields

import numpy as np

from common import metrics as M
from common.memory import Footprint

SAMPLE_ROWS = 4
"""completions per rollout whose text the driver gets (samples.jsonl)"""


@dataclass(frozen=True)
class Sampling:
    """Per-call settings of one generate call; None takes the `rollout.*` value."""

    seed: int = 0
    """sampling seed of the call (row r of a call uses seed + r)"""
    temperature: float | None = None
    """0 means greedy"""
    max_new_tokens: int | None = None


@dataclass(frozen=True)
class RolloutCall:
    """One worker's share of one step: G completions for each prompt."""

    prompts: list[dict]
    """{'question', 'answer', ...} per prompt"""
    group_size: int
    sampling: Sampling = Sampling()


@dataclass(frozen=True)
class RolloutBatch:
    """What a rollout worker generated for one RolloutCall, verified. Stays in the object store:
    the learner reads it, the driver gets its `summary()`."""

    prompt_ids: list[list[int]]
    """(N, P_i) prompt token ids of each completion's prompt"""
    completion_ids: list[list[int]]
    """(N, T_i) sampled token ids, ending with EOS when finish_reason is 'stop'"""
    logprobs: list[np.ndarray]
    """(N, T_i) behaviour log-probs of the sampled tokens (at the sampling temperature)"""
    entropy: list[np.ndarray]
    """(N, T_i) entropy of the sampling distribution at each generated position"""
    finish_reasons: list[str]
    """(N,) 'stop' (EOS) or 'length' (hit max_new_tokens)"""
    texts: list[str]
    """(N,) decoded completions"""
    prompt_index: list[int]
    """(N,) index of the prompt (in the call's prompt list) each completion answers"""
    correct: np.ndarray
    """(N,) verified correctness score in [0, 1]"""
    format_score: np.ndarray
    """(N,) format score in [0, 1]"""
    rewards: np.ndarray
    """(N,) correct + format_weight * format_score; with reward.fn the functions' weighted
    sum, NaN where none of them applied (unscorable)"""
    reward_errors: list[str | None]
    """(N,) verifier error code, None when the completion parsed"""
    version: int
    """policy version that generated every completion here"""
    num_prompts: int
    """prompts this call was given (skipped ones included)"""
    gen_time_s: float = 0.0
    """wall time of generation + verification on the worker"""
    score_s: float = 0.0
    """the part of gen_time_s spent verifying and rewarding the completions"""
    lent_share: float = 0.0
    """share of the call's decode steps run on the learner's idle cores too (core_lease)"""
    load_s: float = 0.0
    """the worker's weight load since its last call (the one this call samples from), seconds:
    on its critical path between two calls; 0 when none was loaded"""
    worker: str = ""
    """name of the worker that produced it"""
    answers: list[str | None] = field(default_factory=list)
    """(N,) the verifier's normalised final answer of each completion (None: none found)"""
    memory: Footprint = Footprint()
    """the producing worker's memory, its children (verifier, engine core) included"""
    verifier_memory: Footprint = Footprint()
    """its verifier process's part of `memory`"""
    skipped: list[dict] = field(default_factory=list)
    """prompts refused before generation (e.g. longer than max_prompt_tokens), with reason"""
    fn_scores: dict[str, list[float | None]] = field(default_factory=dict)
    """reward.fn: {function name: (N,) its rewards}, None where it did not apply"""
    fn_errors: dict[str, int] = field(default_factory=dict)
    """reward.fn: {error code: completions that got it}, summed over the functions"""
    fn_logged: dict[str, list[float]] = field(default_factory=dict)
    """reward.fn: the values the functions gave log_metric, by name"""
    working_valid: list[float] = field(default_factory=list)
    """(N,) 1.0 where the working above the answer line is true arithmetic ending at the
    answer (rewards.working), 0.0 where not, NaN for a non-numeric answer"""

    @property
    def num_tokens(self) -> int:
        return int(sum(len(c) for c in self.completion_ids))

    def summary(self) -> RolloutSummary:
        """The few numbers the driver needs (no token ids, no log-probs)."""
        return RolloutSummary(
            rewards=np.asarray(self.rewards), correct=np.asarray(self.correct),
            format_score=np.asarray(self.format_score),
            lengths=np.array([len(c) for c in self.completion_ids], dtype=np.int64),
            finish_reasons=list(self.finish_reasons), prompt_index=list(self.prompt_index),
            reward_errors=list(self.reward_errors), answers=list(self.answers),
            sample_texts=list(self.texts[:SAMPLE_ROWS]), version=self.version,
            num_prompts=self.num_prompts, gen_time_s=self.gen_time_s, score_s=self.score_s,
            worker=self.worker,
            lent_share=self.lent_share, load_s=self.load_s, memory={self.worker: self.memory},
            verifier_memory={self.worker: self.verifier_memory}, skipped=list(self.skipped),
            fn_scores=dict(self.fn_scores), fn_errors=dict(self.fn_errors),
            fn_logged=dict(self.fn_logged), working_valid=list(self.working_valid))


@dataclass(frozen=True)
class RolloutSummary:
    """A RolloutBatch without its tokens: what the driver holds (rewards, lengths, counts)."""

    rewards: np.ndarray
    """(N,) rewards (NaN: unscorable, reward.fn)"""
    correct: np.ndarray
    """(N,) verified correctness"""
    format_score: np.ndarray
    """(N,) format scores"""
    lengths: np.ndarray
    """(N,) completion lengths in tokens"""
    finish_reasons: list[str]
    """(N,) 'stop' or 'length'"""
    prompt_index: list[int]
    """(N,) index of each completion's prompt (offset across shares by `concat`)"""
    reward_errors: list[str | None]
    """(N,) verifier error codes"""
    answers: list[str | None]
    """(N,) parsed final answers (SENT clusters them)"""
    sample_texts: list[str]
    """the first SAMPLE_ROWS completions' texts of each share"""
    version: int
    """weights version that generated them (the oldest, after concat)"""
    num_prompts: int
    """prompts given, skipped ones included"""
    gen_time_s: float = 0.0
    """worker wall time (the slowest share, after concat)"""
    score_s: float = 0.0
    """its verification and reward part (the slowest share's, after concat)"""
    lent_share: float = 0.0
    """share of decode steps run on the learner's idle cores too (the shares' mean)"""
    load_s: float = 0.0
    """weight load before the call (the slowest share's, after concat)"""
    worker: str = ""
    """worker name(s)"""
    memory: dict[str, Footprint] = field(default_factory=dict)
    """{worker name: its memory} (children included)"""
    verifier_memory: dict[str, Footprint] = field(default_factory=dict)
    """{worker name: its verifier process's memory}"""
    skipped: list[dict] = field(default_factory=list)
    """refused prompts with reasons"""
    sample_index: list[int] = field(default_factory=list)
    """rows of `sample_texts` (filled by concat; empty: rows 0, 1, ...)"""
    fn_scores: dict[str, list[float | None]] = field(default_factory=dict)
    """reward.fn: {function name: (N,) its rewards} (RolloutBatch)"""
    fn_errors: dict[str, int] = field(default_factory=dict)
    """reward.fn: {error code: completions that got it}"""
    fn_logged: dict[str, list[float]] = field(default_factory=dict)
    """reward.fn: log_metric values by name"""
    working_valid: list[float] = field(default_factory=list)
    """(N,) valid working (1.0 / 0.0; NaN: not a numeric answer), RolloutBatch"""

    @property
    def num_tokens(self) -> int:
        return int(np.sum(self.lengths))

    @staticmethod
    def concat(parts: list[RolloutSummary]) -> RolloutSummary:
        """Join worker shares in order; prompt indices are offset to stay unique."""
        index, samples, rows, offset, row0 = [], [], [], 0, 0
        for p in parts:
            index += [i + offset for i in p.prompt_index]
            samples += p.sample_texts
            rows += [row0 + j for j in (p.sample_index or range(len(p.sample_texts)))]
            offset, row0 = offset + p.num_prompts, row0 + len(p.lengths)

        def cat(name):
            arrays = [getattr(p, name) for p in parts]
            return np.concatenate(arrays) if arrays else np.zeros(0)

        def join(name):
            return [x for p in parts for x in getattr(p, name)]

        return RolloutSummary(
            rewards=cat("rewards"), correct=cat("correct"), format_score=cat("format_score"),
            lengths=cat("lengths").astype(np.int64), finish_reasons=join("finish_reasons"),
            prompt_index=index, reward_errors=join("reward_errors"), answers=join("answers"),
            sample_texts=samples, sample_index=rows, version=min(p.version for p in parts),
            num_prompts=offset, gen_time_s=max(p.gen_time_s for p in parts),
            score_s=max(p.score_s for p in parts),
            lent_share=float(np.mean([p.lent_share for p in parts])),
            load_s=max((p.load_s for p in parts), default=0.0),
            worker=",".join(p.worker for p in parts),
            memory={k: v for p in parts for k, v in p.memory.items()},
            verifier_memory={k: v for p in parts for k, v in p.verifier_memory.items()},
            skipped=join("skipped"), fn_scores=_join_fn_scores(parts),
            fn_errors=dict(sum((Counter(p.fn_errors) for p in parts), Counter())),
            fn_logged={k: [v for p in parts for v in p.fn_logged.get(k, [])]
                       for k in dict.fromkeys(k for p in parts for k in p.fn_logged)},
            working_valid=join("working_valid"))

    def metrics(self) -> dict:
        """The step's rollout metrics (common.metrics names)."""
        errors = Counter(e for e in self.reward_errors if e) + Counter(self.fn_errors)
        n = max(len(self.lengths), 1)
        scored = np.asarray(self.rewards)[~np.isnan(self.rewards)]  # reward.fn: NaN unscorable
        out = {
            M.REWARD_MEAN: float(np.mean(scored, dtype=np.float64)) if len(scored) else 0.0,
            M.REWARD_CORRECT: float(np.mean(self.correct)) if len(self.correct) else 0.0,
            M.REWARD_FORMAT: float(np.mean(self.format_score)) if len(self.rewards) else 0.0,
            M.REWARD_STRICT: (float(np.mean(np.asarray(self.correct) * (np.asarray(
                self.format_score) == 1.0))) if len(self.correct) else 0.0),
            M.ROLLOUT_LEN: float(np.mean(self.lengths)) if len(self.lengths) else 0.0,
            M.ROLLOUT_STOP_FRAC: sum(r == "stop" for r in self.finish_reasons) / n,
            M.ROLLOUT_TRUNCATED: sum(r == "length" for r in self.finish_reasons),
            M.ROLLOUT_TOKENS: self.num_tokens,
            M.ROLLOUT_COMPLETIONS: len(self.lengths),
            M.ROLLOUT_TOKENS_PER_S: self.num_tokens / max(self.gen_time_s, 1e-9),
            M.ROLLOUT_LENT_SHARE: self.lent_share,
            M.WEIGHT_LOAD_S: self.load_s,
            M.SCORE_S: self.score_s,
            M.ROLLOUT_VERSION: self.version,
            M.ROLLOUT_SKIPPED: len(self.skipped),
            M.REWARD_ERRORS: sum(errors.values()),
        }
        valid = np.asarray(self.working_valid, dtype=np.float64)
        if len(valid) and not np.isnan(valid).all():
            out[M.REWARD_WORKING_VALID] = float(np.nanmean(valid))
        for code in sorted(errors):
            out[f"{M.REWARD_ERROR_PREFIX}{code}"] = errors[code]
        return out | self._fn_metrics()

    def _fn_metrics(self) -> dict:
        """reward.fn: each function's mean where it applied, the log_metric means, and how
        many completions were unscorable; {} without reward functions."""
        out = {}
        for name, values in self.fn_scores.items():
            applied = [v for v in values if v is not None]
            if applied:
                out[f"{M.REWARD_FN_PREFIX}{name}"] = float(np.mean(applied))
        for name, values in self.fn_logged.items():
            if values:
                out[f"{M.REWARD_LOGGED_PREFIX}{name}"] = float(np.mean(values))
        if self.fn_scores:
            out[M.REWARD_UNSCORABLE] = int(np.isnan(self.rewards).sum())
        return out


def _join_fn_scores(parts: list[RolloutSummary]) -> dict[str, list[float | None]]:
    """The shares' per-function rewards joined in order (None for a share without one)."""
    names = dict.fromkeys(k for p in parts for k in p.fn_scores)
    return {k: [v for p in parts for v in p.fn_scores.get(k, [None] * len(p.lengths))]
            for k in names}


@dataclass(frozen=True)
class TrainPlan:
    """The driver's part of a step: what it decided from the summaries."""

    advantages: np.ndarray
    """(N,) group-normalised advantages, in the order of the step's batches"""
    keep: np.ndarray | None = None
    """(N,) bool: sequences that count in the loss (None: all)"""
    version: int = -1
    """weights version the rollout sampled with (-1: unknown)"""


@dataclass(frozen=True)
class TrainBatch:
    """N sequences of one step (B prompts x G completions), as the learner trains on them."""

    prompt_ids: list[list[int]]
    """(N, P_i) prompt token ids, no padding"""
    completion_ids: list[list[int]]
    """(N, T_i) sampled completion token ids, no padding"""
    old_logp: list[np.ndarray]
    """(N, T_i) behaviour log-probs the rollout sampled with"""
    entropy: list[np.ndarray]
    """(N, T_i) per-token entropy of the rollout's sampling distribution"""
    advantages: np.ndarray
    """(N,) group-normalised advantages"""
    keep: np.ndarray | None = None
    """(N,) bool: sequences that count in the loss (None: all; reward.overlong=mask drops
    completions cut at max_new_tokens)"""
    version: int = -1
    """weights version the rollout sampled with (-1: unknown); staleness = learner's - this"""

    @staticmethod
    def from_rollouts(plan: TrainPlan, batches: list[RolloutBatch]) -> TrainBatch:
        """The learner's batch: the workers' shares joined in order, with the driver's plan."""
        def join(name):
            return [x for b in batches for x in getattr(b, name)]

        n = sum(len(b.completion_ids) for b in batches)
        if n != len(plan.advantages):
            raise ValueError(f"TrainPlan has {len(plan.advantages)} advantages for {n} "
                             "sequences")
        return TrainBatch(join("prompt_ids"), join("completion_ids"), join("logprobs"),
                          join("entropy"), np.asarray(plan.advantages), plan.keep, plan.version)


@dataclass(frozen=True)
class WeightUpdate:
    """The learner's weights for one version, put once in the object store for every worker.

    lora: adapter tensors keyed by plain module name + '.lora_A' (r, in) / '.lora_B' (out, r);
    a worker applies W = W0 + scale * B @ A. full: every state-dict tensor, tied tensors once
    (`aliases`: tied name -> the name it shares storage with).
    """

    kind: str
    """'lora', 'full', or 'live' (one-copy mode: the sampler holds the learner's weights
    themselves, so the update carries the version and no tensors)"""
    version: int
    tensors: dict[str, np.ndarray]
    scale: float = 1.0
    """LoRA alpha / r"""
    aliases: dict[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return int(sum(np.asarray(v).nbytes for v in self.tensors.values()))


def _metric(key: str):
    return field(default=0.0, metadata={"key": key})


@dataclass(frozen=True)
class LearnerStep:
    """What `Learner.train_step` returns: the step's learner metrics, typed."""

    loss_policy: float = _metric(M.LOSS_POLICY)
    loss_kl: float = _metric(M.LOSS_KL)
    loss_ewc: float = _metric(M.LOSS_EWC)
    loss_anchor_kl: float = _metric(M.LOSS_ANCHOR_KL)
    clip_frac: float = _metric(M.CLIP_FRAC)
    clip_frac_low: float = _metric(M.CLIP_FRAC_LOW)
    clip_frac_high: float = _metric(M.CLIP_FRAC_HIGH)
    dual_clip_frac: float = _metric(M.DUAL_CLIP_FRAC)
    ratio_mean: float = _metric(M.RATIO_MEAN)
    approx_kl: float = _metric(M.APPROX_KL)
    logp_diff: float = _metric(M.LOGP_DIFF)
    logp_diff_max: float = _metric(M.LOGP_DIFF_MAX)
    entropy: float = _metric(M.ENTROPY)
    staleness: int = _metric(M.STALENESS)
    grad_norm: float = _metric(M.GRAD_NORM)
    skipped_nonfinite: int = _metric(M.LEARNER_SKIPPED_NONFINITE)
    """updates skipped so far (this one included) because loss or grad norm was not finite"""
    tokens_selected: int = _metric(M.TOKENS_SELECTED)
    tokens_completion: int = _metric(M.TOKENS_COMPLETION)
    active_seqs: int = _metric(M.ACTIVE_SEQS)
    compute_s: float = _metric(M.LEARNER_COMPUTE_S)
    version: int = _metric(M.WEIGHTS_VERSION)
    """weights version after the step"""
    rss_gb: float = _metric(M.LEARNER_RSS_GB)
    pss_gb: float = _metric(M.LEARNER_PSS_GB)
    peak_gb: float = _metric(M.LEARNER_PEAK_GB)

    def row(self) -> dict:
        """{metric name: value} for metrics.jsonl."""
        return {f.metadata["key"]: getattr(self, f.name) for f in fields(self)}
