"""Held-out evaluation (`python -m launch.evaluate`, launch/evaluate/__main__.py).

`sets.py` builds the held-out sets (arithmetic, GSM8K, a user's file); `saved_models.py` scores
saved models on them, in process or over Ray eval workers; `on_workers.py` scores a run's
policy on its own rollout workers (the demo's before/after); `scoring.py` turns completions
into accuracy, strict accuracy, format rate and pass@k.
"""
