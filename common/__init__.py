"""Foundation layer: code that rollout workers, the learner and the launcher all need.

Imports nothing from `actors`, `learner` or `launch` (layers import one way).
"""
