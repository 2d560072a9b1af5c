"""Worked example: English plurals, a user's JSONL dataset and reward functions in TRL's
signature (exact match and a partial-credit reward); README.md says how to run it."""
