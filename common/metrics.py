"""Every metric name a run writes, defined once.

Rows of `RUN_DIR/metrics.jsonl`, wandb and the Ray dashboard use these keys; writers build rows
from the typed step results (`common.types`) and readers (progress bar, plots, dashboard gauges,
benchmarks) import the names from here, so a misspelt key is an import error, not a silent gap.
"""

STEP = "step"

# rollout (driver, from the workers' RolloutSummary)
REWARD_MEAN = "reward/mean"
REWARD_CORRECT = "reward/correct"
REWARD_FORMAT = "reward/format"
REWARD_ERRORS = "reward/errors"
REWARD_ERROR_PREFIX = "reward/error_"
"""+ verifier error code: how many completions got that code"""
REWARD_OVERLONG = "reward/overlong_penalty"
ROLLOUT_LEN = "rollout/len_mean"
ROLLOUT_STOP_FRAC = "rollout/stop_frac"
ROLLOUT_TRUNCATED = "rollout/truncated"
ROLLOUT_TOKENS = "rollout/tokens"
ROLLOUT_TOKENS_PER_S = "rollout/tokens_per_s"
ROLLOUT_VERSION = "rollout/version"
ROLLOUT_SKIPPED = "rollout/skipped_prompts"
ADV_ZERO_STD = "adv/zero_std_frac"

# learner (LearnerStep)
LOSS_POLICY = "loss/policy"
LOSS_KL = "loss/kl"
LOSS_EWC = "loss/ewc"
CLIP_FRAC = "policy/clip_frac"
CLIP_FRAC_LOW = "policy/clip_frac_low"
CLIP_FRAC_HIGH = "policy/clip_frac_high"
DUAL_CLIP_FRAC = "policy/dual_clip_frac"
RATIO_MEAN = "policy/ratio_mean"
APPROX_KL = "policy/approx_kl"
LOGP_DIFF = "policy/logp_diff"
LOGP_DIFF_MAX = "policy/logp_diff_max"
ENTROPY = "policy/entropy"
STALENESS = "policy/staleness"
GRAD_NORM = "grad/norm"
TOKENS_SELECTED = "tokens/selected"
TOKENS_COMPLETION = "tokens/completion"
ACTIVE_SEQS = "tokens/active_seqs"
LEARNER_COMPUTE_S = "time/learner_compute_s"
WEIGHTS_VERSION = "weights/version"
EWC_FISHER_SUM = "ewc/fisher_sum"
CONSOLIDATE_S = "time/consolidate_s"

# driver
CURRICULUM_STAGE = "curriculum/stage"
STEP_S = "time/step_s"
ROLLOUT_S = "time/rollout_s"
ROLLOUT_WAIT_S = "time/rollout_wait_s"
LEARNER_S = "time/learner_s"
SYNC_S = "time/sync_s"
CHECKPOINT_S = "time/checkpoint_s"
RESTARTS = "faults/worker_restarts"
CHECKPOINT_FAILURES = "faults/checkpoint_failures"
"""checkpoints that could not be written (run.checkpoint_fail_policy=continue)"""
LEARNER_RESTARTS = "faults/learner_restarts"
"""learner deaths survived so far (each restored from the last checkpoint)"""
# memory (common.memory): RSS counts shared pages (libtorch, mapped files) once per process,
# PSS splits them among sharers, so PSS sums to what the machine spends; peak is the summed
# per-process high-water RSS (VmHWM). Roles: driver, learner, workers (each with its children:
# the verifier process, vLLM's engine core), verifier (its part of workers).
RSS_GB = "memory/rss_gb"
"""driver + learner + rollout workers (and their children), current RSS"""
PSS_GB = "memory/pss_gb"
"""driver + learner + rollout workers (and their children), current PSS: the run's footprint"""
PEAK_GB = "memory/peak_gb"
"""sum of every run process's high-water RSS so far (an upper bound of the peak total)"""
PEAK_PSS_GB = "memory/peak_pss_gb"
"""sum over the run's processes of PSS + (high-water RSS - RSS): the estimated peak footprint,
what the RAM plan predicts and the README's memory table reports"""
DRIVER_RSS_GB = "memory/driver_rss_gb"
DRIVER_PSS_GB = "memory/driver_pss_gb"
DRIVER_PEAK_GB = "memory/driver_peak_gb"
LEARNER_RSS_GB = "memory/learner_rss_gb"
LEARNER_PSS_GB = "memory/learner_pss_gb"
LEARNER_PEAK_GB = "memory/learner_peak_gb"
WORKERS_RSS_GB = "memory/workers_rss_gb"
WORKERS_PSS_GB = "memory/workers_pss_gb"
WORKERS_PEAK_GB = "memory/workers_peak_gb"
VERIFIER_RSS_GB = "memory/verifier_rss_gb"
"""the workers' verifier processes (included in workers_*)"""
VERIFIER_PSS_GB = "memory/verifier_pss_gb"
WORKER_MEMORY_PREFIX = "memory/worker/"
"""+ worker name + _rss_gb / _pss_gb / _peak_gb: one rollout worker (with its children)"""
RAY_MEMORY_PREFIX = "memory/ray/"
"""+ daemon + _rss_gb / _pss_gb, and memory/ray/total_pss_gb: Ray's own processes, first row
of a run only (outside the run's totals)"""
