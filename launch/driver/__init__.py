"""The driver of a run: it owns the actors and walks the steps.

`trainer.py` is the step loop (launch rollouts, collect them, advantages, the learner's
update, metrics, checkpoints); `roles.py` the Ray actor classes and the order they start in;
`one_copy.py` the actor that is learner and rollout worker at once; `pool.py` the rollout
workers (fan-out, weight pushes, replacement of dead ones); `placement.py` where each actor
goes and which devices it gets; `supervise.py` restores a dead learner from its checkpoint;
`checkpointing.py` writes and restores the run's checkpoints through the learner;
`curriculum.py` decides each step's prompts (stages, replay, SENT order); `metrics.py` puts
each step's metrics on the Ray dashboard.
"""
