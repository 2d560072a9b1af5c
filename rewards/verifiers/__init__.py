"""The built-in verifiers, by name in `registry.py`: `reference.py` (numeric: the answer
line's number against the reference), `text.py` (exact, choice, regex) and `python_tests.py`
(a reply's code run against the task's unit tests, isolated by rewards/sandbox/jail.py)."""
