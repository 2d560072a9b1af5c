"""Per-step metrics on the Ray dashboard (Metrics tab) and its Prometheus endpoint.

The driver already builds one metrics row per step for metrics.jsonl; `record(row)` mirrors
thirteen of its keys into `ray.util.metrics`, tagged with the run name, so a cluster's
Grafana/Prometheus shows training next to Ray's own node and actor metrics:

    homerl_reward_mean          gauge    reward/mean
    homerl_step_seconds         gauge    time/step_s
    homerl_rollout_tokens_per_s gauge    rollout/tokens_per_s
    homerl_weights_version      gauge    weights/version
    homerl_policy_logp_diff     gauge    policy/logp_diff (and _max: policy/logp_diff_max)
    homerl_policy_staleness     gauge    policy/staleness
    homerl_policy_ratio_mean    gauge    policy/ratio_mean
    homerl_policy_clip_frac     gauge    policy/clip_frac
    homerl_memory_pss_gb        gauge    memory/pss_gb (and _peak_: memory/peak_pss_gb)
    homerl_learner_restarts     gauge    faults/learner_restarts
    homerl_worker_restarts      counter  faults/worker_restarts (exported as ..._total)

Ray 2.60 exports them with a `ray_` prefix (`ray_homerl_reward_mean{run="..."}`).
Requires `ray.init` first (the metrics go through the local node's metrics agent).
"""

from __future__ import annotations

from ray.util.metrics import Counter, Gauge

from common import metrics as M

GAUGES = {
    M.REWARD_MEAN: ("homerl_reward_mean", "mean reward of the step's completions"),
    M.STEP_S: ("homerl_step_seconds", "wall time of the training step (s)"),
    M.ROLLOUT_TOKENS_PER_S: ("homerl_rollout_tokens_per_s", "rollout generation tokens/s"),
    M.WEIGHTS_VERSION: ("homerl_weights_version", "policy weights version after the step"),
    M.LOGP_DIFF: ("homerl_policy_logp_diff",
                  "mean |learner - behaviour log-prob| of the trained tokens"),
    M.LOGP_DIFF_MAX: ("homerl_policy_logp_diff_max",
                      "largest |learner - behaviour log-prob| of the step"),
    M.STALENESS: ("homerl_policy_staleness", "learner version - rollout version"),
    M.RATIO_MEAN: ("homerl_policy_ratio_mean", "mean importance ratio of trained tokens"),
    M.CLIP_FRAC: ("homerl_policy_clip_frac", "share of trained tokens clipped"),
    M.PSS_GB: ("homerl_memory_pss_gb", "PSS of driver + learner + workers (GiB)"),
    M.PEAK_PSS_GB: ("homerl_memory_peak_pss_gb", "estimated peak PSS of the run (GiB)"),
    M.LEARNER_RESTARTS: ("homerl_learner_restarts", "learner deaths survived so far"),
}
"""row key -> (metric name, description) of each gauge"""


class DashboardMetrics:
    """Mirrors the driver's per-step row into Ray metrics tagged `run=<run name>`."""

    def __init__(self, run: str):
        tags = {"run": run}
        self.gauges = {key: Gauge(name, desc, tag_keys=("run",)).set_default_tags(tags)
                       for key, (name, desc) in GAUGES.items()}
        self.restarts = Counter("homerl_worker_restarts", "rollout workers replaced",
                                tag_keys=("run",)).set_default_tags(tags)
        self._restarts_seen = 0

    def record(self, row: dict) -> None:
        """Set the gauges from a step row; missing keys are skipped (not every row has all)."""
        for key, gauge in self.gauges.items():
            if row.get(key) is not None:
                gauge.set(float(row[key]))  # float(): Gauge refuses numpy integer types
        # The row holds the run's cumulative count; a Prometheus counter takes increments.
        total = int(row.get(M.RESTARTS, self._restarts_seen))
        if total > self._restarts_seen:
            self.restarts.inc(total - self._restarts_seen)
            self._restarts_seen = total
