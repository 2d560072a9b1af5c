"""The learner: one GRPO update per step on the rollouts it is handed.

`learner.py` is the learner (the Ray actor's class): its step, EWC consolidation, weight
export and checkpoints; `model.py` its one adapter to transformers and peft (policy building,
the selected-position and shared-prefix forwards); `losses.py`, `advantages.py` and `ewc.py`
the math, pure and tested on hand-built tensors; `export.py` the weights it hands the rollout
workers and the final checkpoint."""
