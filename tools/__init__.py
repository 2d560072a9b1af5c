"""Tools run from a checkout (`python -m tools...`), not installed with the package.

* `compare/`: against peers: `make bench` (throughput and memory against TRL's GRPOTrainer),
  `make bench-tta` (time to a target accuracy), the rollout-only comparison.
* `card_check/`: the gpu-8gb step measured on a GPU box (`python -m tools.card_check`).
* `measure/`: our own parts: decode against the roofline, the learner's step, per-core
  throughput and the cost model, memory against the RAM plan, parsers' worst cases,
  real-shaped random models.
* `ops/`: operations: `make soak`, `make faults`, the torch installer `make` runs.
* `experiments/`: learning and forgetting across seeds and recipes.
"""
