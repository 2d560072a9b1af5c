"""Rewards: how a completion is scored. Nothing here imports torch, Ray or transformers;
tokenizers are duck-typed.

* `verifiers/`: the built-in verifiers by name (`registry.py`: numeric, exact, choice, regex,
  python-tests), each `(completion, answer, style=None) -> RewardResult`, pure and never
  raising; `reference.py` scores against a reference answer, `text.py` the text checks,
  `python_tests.py` runs a reply's code against unit tests.
* `sandbox/`: where they run in training: a verifier process with hard per-item time limits
  and a memory cap (`pool.py`), and the isolation of a reply's code (`jail.py`, `harness.py`).
* `result.py`: `RewardResult` and its closed set of error codes.
* `parsing.py` (answer extraction, number words), `styles.py` (the answer line a prompt asks
  for), `working.py` (is the working real), `shaping.py` (the format bonus, length shaping).
* `userfns.py` and `fnbatch.py`: a user's reward functions in TRL's convention (`reward.fn`).
* `assemble.py`: a rollout's sampled tokens turned into a verified `RolloutBatch`.
* `python -m rewards.verify FILE.jsonl`: what a run would pay each completion of a file.
"""
