"""Experiments across seeds and recipes: `learning.py` (does a recipe teach arithmetic that
transfers to new phrasings?), `forgetting.py`, `cl_run.py` and `cl_metrics.py` (continual
learning: stages that interfere, and the methods against forgetting)."""
